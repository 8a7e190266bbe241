"""Tiering over the in-memory transport and a real O_DIRECT directory: the manager, the store
and tierd's protocol without a Valkey process, so each check runs in well under a second
(the real-server tests cover the same flows end to end)."""

from __future__ import annotations

import asyncio
import os

import pytest
from tierhelp import NS, chunk, tiering

from lmcache_valkey.codec import ChunkMeta
from lmcache_valkey.config import Settings
from lmcache_valkey.store import ChunkRef, ChunkStore
from lmcache_valkey.tiering import EmbeddedTierClient, RemoteTierClient, TierManager, protocol
from lmcache_valkey.tiering.markers import marker_of
from lmcache_valkey.tiering.service import RequestServer
from lmcache_valkey.transport.memory import MemoryTransport

pytestmark = pytest.mark.timeout(60)


async def test_demoted_chunks_stay_visible_and_come_back_through_the_store(nvme_dir):
    valkey = MemoryTransport(Settings(tenant="t1"), maxmemory=1 << 20)
    m = TierManager(valkey.settings, tiering(nvme_dir=nvme_dir, demote_high_watermark=0.5,
                                             demote_low_watermark=0.2), valkey)
    await m.start(background=False)
    store = ChunkStore(valkey.settings, NS, valkey, tiers=EmbeddedTierClient(m))
    try:
        refs = [ChunkRef(f"{i:032x}", f"model@{i}") for i in range(8)]
        data = [os.urandom(200_000) for _ in refs]
        meta = ChunkMeta(shapes=((200_000,),), dtypes=("uint8",), fmt=1)
        assert all(await store.put_many([(r, meta, memoryview(d)) for r, d in zip(refs, data)]))
        await asyncio.sleep(0)  # put hints run as background tasks
        assert await m.flush(10) and len(m.ledger) == 8
        assert await m.demote_once() >= 5  # 1.6 MB held against maxmemory 1 MiB: down to 20 %
        ids = [r.chunk_id for r in refs]
        assert await store.contains_prefix(ids) == 8  # RAM or marker, one pass
        for r, d in zip(refs, data):
            dest = bytearray(200_000)
            assert await store.get_into(r, memoryview(dest)) is not None and bytes(dest) == d
        assert m.stats()["manager"]["promotions"] >= 5
    finally:
        await m.close()
        await store.close()


async def test_a_delete_removes_every_copy_and_its_marker(nvme_dir):
    valkey = MemoryTransport(Settings(tenant="t1"))
    m = TierManager(valkey.settings, tiering(nvme_dir=nvme_dir), valkey)
    await m.start(background=False)
    try:
        key, value = chunk(1, 50_000)
        await valkey.set(key, [value], ttl_s=None, timeout=1)
        m.note_put(key, len(value))
        assert await m.flush(10) and m.ledger.tiers_of(key) == ["nvme"]
        assert await valkey.exists_many([marker_of(key)], timeout=1) == [True]
        assert await m.delete([key]) == 1
        assert await valkey.exists_many([key, marker_of(key)], timeout=1) == [False, False]
        assert key not in m.ledger and not m.tier("nvme").entries() and not await m.promote(key, timeout=1)
    finally:
        await m.close()


async def test_tierd_protocol_round_trip(nvme_dir):
    """Worker and tierd through the same request and reply lists, the op table on both ends."""
    valkey = MemoryTransport(Settings(tenant="t1"))
    m = TierManager(valkey.settings, tiering(nvme_dir=nvme_dir, request_block_s=0.05), valkey)
    await m.start(background=False)
    stop = asyncio.Event()
    serving = asyncio.create_task(RequestServer(m).serve(stop))
    tc = RemoteTierClient(valkey, valkey.settings)
    try:
        key, value = chunk(2, 50_000)
        await valkey.set(key, [value], ttl_s=None, timeout=1)
        await tc.note_put(key, len(value))
        await tc.flush_hints()
        assert (await tc.control("drain", {"timeout_s": 10.0}, timeout=10))["drained"]
        assert (await tc.control("stats", timeout=5))["index"]["nvme"]["chunks"] == 1
        assert await tc.control("evict", {"tier": "ram", "keys": [key]}, timeout=5) == 1
        assert await tc.promote(key, timeout=5)
        dest = bytearray(len(value))
        assert await valkey.get_into(key, [memoryview(dest)], timeout=1) == len(value) and bytes(dest) == value
        req = protocol.request_key("lmcv", "t1")
        await valkey.command(b"RPUSH", req, b"\xc1 not msgpack", key=req, timeout=1)  # refused, counted
        for _ in range(100):
            if m.counters["bad_requests"]:
                break
            await asyncio.sleep(0.01)
        assert m.counters["bad_requests"] == 1
        assert await tc.delete([key], timeout=5) == 1  # the promoted RAM copy (and the NVMe file, marker)
        assert key not in m.ledger
    finally:
        stop.set()
        await asyncio.wait_for(serving, 10)
        await tc.close()
        await m.close()
