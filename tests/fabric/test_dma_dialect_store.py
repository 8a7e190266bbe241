"""A worker whose store speaks Momento's DMA dialect over the fabric and a worker on plain RESP
share chunks through one server: what either puts, the other reads, byte for byte, through
the store as LMCache drives it (header and payload in separate buffers, so the DMA worker
moves each chunk through its bounce area; payload in a registered arena)."""

from __future__ import annotations

import os

import pytest

from lmcache_valkey.codec import ChunkMeta
from lmcache_valkey.config import FabricSettings, Node, Settings
from lmcache_valkey.keys import make_namespace
from lmcache_valkey.store import ChunkRef, open_store
from lmcache_valkey.transport.fabric import FabricTransport

MiB = 1 << 20
PROVIDER = "tcp;ofi_rxm"


def _settings(port: int, transport: str, **fabric) -> Settings:
    return Settings(nodes=(Node("127.0.0.1", port),), transport=transport,
                    fabric=FabricSettings(provider=PROVIDER, bind_addr="127.0.0.1", dialect="dma", **fabric))


# Our module as installed (the worker proves its address, confined to its regions), and as
# Momento's module behaves (HELLO's arguments ignored: the address travels with each command).
SERVERS = {"secure-default": (), "as-momento": ("extensions", "no", "require_proof", "no")}


@pytest.mark.parametrize("server", list(SERVERS))
async def test_a_dma_worker_and_a_resp_worker_share_chunks(start_server, server):
    srv = start_server(PROVIDER, extra=SERVERS[server])
    ns = make_namespace("lmcv", "t1", {"model": "m"})
    meta = ChunkMeta(((4 * MiB,),), ("uint8",), 1, "k")
    dma = await open_store(_settings(srv.port, "fabric"), ns)
    resp = await open_store(_settings(srv.port, "tcp"), ns)
    try:
        assert dma.transport_name == "fabric" and resp.transport_name == "resp"
        arena = bytearray(16 * MiB)
        dma.transport.register_buffer(arena)  # what the LMCache integration does with its arena
        mv = memoryview(arena)

        # The DMA worker computes and stores; the RESP worker loads it.
        by_dma = os.urandom(4 * MiB)
        mv[: 4 * MiB] = by_dma
        a = ChunkRef(ns.chunk_id("a"), "a")
        assert await dma.put(a, meta, mv[: 4 * MiB])
        out = bytearray(4 * MiB)
        got = await resp.get_into(a, memoryview(out))
        assert got is not None and bytes(out) == by_dma
        # And the other way round.
        by_resp = os.urandom(4 * MiB)
        b = ChunkRef(ns.chunk_id("b"), "b")
        assert await resp.put(b, meta, memoryview(by_resp))
        got = await dma.get_into(b, mv[8 * MiB : 12 * MiB])
        assert got is not None and mv[8 * MiB : 12 * MiB] == by_resp

        # Both moved over the fabric, through the bounce area, never over TCP.
        assert dma.transport.stats["bulk_fallbacks"] == 0
        assert dma.transport.peer_proof is (server == "secure-default")
    finally:
        await dma.close()
        await resp.close()
    info = srv.info()
    assert info["dma_sets"] == 1 and info["dma_gets"] == 1
    assert info["rma_sets"] == 0 and info["rma_gets"] == 0  # no BLOB.* command was needed


async def test_a_chunk_larger_than_the_bounce_area_goes_over_tcp_counted(start_server):
    srv = start_server(PROVIDER)
    ns = make_namespace("lmcv", "t1", {"model": "m"})
    store = await open_store(_settings(srv.port, "fabric", bounce_bytes=MiB), ns)
    try:
        arena = bytearray(8 * MiB)
        store.transport.register_buffer(arena)
        mv = memoryview(arena)
        payload = os.urandom(2 * MiB)
        mv[: 2 * MiB] = payload
        ref = ChunkRef(ns.chunk_id("big"), "big")
        assert await store.put(ref, ChunkMeta(((2 * MiB,),), ("uint8",), 1, "big"), mv[: 2 * MiB])
        got = await store.get_into(ref, mv[4 * MiB : 6 * MiB])
        assert got is not None and mv[4 * MiB : 6 * MiB] == payload
        assert store.transport.stats["bulk_fallbacks"] == 2  # the put and the get, as plain SET/GET
    finally:
        await store.close()
    assert srv.info()["dma_sets"] == 0


async def test_one_registered_range_moves_in_place_with_its_ttl(start_server):
    srv = start_server(PROVIDER)
    async with FabricTransport("127.0.0.1", srv.port, dialect="dma") as t:
        arena = bytearray(2 * MiB)
        t.register_buffer(arena)
        mv = memoryview(arena)
        value = os.urandom(MiB)
        mv[:MiB] = value
        await t.set_from(b"k", [mv[:MiB]], 60.0, 10)
        assert 0 < srv.client().pttl(b"k") <= 60_000
        assert srv.client().get(b"k") == value
        assert await t.get_into(b"k", [mv[MiB:]], 10) == MiB and mv[MiB:] == value
        assert await t.info(b"k") == (MiB, None) and await t.info(b"absent") is None
        assert t.stats["staged"] == 0 and t.stats["bulk_fallbacks"] == 0
