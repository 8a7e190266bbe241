"""Refusals and failures are clear errors, and no byte lands outside the buffers offered."""

from __future__ import annotations

import asyncio
import os
import socket
import time

import pytest
import valkey

from lmcache_valkey.errors import DeadlineExceeded, ServerError
from lmcache_valkey.transport.resp.parser import encode_command
from support.servers import _recv_reply
from lmcache_valkey.transport.fabric import (
    FabricTransport,
    OutsideRegions,
    commands,
    NoFabricSession,
    TransferFailed,
    UnregisteredBuffer,
    WindowTooSmall,
)

MiB = 1 << 20
GUARD = 0xA5
WEAK = ("require_proof", "no")  # what the provider does with a bad triple: no region check in the way


def _guarded_arena(t: FabricTransport, size: int):
    """A registered arena filled with a guard pattern; returns (view, region)."""
    arena = bytearray([GUARD]) * size
    region = t.register_buffer(arena)
    return memoryview(arena), region


async def _eventually(op, tries: int = 50):
    for i in range(tries):
        try:
            return await op()
        except TransferFailed:
            if i == tries - 1:
                raise
            await asyncio.sleep(0.1)


def _untouched(mv: memoryview, start: int, end: int) -> bool:
    return mv[start:end].tobytes().count(GUARD) == end - start


async def _upstream_style_command(srv, t: FabricTransport, *args, timeout: float = 2):
    """Sends one command on a connection with a plain HELLO (the upstream dialect: no
    declared regions, so the server's region check does not stand between a triple and the
    provider) bound to the transport's own fabric address. Needs a server in the weak mode
    (``require_proof no``, WEAK): the only one where such a session moves bytes."""
    def run():
        with socket.create_connection(("127.0.0.1", srv.port), timeout=timeout + 5) as sock:
            replies = []
            for cmd in (("BLOB.RDMA_HELLO", t.endpoint.name.hex()), (*args, "TIMEOUT", int(timeout * 1000))):
                sock.sendall(encode_command(cmd))
                replies.append(_recv_reply(sock))
            return replies[-1]

    reply = await asyncio.to_thread(run)
    if isinstance(reply, ServerError):
        raise commands.map_error(reply.message)
    return reply


@pytest.mark.parametrize("provider", ["tcp;ofi_rxm", "sockets", "shm"])
async def test_wrong_rkey_is_a_transfer_error_and_writes_nothing(start_server, provider):
    srv = start_server(provider, extra=WEAK)
    srv.client().execute_command("BLOB.TCP_SET", b"k", os.urandom(MiB))

    async with FabricTransport("127.0.0.1", srv.port, provider=provider) as t:
        mv, region = _guarded_arena(t, 4 * MiB)
        # tcp and sockets report the bad key; shm never completes the op, so the
        # server's deadline ends it (and the client's, whichever comes first).
        with pytest.raises((TransferFailed, DeadlineExceeded)):
            await _upstream_style_command(srv, t, "BLOB.RDMA_GET", b"k", region.key + 1000,
                                          region.remote_addr(region.addr), MiB)
        assert _untouched(mv, 0, 4 * MiB)
        # The client recovers: tcp;ofi_rxm tears its link down on a bad key and
        # reconnects within a moment. shm leaves the bad op pending forever and its
        # queue to this peer with it: no recovery there (docs/fabric-failure-semantics.md).
        if provider != "shm":
            assert await _eventually(lambda: t.get_into(b"k", [mv[:MiB]], 10)) == MiB

    # The server ends the transfer with an error or at its deadline (shm: later than
    # the client gave up); poll briefly rather than time it.
    for _ in range(200):
        info = srv.info()
        if info["xfers_failed"] + info["xfers_timedout"] >= 1:
            break
        time.sleep(0.05)
    assert info["xfers_failed"] + info["xfers_timedout"] >= 1


@pytest.mark.parametrize("provider", ["tcp;ofi_rxm", "sockets", "shm"])
async def test_window_past_the_registered_region_is_refused_by_the_provider(start_server, provider):
    srv = start_server(provider, extra=WEAK)
    srv.client().execute_command("BLOB.TCP_SET", b"k", os.urandom(2 * MiB))

    async with FabricTransport("127.0.0.1", srv.port, provider=provider) as t:
        # Register only the middle of a larger buffer; the window runs past its end.
        outer = bytearray([GUARD]) * (6 * MiB)
        mv = memoryview(outer)
        addr, _ = t.endpoint.address_of(mv)
        region = t.register(addr + 2 * MiB, 2 * MiB)
        start = region.remote_addr(region.addr + MiB)
        with pytest.raises((TransferFailed, DeadlineExceeded)):
            await _upstream_style_command(srv, t, "BLOB.RDMA_GET", b"k", region.key, start, 2 * MiB)
        # Nothing beyond the registered region moved (inside it, a provider may have
        # written the part of the window that was in range before failing).
        assert _untouched(mv, 4 * MiB, 6 * MiB) and _untouched(mv, 0, 2 * MiB)
        t.endpoint.deregister(region)



