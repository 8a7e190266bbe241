"""TierManager against real Valkey (small maxmemory), a real O_DIRECT directory and moto S3."""

from __future__ import annotations

import asyncio

import pytest
from tierhelp import MAXMEMORY, chunk, ram_get, resp_client, tiering

from lmcache_valkey import codec
from lmcache_valkey.tiering import EmbeddedTierClient, TierManager
from lmcache_valkey.tiering.markers import marker_of

pytestmark = pytest.mark.timeout(120)


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


async def _get_or_promote(client, tiers: EmbeddedTierClient, key: bytes, size: int) -> tuple[bytes | None, bool]:
    got = await ram_get(client, key, size)
    if got is not None:
        return got, False
    if not await tiers.promote(key, timeout=10.0):
        return None, True
    return await ram_get(client, key, size), True


async def test_working_set_three_times_ram_served_byte_exact(small_valkey, nvme_dir, moto_s3) -> None:
    """3x maxmemory of chunks: RAM holds the hot end, NVMe (budget ~1/2) the middle, S3 all."""
    n, size = 96, 256 << 10  # 24 MiB of payload against maxmemory 8 MiB
    assert n * size >= 3 * MAXMEMORY

    ts = tiering(nvme_dir=nvme_dir, nvme_budget_bytes=12 << 20, s3_bucket=moto_s3.bucket, s3_endpoint_url=moto_s3.url,
                 demote_high_watermark=0.6, demote_low_watermark=0.4)
    m, client = await _manager(small_valkey, ts)
    tiers = EmbeddedTierClient(m)
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



async def test_restart_rebuilds_index_from_nvme_headers_and_s3_metadata(small_valkey, nvme_dir, moto_s3) -> None:
    ts = tiering(nvme_dir=nvme_dir, s3_bucket=moto_s3.bucket, s3_endpoint_url=moto_s3.url)
    items = [chunk(i, 100_000) for i in range(10)]
    m, client = await _manager(small_valkey, ts)
    for key, value in items:
        await client.set(key, [value], ttl_s=None, timeout=5.0)
        m.note_put(key, len(value))
    assert await m.flush(30.0)
    await m.close()
    # Valkey loses everything too (RAM values and tier markers)
    await client.command(b"FLUSHALL", timeout=5.0)

    m2, _ = await _manager(small_valkey, ts, client, create_bucket=False)
    try:
        assert m2.ledger.stats()["nvme"]["chunks"] == 10 and m2.ledger.stats()["s3"]["chunks"] == 10
        markers = await client.exists_many([marker_of(k) for k, _ in items], timeout=5.0)
        assert all(markers), "markers re-asserted from the rebuilt index"
        t2 = EmbeddedTierClient(m2)
        for key, value in items:
            got, promoted = await _get_or_promote(client, t2, key, len(value))
            assert promoted and got == value
        assert m2.stats()["nvme"]["hits"] == 10
    finally:
        await m2.close()
    await client.command(b"FLUSHALL", timeout=5.0)

    # a manager with no NVMe tier: the object listing alone rebuilds the index
    ts3 = tiering(s3_bucket=moto_s3.bucket, s3_endpoint_url=moto_s3.url)
    m3, _ = await _manager(small_valkey, ts3, client, create_bucket=False)
    try:
        assert len(m3.ledger) == 10
        t3 = EmbeddedTierClient(m3)
        for key, value in items:
            got, promoted = await _get_or_promote(client, t3, key, len(value))
            assert promoted and got == value
        assert m3.stats()["s3"]["hits"] == 10
    finally:
        await m3.close()
        await client.close()



