"""TierManager against real Valkey (small maxmemory), a real O_DIRECT directory and moto S3."""

from __future__ import annotations

import asyncio

import pytest
from tierhelp import MAXMEMORY, NS, chunk, ram_get, resp_client, tiering

from lmcache_valkey import codec
from lmcache_valkey.tiering import TierClient, TierManager
from lmcache_valkey.tiering.index import marker_of

pytestmark = pytest.mark.timeout(120)
BUCKET = "lmcv-test"


async def _manager(valkey, ts, client=None, *, create_bucket=True):
    client = client or await resp_client(valkey)
    m = TierManager(client.settings, ts, client)
    if create_bucket and ts.s3_bucket:
        # the bucket must exist before start() lists it
        from lmcache_valkey.tiering.object_store import ObjectTier

        o = ObjectTier(ts)
        await o.start()
        await o.create_bucket()
        await o.close()
    await m.start(background=False)
    return m, client


async def _get_or_promote(client, tiers: TierClient, key: bytes, size: int) -> tuple[bytes | None, bool]:
    got = await ram_get(client, key, size)
    if got is not None:
        return got, False
    if not await tiers.promote(key, timeout=10.0):
        return None, True
    return await ram_get(client, key, size), True


def test_working_set_three_times_ram_served_byte_exact(small_valkey, nvme_dir, moto_s3) -> None:
    """3x maxmemory of chunks: RAM holds the hot end, NVMe (budget ~1/2) the middle, S3 all."""
    n, size = 96, 256 << 10  # 24 MiB of payload against maxmemory 8 MiB
    assert n * size >= 3 * MAXMEMORY

    async def main() -> None:
        ts = tiering(nvme_dir=nvme_dir, nvme_budget_bytes=12 << 20, s3_bucket=BUCKET, s3_endpoint_url=moto_s3.url,
                     demote_high_watermark=0.6, demote_low_watermark=0.4)
        m, client = await _manager(small_valkey, ts)
        tiers = TierClient.embedded(m)
        try:
            items = [chunk(i, size) for i in range(n)]
            for i, (key, value) in enumerate(items):
                await client.set(key, [value], ttl_s=None, timeout=5.0)
                await tiers.note_put(key, len(value))
                if i % 8 == 7:
                    assert await m.flush(30.0)
                    await m.demote_once()
            assert await m.flush(30.0)
            await m.demote_once()
            st = m.stats()
            assert st["manager"]["demoted"] > 0
            assert st["s3"]["uploaded"] == n and st["s3"]["dropped"] == 0
            assert st["nvme"]["evicted"] > 0  # NVMe cannot hold it all: some chunks are S3-only
            # every chunk is "present in some tier" for the one-round-trip lookup
            exists = await client.exists_many([k for k, _ in items] + [marker_of(k) for k, _ in items], timeout=5.0)
            assert all(exists[i] or exists[n + i] for i in range(n))
            sources = {"ram": 0, "promoted": 0}
            for key, value in reversed(items):  # newest first: RAM, then NVMe, then S3-only
                got, promoted = await _get_or_promote(client, tiers, key, len(value))
                assert got == value, key
                sources["promoted" if promoted else "ram"] += 1
                await m.demote_once()
            st = m.stats()
            assert sources["promoted"] > n // 2
            assert st["nvme"]["hits"] > 0 and st["s3"]["hits"] > 0
            assert st["manager"]["promotion_misses"] == 0
        finally:
            await m.close()
            await client.close()

    asyncio.run(main())