async def test_short_window_and_oversized_length_are_refused_before_any_byte_moves(start_server):
    srv = start_server("tcp;ofi_rxm", arena_mb=16)
    srv.client().execute_command("BLOB.TCP_SET", b"k", os.urandom(MiB))

    async with FabricTransport("127.0.0.1", srv.port) as t:
        mv, region = _guarded_arena(t, 4 * MiB)
        with pytest.raises(WindowTooSmall, match="smaller than object length"):
            await t.get_into(b"k", [mv[:1000]], 5, allow_partial=False)
        assert _untouched(mv, 0, 4 * MiB)
        base = region.remote_addr(region.addr)
        # SET whose total exceeds the window offered.
        with pytest.raises(WindowTooSmall):
            await t.command("BLOB.RDMA_SET", b"k2", 2 * MiB, region.key, base, MiB)
        # SET larger than the server's arena.
        with pytest.raises(ServerError, match="max object size exceeded"):
            await t.command("BLOB.RDMA_SET", b"k2", 64 * MiB, region.key, base, 4 * MiB)
        # Malformed triples.
        with pytest.raises(ServerError, match="invalid memory address len"):
            await t.command("BLOB.RDMA_GET", b"k", region.key, base, 0)
        # The deprecated names answer with their own codes.
        with pytest.raises(WindowTooSmall, match="BADWINDOW"):
            await t.command("BLOB.SET", b"k2", 2 * MiB, region.key, base, MiB)
        with pytest.raises(ServerError, match="TOOLARGE"):
            await t.command("BLOB.SET", b"k2", 64 * MiB, region.key, base, 4 * MiB)
        assert await t.get_into(b"k2", [mv[:MiB]], 5) is None

    assert srv.info()["xfers_ok"] == 0


async def test_unregistered_buffer_is_refused_client_side(start_server):
    srv = start_server("tcp;ofi_rxm")

    async with FabricTransport("127.0.0.1", srv.port) as t:
        # Larger than a scratch slot and not registered: refused before anything is sent.
        with pytest.raises(UnregisteredBuffer, match="outside every registered region"):
            await t.get_into(b"k", [memoryview(bytearray(MiB))], 5)
        with pytest.raises(UnregisteredBuffer):
            await t.set_from(b"k", [memoryview(bytes(MiB))], None, 5)
    async with FabricTransport("127.0.0.1", srv.port, scratch_bytes=0) as strict:
        with pytest.raises(UnregisteredBuffer):
            await strict.get_into(b"k", [memoryview(bytearray(100))], 5)
    assert srv.info()["rma_gets"] == 0 and srv.info()["rma_sets"] == 0



async def test_small_unregistered_header_is_staged_through_scratch(start_server):
    srv = start_server("tcp;ofi_rxm")

    async with FabricTransport("127.0.0.1", srv.port) as t:
        arena = bytearray(2 * MiB)
        t.register_buffer(arena)
        mv = memoryview(arena)
        payload = os.urandom(MiB)
        mv[:MiB] = payload
        header = os.urandom(512)  # bytes, not registered: the store's header
        await t.set_from(b"k", [memoryview(header), mv[:MiB]], None, 5)
        hdr_out = bytearray(512)
        assert await t.get_into(b"k", [memoryview(hdr_out), mv[MiB:]], 5) == 512 + MiB
        assert hdr_out == header and mv[MiB:] == payload
        assert t.stats["staged"] == 2 and t.stats["bulk_fallbacks"] == 0
        scratch = t._link.scratch
        assert scratch.free == scratch.region.length // scratch.slot_bytes

    assert srv.info()["rma_gets"] == 1 and srv.info()["rma_sets"] == 1


async def test_a_burst_of_sets_on_fresh_connections_never_fails_for_want_of_scratch(start_server):
    """512 concurrent sets with staged headers fill the scratch while new connections still
    need a slot for their HELLO proof: those sets go by the bulk path, none fails."""
    srv = start_server("tcp;ofi_rxm")

    async with FabricTransport("127.0.0.1", srv.port, connections=4) as t:
        n, size = 512, 64 << 10
        arena = bytearray(n * size)
        t.register_buffer(arena)
        mv = memoryview(arena)
        items = [(b"k%d" % i, [bytearray(512), mv[i * size:(i + 1) * size]]) for i in range(n)]
        errs = await t.set_many(items, ttl_s=None, timeout=30)
        assert [e for e in errs if e is not None] == []



