"""ChunkStore with a tier client: lookups count lower tiers, a get promotes."""

from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator

import pytest
from tierhelp import NS, resp_client, tiering

from lmcache_valkey import codec
from lmcache_valkey.codec import ChunkMeta
from lmcache_valkey.store import ChunkRef, ChunkStore
from lmcache_valkey.tiering import EmbeddedTierClient, TierManager

pytestmark = pytest.mark.timeout(60)


@contextlib.asynccontextmanager
async def tiered_store(small_valkey, nvme_dir) -> AsyncIterator[tuple[ChunkStore, TierManager]]:
    """A ChunkStore with an embedded tier manager over NVMe."""
    client = await resp_client(small_valkey)
    m = TierManager(client.settings, tiering(nvme_dir=nvme_dir), client)
    await m.start(background=False)
    store = ChunkStore(client.settings, NS, client, tiers=EmbeddedTierClient(m))
    try:
        yield store, m
    finally:
        await m.close()
        await store.close()


async def settled(m: TierManager, n: int) -> None:
    """Until the manager indexed ``n`` chunks and copies nothing; then flush the write-behind."""
    for _ in range(100):
        if len(m.ledger) == n and not m.demoter.in_flight:
            break
        await asyncio.sleep(0.02)
    assert await m.flush(10.0) and len(m.ledger) == n


async def test_store_lookup_and_get_see_the_lower_tiers(small_valkey, nvme_dir) -> None:
    async with tiered_store(small_valkey, nvme_dir) as (store, m):
        refs = [ChunkRef(f"{i:032x}", f"model@{i}") for i in range(4)]
        payloads = [bytes([i]) * 100_000 for i in range(4)]
        meta = ChunkMeta(shapes=((100_000,),), dtypes=("uint8",), fmt=1)
        assert all(await store.put_many([(r, meta, memoryview(p)) for r, p in zip(refs, payloads)]))
        await asyncio.sleep(0)  # note_put hints run as background tasks
        await settled(m, 4)
        await m.evict("ram", keys=[NS.data_key(r.chunk_id) for r in refs])
        assert await store.contains_prefix([r.chunk_id for r in refs]) == 4  # markers count
        assert await store.contains_each([r.chunk_id for r in refs]) == [True] * 4
        dests = [bytearray(100_000) for _ in refs]
        got = await store.get_many_into([(r, memoryview(d)) for r, d in zip(refs, dests)])
        assert all(g is not None for g in got) and dests == payloads
        assert m.stats()["manager"]["promotions"] == 4



async def test_a_chunk_whose_metadata_lies_is_removed_from_every_tier(small_valkey, nvme_dir) -> None:
    """Valid CRCs over a payload its metadata does not describe (written by someone with the
    tenant's credentials, then copied down): the get that meets it deletes it everywhere, so
    lookups stop counting its lower-tier marker as a hit."""
    async with tiered_store(small_valkey, nvme_dir) as (store, m):
        client = store.transport
        good, bad = ChunkRef(f"{1:032x}", "model@1"), ChunkRef(f"{2:032x}", "model@2")
        meta = ChunkMeta(shapes=((100_000,),), dtypes=("uint8",), fmt=1)
        assert await store.put(good, meta, memoryview(bytes(100_000)))
        cut = bytes(50_000)  # the metadata still says 100 000 bytes
        header = codec.encode_header(meta, cut, NS.digest_bytes, NS.key_digest(bad.key_string))
        await client.set(NS.data_key(bad.chunk_id), [bytes(header), cut], ttl_s=None, timeout=5)
        m.note_put(NS.data_key(bad.chunk_id), 50_000)
        await settled(m, 2)
        await m.evict("ram", keys=[NS.data_key(r.chunk_id) for r in (good, bad)])
        assert await store.contains_each([good.chunk_id, bad.chunk_id]) == [True, True]

        got = await store.get_many_into([(bad, memoryview(bytearray(100_000)))])
        assert got == [None]
        for _ in range(250):
            if await store.contains_each([bad.chunk_id]) == [False] and NS.data_key(bad.chunk_id) not in m.ledger:
                break
            await asyncio.sleep(0.02)
        assert await store.contains_each([good.chunk_id, bad.chunk_id]) == [True, False]
        assert NS.data_key(bad.chunk_id) not in m.ledger
        assert (await store.get_many_into([(good, memoryview(bytearray(100_000)))]))[0] is not None



async def test_chunks_whose_markers_allkeys_lru_evicted_are_visible_again_after_one_miss(small_valkey, nvme_dir) -> None:
    """Valkey (``allkeys-lru``, the recommended policy) evicts tier markers when another
    tenant's writes fill its memory: lookups stop seeing chunks that are safe on NVMe. The
    lookup that misses one of them reports it; the marker (and the others lost with it) is
    re-created at once, not at the next repair pass minutes later."""
    async with tiered_store(small_valkey, nvme_dir) as (store, m):
        client = store.transport
        refs = [ChunkRef(f"{i:032x}", f"model@{i}") for i in range(16)]
        meta = ChunkMeta(shapes=((100_000,),), dtypes=("uint8",), fmt=1)
        assert all(await store.put_many([(r, meta, memoryview(bytes([i]) * 100_000)) for i, r in enumerate(refs)]))
        await asyncio.sleep(0)  # note_put hints run as background tasks
        await settled(m, len(refs))
        await m.evict("ram", keys=[NS.data_key(r.chunk_id) for r in refs])  # demoted: markers only
        ids = [r.chunk_id for r in refs]
        assert await store.contains_prefix(ids) == len(refs)
        other = b"lmcv:t2:" + b"f" * 32 + b":c:{%032x}"  # another tenant fills the memory
        for i in range(120):
            await client.set(other % i, [bytes(256 << 10)], ttl_s=None, timeout=5.0)
        evicted = len(refs) - sum(await client.exists_many([NS.marker_key(c) for c in ids], timeout=5.0))
        assert evicted > 0, "allkeys-lru kept every marker: nothing to check"
        assert await store.contains_prefix(ids) < len(refs)  # the lookup that misses ...
        for _ in range(250):  # ... reports it; the markers come back
            if await store.contains_prefix(ids) == len(refs):
                break
            await asyncio.sleep(0.02)
        assert await store.contains_prefix(ids) == len(refs)
        assert m.stats()["manager"]["markers_restored"] >= evicted

