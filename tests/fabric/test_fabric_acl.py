"""A tenant worker confined by Valkey ACL uses the fabric path on its own keys and cannot
touch another tenant's keys through the module's commands: the commands carry an ACL
category (Valkey 9.1) and declare their key argument, so key patterns confine them."""

from __future__ import annotations

import os
import shutil

import pytest
import valkey

from lmcache_valkey import acl
from lmcache_valkey.errors import ServerError
from lmcache_valkey.transport.fabric import FabricTransport, commands, dma

MiB = 1 << 20

# A tenant worker's recommended ACL line (lmcache_valkey/acl.py) with the fabric addition:
# the commands by name (every server), or the module's category (Valkey 9.1).
BY_NAME = " ".join(f"+{c}" for c in acl.worker_commands(fabric=True))
BY_CATEGORY = " ".join(f"+{c}" for c in acl.worker_commands()) + f" +@{commands.ACL_CATEGORY} +pexpire"

SERVERS = {
    "valkey-9.1.2": (None, BY_CATEGORY),
    "valkey-8.0": ("/usr/bin/valkey-server", BY_NAME),
    "redis-7.0": ("/usr/bin/redis-server", BY_NAME),
}


def _tenant(c: valkey.Valkey, name: str, rules: str) -> None:
    c.execute_command("ACL", "SETUSER", name, "reset", "on", f">{name}-pw", *rules.split())


@pytest.mark.parametrize("server", list(SERVERS))
async def test_a_confined_tenant_uses_the_fabric_path_on_its_own_keys_only(start_server, server):
    binary, rules = SERVERS[server]
    if binary is not None and not shutil.which(binary):
        pytest.skip(f"{binary} not installed (scripts/setup.sh installs it)")
    srv = start_server("tcp;ofi_rxm", binary=binary)
    admin = srv.client()
    _tenant(admin, "tenant-a", f"resetchannels ~lmcv:tenant-a:* -@all {rules}")
    value = os.urandom(2 * MiB)
    admin.execute_command(commands.TCP_SET, "lmcv:tenant-b:k", b"b's chunk")

    async with FabricTransport("127.0.0.1", srv.port, username="tenant-a", password="tenant-a-pw",
                               bulk_fallback=False) as t:
        arena = bytearray(4 * MiB)
        t.register_buffer(arena)
        mv = memoryview(arena)
        mv[: len(value)] = value
        # Its own keys: RMA SET and GET, INFO, DEL, EXISTS.
        await t.set_from(b"lmcv:tenant-a:k", [mv[: len(value)]], 60.0, 10)
        assert await t.get_into(b"lmcv:tenant-a:k", [mv[2 * MiB :]], 10) == len(value)
        assert mv[2 * MiB :] == value
        assert (await t.info(b"lmcv:tenant-a:k"))[0] == len(value)
        assert await t.exists_many([b"lmcv:tenant-a:k"], timeout=5) == [True]
        # Another tenant's key, through every BLOB.* command: NOPERM, nothing moved.
        mv[2 * MiB :] = bytes(2 * MiB)
        for attempt in (
            t.get_into(b"lmcv:tenant-b:k", [mv[2 * MiB :]], 5),
            t.set_from(b"lmcv:tenant-b:k", [mv[:MiB]], None, 5),
            t.info(b"lmcv:tenant-b:k"),
            t.command(commands.TCP_GET, b"lmcv:tenant-b:k"),
            t.command(commands.TCP_SET, b"lmcv:tenant-b:k", b"overwritten"),
        ):
            with pytest.raises(ServerError, match="NOPERM"):
                await attempt
        assert mv[2 * MiB :] == bytes(2 * MiB)
        assert await t.delete([b"lmcv:tenant-a:k"]) == 1

    assert admin.execute_command(commands.TCP_GET, "lmcv:tenant-b:k") == b"b's chunk"


def test_key_specs_let_read_only_patterns_confine_the_module_commands(start_server):
    srv = start_server("none")
    admin = srv.client()
    _tenant(admin, "reader", f"%R~shared:* ~lmcv:reader:* -@all {BY_CATEGORY}")
    admin.execute_command(commands.TCP_SET, "shared:k", b"published")
    c = valkey.Valkey(port=srv.port, username="reader", password="reader-pw")
    assert c.execute_command(commands.TCP_GET, "shared:k") == b"published"
    assert c.execute_command(commands.INFO, "shared:k")
    with pytest.raises(valkey.exceptions.NoPermissionError):
        c.execute_command(commands.TCP_SET, "shared:k", b"defaced")
    c.execute_command(commands.TCP_SET, "lmcv:reader:k", b"mine")


def test_every_command_is_in_the_category_and_hello_has_no_key(start_server):
    srv = start_server("none")
    admin = srv.client()
    listed = {c.decode().upper() for c in admin.execute_command("ACL", "CAT", commands.ACL_CATEGORY)}
    assert listed == {c.upper() for c in (*commands.ALL, *commands.LEGACY, *dma.ALL)}
    info = {name.upper(): v for name, v in admin.execute_command("COMMAND", "INFO", *commands.ALL, *dma.ALL).items()}
    assert info[commands.HELLO]["first_key_pos"] == 0 and not info[commands.HELLO]["key_specifications"]
    access = {commands.RDMA_GET: [b"RO", b"access"], commands.TCP_GET: [b"RO", b"access"], commands.INFO: [b"RO"],
              commands.RDMA_SET: [b"OW", b"update"], commands.TCP_SET: [b"OW", b"update"]}
    for name, flags in access.items():
        assert info[name]["first_key_pos"] == 1
        assert info[name]["key_specifications"][0][1] == flags, name
    # Momento's commands name their key fifth (after the address, rkey, remote address, length).
    for name, flags in {dma.GET: [b"RO", b"access"], dma.SET: [b"OW", b"update"]}.items():
        assert info[name]["first_key_pos"] == 5 and info[name]["last_key_pos"] == 5
        assert info[name]["key_specifications"][0][1] == flags, name
    for name in (dma.HELLO, dma.INFO, dma.PROVE):
        assert info[name]["first_key_pos"] == 0 and not info[name]["key_specifications"], name