def test_missing_hello_is_refused(start_server):
    srv = start_server("tcp;ofi_rxm")
    srv.client().execute_command("BLOB.TCP_SET", b"k", b"v" * 100)
    plain = srv.client()
    with pytest.raises(valkey.ResponseError, match="no RDMA session"):
        plain.execute_command("BLOB.RDMA_GET", b"k", 1, 4096, 100)
    with pytest.raises(valkey.ResponseError, match="no RDMA session"):
        plain.execute_command("BLOB.RDMA_SET", b"k", 100, 1, 4096, 100)
    with pytest.raises(valkey.ResponseError, match="invalid rdma address hex"):
        plain.execute_command("BLOB.RDMA_HELLO", "xyz")
    with pytest.raises(valkey.ResponseError, match="NOHELLO"):  # the deprecated name
        plain.execute_command("BLOB.GET", b"k", 1, 4096, 100)
    # And through the client's error mapping:
    assert isinstance(commands.map_error("ERR no RDMA session (call BLOB.RDMA_HELLO first)"), NoFabricSession)
    assert isinstance(commands.map_error("NOHELLO send BLOB.HELLO first"), NoFabricSession)


async def test_hello_twice_and_sessions_released_on_disconnect(start_server):
    srv = start_server("tcp;ofi_rxm")

    async with FabricTransport("127.0.0.1", srv.port, connections=3) as t:
        arena = bytearray(MiB)
        t.register_buffer(arena)
        with pytest.raises(ServerError, match="already established"):
            await t.command("BLOB.RDMA_HELLO", t.endpoint.name.hex())
        await asyncio.gather(*(t.get_into(b"none", [memoryview(arena)[i * 1000 : (i + 1) * 1000]], 5) for i in range(3)))
        assert srv.info()["sessions"] == t.stats["connections"]

    # Disconnects are processed asynchronously by the server: poll briefly.
    for _ in range(100):
        info = srv.info()
        if info["sessions"] == 0 and info["peers"] == 0:
            break
        asyncio.run(asyncio.sleep(0.05))
    assert info["sessions"] == 0 and info["peers"] == 0


@pytest.mark.parametrize("provider", ["tcp;ofi_rxm", "sockets", "shm"])
async def test_sessions_sharing_one_fabric_address_survive_each_other(start_server, provider):
    """Every pooled connection HELLOs with the same client address; ending one session must
    not remove the peer the others still use (shm crashed the server before peers were
    counted)."""
    srv = start_server(provider)

    async with FabricTransport("127.0.0.1", srv.port, provider=provider, connections=2) as t:
        arena = bytearray(4 * MiB)
        t.register_buffer(arena)
        mv = memoryview(arena)
        mv[:MiB] = os.urandom(MiB)
        await t.set_from(b"k", [mv[:MiB]], None, 5)
        await asyncio.gather(t.get_into(b"k", [mv[MiB : 2 * MiB]], 5), t.get_into(b"k", [mv[2 * MiB : 3 * MiB]], 5))
        assert srv.info()["sessions"] == 2 and srv.info()["peers"] == 1
        pool = t._link.pool
        await pool.drop(pool._idle.pop())  # end one session
        for _ in range(100):
            if srv.info()["sessions"] == 1:
                break
            await asyncio.sleep(0.02)
        for _ in range(3):
            assert await t.get_into(b"k", [mv[MiB : 2 * MiB]], 5) == MiB
        assert t.stats["bulk_fallbacks"] == 0 and srv.info()["xfers_failed"] == 0



async def test_a_triple_outside_the_declared_regions_is_refused_before_any_transfer(start_server):
    srv = start_server("tcp;ofi_rxm")
    srv.client().execute_command("BLOB.TCP_SET", b"k", os.urandom(MiB))

    async with FabricTransport("127.0.0.1", srv.port, bulk_fallback=False) as t:
        mv, region = _guarded_arena(t, 4 * MiB)
        base = region.remote_addr(region.addr)
        outside = [
            (region.key, base + 3 * MiB + 1, MiB),  # runs past the region's end
            (region.key ^ 1, base, MiB),  # another key
            (region.key, base + 4 * MiB, 1),  # just past the end
        ]
        for rkey, addr, n in outside:
            with pytest.raises(OutsideRegions):
                await t.command("BLOB.RDMA_GET", b"k", rkey, addr, n)
        assert _untouched(mv, 0, 4 * MiB)
        assert await t.get_into(b"k", [mv[3 * MiB :]], 5) == MiB  # inside: fine

    info = srv.info()
    assert info["outside_regions"] == 3 and info["xfers_failed"] == 0 and info["xfers_ok"] == 1