async def _until(pred, timeout: float = 20.0) -> None:
    """Poll a condition (not a timing assertion: the bound only stops a hung test)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not pred():
        if loop.time() > end:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.02)


async def test_s3_down_backlog_bound_breaker_then_drain(small_valkey, nvme_dir, moto_s3) -> None:
    ts = tiering(nvme_dir=nvme_dir, s3_bucket=moto_s3.bucket, s3_endpoint_url=moto_s3.url, flush_queue_max=6,
                 s3_concurrency=2, s3_timeout_s=2.0)
    m, client = await _manager(small_valkey, ts)
    try:
        items = [chunk(i, 50_000) for i in range(16)]
        for key, value in items[:4]:
            await client.set(key, [value], ttl_s=None, timeout=5.0)
            m.note_put(key, len(value))
        assert await m.flush(30.0)
        durable_before = set(m.ledger.keys(tier="s3"))
        assert durable_before == {k for k, _ in items[:4]}

        moto_s3.stop()
        for key, value in items[4:]:
            await client.set(key, [value], ttl_s=None, timeout=5.0)
            m.note_put(key, len(value))
        await _until(lambda: m.tier("s3").breaker.state in ("open", "half_open") and not m.demoter.in_flight)
        st = m.stats()["s3"]
        assert st["backlog"] == 6, st  # grew to its bound ...
        assert st["dropped"] == 12 - 6  # ... and the overflow was counted, not silent
        assert m.tier("s3").breaker.opened_count >= 1
        # RAM hits are unaffected while the object store is down
        for key, value in items:
            assert await ram_get(client, key, len(value)) == value
        # a read from the object tier fails fast (breaker) instead of waiting
        assert set(m.ledger.keys(tier="s3")) == durable_before

        moto_s3.start()
        assert await m.flush(30.0)
        st = m.stats()["s3"]
        assert st["backlog"] == 0 and m.tier("s3").breaker.state == "closed"
        durable = set(m.ledger.keys(tier="s3"))
        assert len(durable) == 4 + 6 and durable >= durable_before
        # everything acknowledged durable is really there: read it back from S3 only
        await m.evict("ram", keys=list(durable))
        await m.evict("nvme", keys=list(durable))
        t = EmbeddedTierClient(m)
        values = dict(items)
        for key in durable:
            got, promoted = await _get_or_promote(client, t, key, len(values[key]))
            assert promoted and got == values[key]
    finally:
        await m.close()
        await client.close()



async def test_corrupt_object_is_counted_miss_and_deleted(small_valkey, moto_s3) -> None:
    ts = tiering(s3_bucket=moto_s3.bucket, s3_endpoint_url=moto_s3.url)
    m, client = await _manager(small_valkey, ts)
    try:
        key, value = chunk(3, 200_000)
        await client.set(key, [value], ttl_s=None, timeout=5.0)
        m.note_put(key, len(value))
        assert await m.flush(30.0)
        bad = bytearray(value)
        bad[codec.HEADER_SIZE + 1234] ^= 0x55
        await m.tier("s3")._client.put_object(Bucket=moto_s3.bucket, Key=m.tier("s3").object_key(key), Body=bytes(bad))
        await m.evict("ram", keys=[key])
        assert not await EmbeddedTierClient(m).promote(key, timeout=10.0)
        assert m.tier("s3").stats["corrupt"] == 1
        await _until(lambda: m.tier("s3").stats["deleted"] == 1)  # removed when the read's pin goes (async)
        assert await m.tier("s3").head(key) is None  # the bad copy is gone
        assert await m.settle(20)
        assert await client.exists_many([key, marker_of(key)], timeout=5.0) == [False, False]
        assert key not in m.ledger
    finally:
        await m.close()
        await client.close()



@pytest.mark.parametrize("tier", ["nvme", "s3"])
async def test_concurrent_promotions_read_lower_tier_once(small_valkey, nvme_dir, moto_s3, tier: str) -> None:
    kw = {"nvme_dir": nvme_dir} if tier == "nvme" else {"s3_bucket": moto_s3.bucket, "s3_endpoint_url": moto_s3.url}
    m, client = await _manager(small_valkey, tiering(**kw))
    try:
        key, value = chunk(5, 1 << 20)
        await client.set(key, [value], ttl_s=None, timeout=5.0)
        m.note_put(key, len(value))
        assert await m.flush(30.0)
        await m.evict("ram", keys=[key])
        t = EmbeddedTierClient(m)
        results = await asyncio.gather(*(t.promote(key, timeout=10.0) for _ in range(20)))
        assert all(results)
        tier_obj = m.tier("nvme") if tier == "nvme" else m.tier("s3")
        assert tier_obj.stats["reads"] == 1
        assert m.stats()["manager"]["promote_coalesced"] == 19
        assert await ram_get(client, key, len(value)) == value
    finally:
        await m.close()
        await client.close()



async def test_delete_is_coordinated_and_waits_for_pinned_reads(small_valkey, nvme_dir, moto_s3) -> None:
    import os

    ts = tiering(nvme_dir=nvme_dir, s3_bucket=moto_s3.bucket, s3_endpoint_url=moto_s3.url)
    m, client = await _manager(small_valkey, ts)
    try:
        (k1, v1), (k2, v2) = chunk(1, 100_000), chunk(2, 100_000)
        for k, v in ((k1, v1), (k2, v2)):
            await client.set(k, [v], ttl_s=None, timeout=5.0)
            m.note_put(k, len(v))
        assert await m.flush(30.0)
        path = m.tier("nvme").path_of(k1)
        parent = os.path.dirname(path)
        with m.tier("nvme").pins.pin(k1):  # an in-flight read holds the NVMe copy
            await m.delete([k1])
            # renamed out of the way at once (a newer copy may take the name), unlinked later
            assert not os.path.exists(path)
            assert [n for n in os.listdir(parent) if ".gone." in n]
            assert await client.exists_many([k1, marker_of(k1)], timeout=5.0) == [False, False]
            assert k1 not in m.ledger
        assert not [n for n in os.listdir(parent) if ".gone." in n]  # removed when the read finished
        assert await m.tier("s3").head(k1) is None
        assert not await EmbeddedTierClient(m).promote(k1, timeout=5.0)
        # a chunk deleted while its upload is queued never becomes durable
        k3, v3 = chunk(3, 100_000)
        await client.set(k3, [v3], ttl_s=None, timeout=5.0)
        m.note_put(k3, len(v3))
        await m.delete([k3])
        assert await m.flush(30.0)
        assert await m.tier("s3").head(k3) is None and k3 not in m.ledger
        assert await m.tier("s3").head(k2) is not None  # others untouched
    finally:
        await m.close()
        await client.close()



async def test_second_touch_admission_and_cost_check(small_valkey, nvme_dir) -> None:
    ts = tiering(nvme_dir=nvme_dir, admission="second_touch", recompute_budget_s=1e-6)
    m, client = await _manager(small_valkey, ts)
    try:
        (k1, v1), (k2, v2) = chunk(1, 100_000), chunk(2, 100_000)
        for k, v in ((k1, v1), (k2, v2)):
            await client.set(k, [v], ttl_s=None, timeout=5.0)
            m.note_put(k, len(v))
        assert await m.flush(10.0)
        assert len(m.ledger) == 0  # one-time chunks stay out of the lower tiers
        m.note_hit(k2)  # second touch
        assert await m.flush(10.0)
        assert m.ledger.tiers_of(k2) == ["nvme"] and k1 not in m.ledger
        assert m.stats()["manager"]["rejected"] == 2 and m.stats()["manager"]["admitted"] == 1
        # a tier slower than the recompute budget is skipped: a miss, not a slow hit
        await m.evict("ram", keys=[k2])
        assert not await EmbeddedTierClient(m).promote(k2, timeout=5.0)
        assert m.stats()["manager"]["skipped_cost"] == 1 and m.tier("nvme").stats["reads"] == 0
    finally:
        await m.close()
        await client.close()



async def test_multipart_upload_and_parallel_ranged_get(valkey_server, moto_s3) -> None:
    ts = tiering(s3_bucket=moto_s3.bucket, s3_endpoint_url=moto_s3.url, s3_multipart_threshold="5MiB",
                 s3_part_bytes="5MiB", s3_range_bytes="1MiB")
    m, client = await _manager(valkey_server, ts)
    try:
        key, value = chunk(9, 11 << 20)
        await client.set(key, [value], ttl_s=None, timeout=5.0)
        m.note_put(key, len(value))
        assert await m.flush(30.0)
        assert m.tier("s3").stats["multipart"] == 1
        await m.evict("ram", keys=[key])
        got = await m.tier("s3").read(key, len(value))
        assert got is not None and bytes(got.header) + bytes(got.payload) == value
        assert await EmbeddedTierClient(m).promote(key, timeout=20.0)
        assert await ram_get(client, key, len(value)) == value
    finally:
        await m.close()
        await client.close()



async def test_expiry_follows_the_ram_ttl(small_valkey, nvme_dir) -> None:
    m, client = await _manager(small_valkey, tiering(nvme_dir=nvme_dir))
    try:
        key, value = chunk(4, 10_000)
        await client.set(key, [value], ttl_s=0.5, timeout=5.0)
        m.note_put(key, len(value))
        assert await m.flush(10.0)
        assert m.ledger.get(key) is not None and m.ledger.get(key).expires_ms > 0
        await _until(lambda: m.ledger.get(key) is None)  # expired in the index
        assert await m.deleter.expire() == 1
        assert not m.tier("nvme").entries() and not await EmbeddedTierClient(m).promote(key, timeout=2.0)
        assert await client.exists_many([key, marker_of(key)], timeout=5.0) == [False, False]
    finally:
        await m.close()
        await client.close()



async def test_background_idle_demotion_keeps_chunks_reachable(small_valkey, nvme_dir) -> None:
    """demote_idle_s: RAM copies idle longer than the threshold move out (OBJECT IDLETIME has
    1 s resolution), markers stay, promotion brings them back; lost markers are repaired."""
    ts = tiering(nvme_dir=nvme_dir, demote_idle_s=1.0, demote_interval_s=0.2)
    client = await resp_client(small_valkey)
    m = TierManager(client.settings, ts, client)
    await m.start()  # with the background loop
    try:
        items = [chunk(i, 50_000) for i in range(3)]
        for key, value in items:
            await client.set(key, [value], ttl_s=None, timeout=5.0)
            m.note_put(key, len(value))
        assert await m.flush(10.0)
        keys = [k for k, _ in items]

        async def ram_count() -> int:
            return sum(await client.exists_many(keys, timeout=5.0))

        loop = asyncio.get_running_loop()
        end = loop.time() + 30
        while await ram_count():
            assert loop.time() < end, "idle chunks were not demoted"
            await asyncio.sleep(0.2)
        assert m.stats()["manager"]["demoted"] == 3
        assert all(await client.exists_many([marker_of(k) for k in keys], timeout=5.0))
        await client.delete([marker_of(keys[0])], timeout=5.0)  # as if Valkey evicted it
        assert await m.repair_markers() == 1
        for key, value in items:
            assert await m.promote(key, timeout=10.0)
            assert await ram_get(client, key, len(value)) == value
    finally:
        await m.close()
        await client.close()



async def test_copy_from_another_namespace_is_never_served(small_valkey, nvme_dir) -> None:
    from lmcache_valkey.keys import Namespace

    m, client = await _manager(small_valkey, tiering(nvme_dir=nvme_dir))
    try:
        other = Namespace(prefix="lmcv", tenant="t1", digest="f" * 32)
        _, foreign_value = chunk(8, 10_000, ns=other)  # header names another namespace
        key, _ = chunk(8, 10_000)
        assert await m.tier("nvme").write(key, [foreign_value])
        m.ledger.found(key, "nvme", len(foreign_value))
        assert not await m.promote(key, timeout=5.0)
        assert m.stats()["manager"]["foreign"] == 1 and key not in m.tier("nvme") and key not in m.ledger
        assert await client.exists_many([key], timeout=5.0) == [False]
    finally:
        await m.close()
        await client.close()



async def test_delete_during_promotion_never_resurrects_the_chunk(small_valkey, nvme_dir) -> None:
    import os
    import threading

    m, client = await _manager(small_valkey, tiering(nvme_dir=nvme_dir))
    try:
        key, value = chunk(6, 100_000)
        await client.set(key, [value], ttl_s=None, timeout=5.0)
        m.note_put(key, len(value))
        assert await m.flush(10.0)
        await m.evict("ram", keys=[key])
        entered, release = threading.Event(), threading.Event()
        real = m.tier("nvme")._read_file

        def slow_read(*a):
            entered.set()
            release.wait(10)
            return real(*a)

        m.tier("nvme")._read_file = slow_read
        promo = asyncio.create_task(m.promote(key, timeout=10.0))
        await asyncio.to_thread(entered.wait, 10)
        await m.delete([key])  # while the NVMe read is in flight (the copy is pinned)
        release.set()
        assert not await promo
        assert await client.exists_many([key, marker_of(key)], timeout=5.0) == [False, False]
        assert not os.path.exists(m.tier("nvme").path_of(key))
    finally:
        await m.close()
        await client.close()



async def test_expired_object_is_not_served_after_restart(small_valkey, moto_s3) -> None:
    """The listing cannot tell an object's expiry; its metadata (read with the first range) can."""
    ts = tiering(s3_bucket=moto_s3.bucket, s3_endpoint_url=moto_s3.url)
    m, client = await _manager(small_valkey, ts)
    key, value = chunk(11, 20_000)
    await client.set(key, [value], ttl_s=0.3, timeout=5.0)
    m.note_put(key, len(value))
    assert await m.flush(10.0)
    await m.close()
    await asyncio.sleep(0.5)
    m2, _ = await _manager(small_valkey, ts, client, create_bucket=False)
    try:
        assert key in m2.ledger  # rebuilt from the listing ...
        assert not await m2.promote(key, timeout=5.0)  # ... but never served
        await _until(lambda: m2.tier("s3").stats["deleted"] == 1)  # removed when the read's pin goes (async)
        assert await m2.tier("s3").head(key) is None and key not in m2.ledger
    finally:
        await m2.close()
        await client.close()



async def test_cluster_mode_promotion_and_markers(valkey_cluster, nvme_dir) -> None:
    """Valkey Cluster: data key and marker share a slot; INFO/SCAN go to every primary."""
    from lmcache_valkey.transport.resp import RespClient

    client = RespClient(valkey_cluster.settings(tenant="t1"))
    await client.start()
    m = TierManager(client.settings, tiering(nvme_dir=nvme_dir), client)
    await m.start(background=False)
    try:
        items = [chunk(i, 30_000) for i in range(12)]
        for key, value in items:
            await client.set(key, [value], ttl_s=None, timeout=5.0)
            m.note_put(key, len(value))
        assert await m.flush(10.0)
        keys = [k for k, _ in items]
        assert await m.evict("ram", prefix=b"lmcv:t1:") == 12  # SCAN over every primary
        assert all(await client.exists_many([marker_of(k) for k in keys], timeout=5.0))
        await m.demote_once()  # INFO memory from every primary
        for key, value in items:
            assert await m.promote(key, timeout=10.0)
            assert await ram_get(client, key, len(value)) == value
    finally:
        await m.close()
        await client.close()

