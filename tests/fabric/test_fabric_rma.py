"""Real two-process RMA: this process (client, RMA target) and a Valkey server with the
endpoint module (RMA initiator), over tcp;ofi_rxm, sockets and shm."""

from __future__ import annotations

import asyncio
import os

import google_crc32c
import pytest

from lmcache_valkey.transport.fabric import FabricTransport

MiB = 1 << 20
HDR = 64  # a small header scratch, as the store's codec uses


def run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize("size", [4 * MiB, 32 * MiB])
def test_put_get_byte_exact(start_server, provider, size):
    srv = start_server(provider)

    async def body():
        async with FabricTransport("127.0.0.1", srv.port, provider=provider, verify_crc=True) as t:
            arena = bytearray(2 * (HDR + size) + 8192)
            t.register_buffer(arena)
            mv = memoryview(arena)
            header, payload = os.urandom(HDR), os.urandom(size)
            src_h, src_p = mv[:HDR], mv[4096 : 4096 + size]
            src_h[:] = header
            src_p[:] = payload
            await t.set_from(b"chunk", [src_h, src_p], None, 20)
            base = 8192 + size
            dst_h, dst_p = mv[base : base + HDR], mv[base + HDR : base + HDR + size]
            n = await t.get_into(b"chunk", [dst_h, dst_p], 20)
            assert n == HDR + size
            assert bytes(dst_h) == header and bytes(dst_p) == payload
            length, crc = await t.info(b"chunk")
            assert length == HDR + size and crc == google_crc32c.value(header + payload)

    run(body())
    info = srv.info()
    assert info["xfers_ok"] == 2 and info["xfers_failed"] == 0 and info["xfers_timedout"] == 0


def test_miss_ttl_delete_and_partial(start_server, provider):
    srv = start_server(provider)

    async def body():
        async with FabricTransport("127.0.0.1", srv.port, provider=provider) as t:
            arena = bytearray(4 * MiB)
            t.register_buffer(arena)
            mv = memoryview(arena)
            assert await t.get_into(b"absent", [mv[:MiB]], 5) is None
            value = os.urandom(MiB)
            mv[:MiB] = value
            await t.set_from(b"k", [mv[:MiB]], 30.0, 5)
            assert 0 < srv.client().pttl(b"k") <= 30000
            # Buffers smaller than the value: the window fills, the full length comes back.
            small = mv[2 * MiB : 2 * MiB + 1000]
            assert await t.get_into(b"k", [small], 5) == MiB
            assert bytes(small) == value[:1000]
            assert t.stats["partial_retries"] == 1
            assert await t.delete([b"k", b"absent"]) == 1
            assert await t.get_into(b"k", [mv[:MiB]], 5) is None

    run(body())
    info = srv.info()
    assert info["objects"] == 0 and info["arena_used_bytes"] == 0


def test_bulk_and_rma_see_the_same_values(start_server):
    srv = start_server("tcp;ofi_rxm")
    value = os.urandom(3 * MiB + 17)
    srv.client().execute_command("BLOB.TCP_SET", b"bulk", value)

    async def body():
        async with FabricTransport("127.0.0.1", srv.port) as t:
            arena = bytearray(8 * MiB)
            t.register_buffer(arena)
            mv = memoryview(arena)
            assert await t.get_into(b"bulk", [mv[:HDR], mv[HDR : 4 * MiB]], 5) == len(value)
            assert bytes(mv[: len(value)]) == value
            await t.set_from(b"rma", [mv[: len(value)]], None, 5)

    run(body())
    assert srv.client().execute_command("BLOB.TCP_GET", b"rma") == value


def test_a_server_whose_shm_address_is_shorter_than_ours_is_reached(start_server):
    """shm names an endpoint "fi_shm://<pid>:<domain>:<endpoint>\\0": a server with fewer PID
    digits than ours (a container's small PIDs), or a client that has opened ten endpoints
    before, has a shorter address than ours. That is an address, not a lie."""
    from lmcache_valkey.transport.fabric.endpoint import FabricEndpoint

    for _ in range(100):  # our next endpoint's index has three digits; the server's has one
        FabricEndpoint("shm").close()
    srv = start_server("shm")

    async def body():
        async with FabricTransport("127.0.0.1", srv.port, provider="shm") as t:
            arena = bytearray(2 * MiB)
            t.register_buffer(arena)
            mv = memoryview(arena)
            mv[:MiB] = os.urandom(MiB)
            await t.set_from(b"k", [mv[:MiB]], None, 10)
            assert await t.get_into(b"k", [mv[MiB:]], 10) == MiB
            assert mv[:MiB] == mv[MiB:]
            return t.endpoint.name, list(t.endpoint._peers)

    ours, servers = run(body())
    assert servers and all(len(name) < len(ours) for name in servers), "the case did not arise"
