"""FabricTransport speaks the store's ChunkTransport protocol, is built from Settings,
and falls back to the bulk path per operation when an RMA transfer fails."""

from __future__ import annotations

import os

from lmcache_valkey.config import FabricSettings, Node, Settings
from lmcache_valkey.transport.fabric import FabricTransport, open_fabric_transport

MiB = 1 << 20


async def test_chunk_transport_protocol_from_settings(start_server):
    srv = start_server("tcp;ofi_rxm")
    settings = Settings(nodes=(Node("127.0.0.1", srv.port),), transport="fabric",
                        fabric=FabricSettings(provider="tcp;ofi_rxm", bind_addr="127.0.0.1"))

    t = await open_fabric_transport(settings)
    try:
        arena = bytearray(8 * MiB)
        t.register_buffer(arena)
        mv = memoryview(arena)
        values = {b"ns:c:%d" % i: os.urandom(MiB) for i in range(4)}
        items = []
        for i, (k, v) in enumerate(values.items()):
            mv[i * MiB : (i + 1) * MiB] = v
            items.append((k, (b"H" * 512, mv[i * MiB : (i + 1) * MiB])))
        assert await t.set_many(items, ttl_s=None, timeout=10) == [None] * 4
        assert await t.exists_many([*values, b"ns:c:none"], timeout=5) == [True] * 4 + [False]
        headers = [bytearray(512) for _ in values]
        dests = [mv[(4 + i) * MiB : (5 + i) * MiB] for i in range(4)]
        got = await t.get_many_into([(k, [memoryview(h), d]) for k, h, d in zip(values, headers, dests)]
                                    + [(b"ns:c:none", [memoryview(bytearray(512))])], timeout=10)
        assert got == [512 + MiB] * 4 + [None]
        assert all(h == b"H" * 512 for h in headers)
        assert [bytes(d) for d in dests] == list(values.values())
        assert sorted([k async for k in t.scan_iter(b"ns:c:*")]) == sorted(values)
        await t.ping(timeout=5)
        assert await t.delete(list(values), timeout=5) == 4
    finally:
        await t.close()



def _fallbacks(op: str) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value("lmcache_valkey_fabric_fallbacks_total", {"op": op}) or 0.0


async def test_failed_rma_falls_back_to_bulk_within_the_deadline(start_server):
    srv = start_server("tcp;ofi_rxm")
    before = _fallbacks("get")
    value = os.urandom(2 * MiB)
    srv.client().execute_command("BLOB.TCP_SET", b"k", value)

    async with FabricTransport("127.0.0.1", srv.port) as t:
        arena = bytearray(4 * MiB)
        region = t.register_buffer(arena)
        # Failure injection: close the MR under the transport's feet, so the server's
        # fi_write meets an unknown key while the client still believes it registered.
        t.endpoint._lib.lmcv_mr_close(region._mr)
        mv = memoryview(arena)
        assert await t.get_into(b"k", [mv[: 2 * MiB]], 10) == 2 * MiB
        assert mv[: 2 * MiB] == value
        assert t.stats["bulk_fallbacks"] == 1
        t.endpoint._regions.remove(region)

    assert srv.info()["xfers_failed"] == 1
    assert _fallbacks("get") == before + 1  # what the LmcacheValkeyFabricFallbacks alert watches


async def test_store_picks_fabric_with_auto_and_round_trips_a_chunk(start_server):
    from lmcache_valkey.codec import ChunkMeta
    from lmcache_valkey.keys import make_namespace
    from lmcache_valkey.store import ChunkRef, open_store

    srv = start_server("tcp;ofi_rxm")
    settings = Settings(nodes=(Node("127.0.0.1", srv.port),), transport="auto",
                        fabric=FabricSettings(provider="tcp;ofi_rxm", bind_addr="127.0.0.1"))

    ns = make_namespace("lmcv", "t1", {"model": "m"})
    store = await open_store(settings, ns)
    try:
        assert store.transport_name == "fabric"
        arena = bytearray(16 * MiB)
        store.transport.register_buffer(arena)  # the integration registers LMCache's arena
        mv = memoryview(arena)
        payload = os.urandom(4 * MiB)
        mv[: 4 * MiB] = payload
        ref = ChunkRef(ns.chunk_id("k1"), "k1")
        assert await store.put(ref, ChunkMeta(((4 * MiB,),), ("uint8",), 1, "k1"), mv[: 4 * MiB])
        got = await store.get_into(ref, mv[8 * MiB : 12 * MiB])
        assert got is not None and got.nbytes == 4 * MiB
        assert mv[8 * MiB : 12 * MiB] == payload
        assert store.transport.stats["bulk_fallbacks"] == 0
    finally:
        await store.close()

    assert srv.info()["rma_gets"] == 1 and srv.info()["rma_sets"] == 1


async def test_operations_after_close_fail_with_a_transport_error():
    """A call that races close() is refused cleanly (never reaches a closed endpoint)."""
    import pytest

    from lmcache_valkey.errors import ConnectionLost
    from lmcache_valkey.transport.fabric import FabricTransport

    t = FabricTransport("127.0.0.1", 1, data_path="bulk")
    await t.close()
    with pytest.raises(ConnectionLost):
        await t.get_into(b"k", [memoryview(bytearray(8))], 1.0)



async def test_a_chunk_in_scattered_parts_of_a_registered_arena_moves_by_rma(start_server):
    from lmcache_valkey.codec import ChunkMeta
    from lmcache_valkey.keys import make_namespace
    from lmcache_valkey.store import ChunkRef, open_store

    srv = start_server("tcp;ofi_rxm")
    settings = Settings(nodes=(Node("127.0.0.1", srv.port),), transport="fabric",
                        fabric=FabricSettings(provider="tcp;ofi_rxm", bind_addr="127.0.0.1"))

    ns = make_namespace("lmcv", "t1", {"model": "m"})
    store = await open_store(settings, ns)
    try:
        arena = bytearray(4 * MiB)
        assert store.register_memory(*_address_and_length(arena))
        mv = memoryview(arena)
        # 8 parts of 64 KiB, 128 KiB apart (one page's layers in a layer-first pool).
        src = [mv[i * 128 * 1024: i * 128 * 1024 + 64 * 1024] for i in range(8)]
        dst = [mv[2 * MiB + i * 128 * 1024: 2 * MiB + i * 128 * 1024 + 64 * 1024] for i in range(8)]
        for p in src:
            p[:] = os.urandom(64 * 1024)
        ref = ChunkRef(ns.chunk_id("page"), "page")
        assert await store.put(ref, ChunkMeta(((8, 65536),), ("uint8",), 0), src)
        got = await store.get_into(ref, dst)
        assert got is not None and got.nbytes == 8 * 64 * 1024
        assert [bytes(d) for d in dst] == [bytes(s) for s in src]
        assert store.transport.stats["bulk_fallbacks"] == 0
    finally:
        await store.close()

    assert srv.info()["rma_gets"] == 1 and srv.info()["rma_sets"] == 1


def _address_and_length(buf: bytearray) -> tuple[int, int]:
    import ctypes

    return ctypes.addressof(ctypes.c_char.from_buffer(buf)), len(buf)
