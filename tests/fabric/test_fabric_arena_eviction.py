"""The module's arena is a cache, as the keyspace is under an allkeys maxmemory policy: a value
that does not fit evicts others, least recently used first. maxmemory cannot see the arena
(it is mmap'ed), so without this, values stored without expiry filled it for good, and one
tenant that filled it refused every other tenant's writes and fabric address proofs."""

from __future__ import annotations

import os

import pytest
import valkey

from lmcache_valkey import acl
from lmcache_valkey.transport.fabric import FabricTransport, commands

MiB = 1 << 20
LINE = " ".join(f"+{c}" for c in acl.worker_commands(fabric=True))


def _worker(srv, tenant: str) -> valkey.Valkey:
    srv.client().execute_command("ACL", "SETUSER", tenant, "reset", "on", f">{tenant}-pw", "resetchannels",
                                 f"~lmcv:{tenant}:*", "-@all", *LINE.split())
    return valkey.Valkey(port=srv.port, username=tenant, password=f"{tenant}-pw", socket_timeout=10)


def _key(tenant: str, i: int) -> str:
    return f"lmcv:{tenant}:ns:c:{{{i:04x}}}"


async def test_a_tenant_that_fills_the_arena_does_not_lock_the_others_out(start_server):
    srv = start_server("tcp;ofi_rxm", arena_mb=16, extra=("require_proof", "yes"))
    a = _worker(srv, "team-a")
    _worker(srv, "team-b")
    for i in range(48):  # three arenas' worth, no expiry
        a.execute_command(commands.TCP_SET, _key("team-a", i), os.urandom(MiB))
    async with FabricTransport("127.0.0.1", srv.port, username="team-b", password="team-b-pw",
                               bulk_fallback=False) as b:
        arena = bytearray(4 * MiB)
        b.register_buffer(arena)
        mv = memoryview(arena)
        value = os.urandom(2 * MiB)
        mv[: len(value)] = value
        await b.set_from(_key("team-b", 1).encode(), [mv[: len(value)]], None, 10)
        assert await b.get_into(_key("team-b", 1).encode(), [mv[2 * MiB :]], 10) == len(value)
        assert mv[2 * MiB :] == value
        assert b.peer_proof is True  # the address proof found room too
    info = srv.info()
    assert info["evicted"] >= 32 and info["refused"] == 0, info
    assert a.exists(_key("team-a", 0)) == 0 and a.exists(_key("team-a", 47)) == 1


def test_the_least_recently_used_value_goes_first(start_server):
    srv = start_server("none", arena_mb=8)
    c = srv.client()
    for i in range(8):  # exactly full
        c.execute_command(commands.TCP_SET, _key("t", i), os.urandom(MiB))
    assert c.execute_command(commands.TCP_GET, _key("t", 0))  # read: now the most recent
    c.execute_command(commands.TCP_SET, _key("t", 8), os.urandom(MiB))
    c.execute_command(commands.TCP_SET, _key("t", 3), os.urandom(MiB))  # overwrite: most recent
    c.execute_command(commands.TCP_SET, _key("t", 9), os.urandom(MiB))
    left = {i for i in range(10) if c.exists(_key("t", i))}
    assert left == {0, 3, 4, 5, 6, 7, 8, 9}, left  # 1 and 2 went, oldest first
    assert srv.info()["evicted"] == 2


def test_arena_eviction_none_keeps_refusing_when_full(start_server):
    srv = start_server("none", arena_mb=4, extra=("arena_eviction", "none"))
    c = srv.client()
    for i in range(4):
        c.execute_command(commands.TCP_SET, _key("t", i), os.urandom(MiB))
    with pytest.raises(valkey.ResponseError, match="maxmemory|NOSPACE"):
        c.execute_command(commands.TCP_SET, _key("t", 4), os.urandom(MiB))
    assert all(c.exists(_key("t", i)) for i in range(4)) and srv.info()["evicted"] == 0
