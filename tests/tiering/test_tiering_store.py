"""The lead's ChunkStore with a TierClient: lookups count lower tiers, a get promotes."""

from __future__ import annotations

import asyncio

import pytest
from tierhelp import NS, resp_client, tiering

from lmcache_valkey.codec import ChunkMeta
from lmcache_valkey.tiering import TierClient, TierManager

pytestmark = pytest.mark.timeout(60)


def test_store_lookup_and_get_see_the_lower_tiers(small_valkey, nvme_dir) -> None:
    async def main() -> None:
        from lmcache_valkey.store import ChunkRef, ChunkStore

        client = await resp_client(small_valkey)
        m = TierManager(client.settings, tiering(nvme_dir=nvme_dir), client)
        await m.start(background=False)
        store = ChunkStore(client.settings, NS, client, tiers=TierClient.embedded(m))
        try:
            refs = [ChunkRef(f"{i:032x}", f"model@{i}") for i in range(4)]
            payloads = [bytes([i]) * 100_000 for i in range(4)]
            meta = ChunkMeta(shapes=((100_000,),), dtypes=("uint8",), fmt=1)
            assert all(await store.put_many([(r, meta, memoryview(p)) for r, p in zip(refs, payloads)]))
            await asyncio.sleep(0)  # note_put hints run as background tasks
            for _ in range(100):
                if len(m.index) == 4 and not m._copying:
                    break
                await asyncio.sleep(0.02)
            assert await m.flush(10.0) and len(m.index) == 4
            await m.evict("ram", keys=[NS.data_key(r.chunk_id) for r in refs])
            assert await store.contains_prefix([r.chunk_id for r in refs]) == 4  # markers count
            assert await store.contains_each([r.chunk_id for r in refs]) == [True] * 4
            dests = [bytearray(100_000) for _ in refs]
            got = await store.get_many_into([(r, memoryview(d)) for r, d in zip(refs, dests)])
            assert all(g is not None for g in got) and dests == payloads
            assert m.stats()["manager"]["promotions"] == 4
        finally:
            await m.close()
            await store.close()

    asyncio.run(main())
