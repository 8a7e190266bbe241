"""Tiering under faults (docs/tiering-*.md): deletes while the object store is down or
slow, late hints, expiry after restart, failing uploads, memory pressure, service-mode
deletes, stale markers, other format versions, a shared NVMe directory. Real Valkey, real
O_DIRECT directory, moto S3 (through a proxy that can stall it)."""

from __future__ import annotations

import asyncio
import os
import time

import pytest
from tierhelp import NS, StallProxy, chunk, ram_get, resp_client, tiering

from lmcache_valkey import codec
from lmcache_valkey.tiering import EmbeddedTierClient, RemoteTierClient, TierManager, protocol
from lmcache_valkey.tiering.markers import marker_of
from lmcache_valkey.tiering.object_store import ObjectTier
from lmcache_valkey.tiering.service import RequestServer

pytestmark = pytest.mark.timeout(120)


async def _bucket(ts) -> None:
    o = ObjectTier(ts)
    await o.start()
    await o.create_bucket()
    await o.close()


async def _manager(valkey, ts, client=None, *, create_bucket=True, background=False):
    client = client or await resp_client(valkey)
    if create_bucket and ts.s3_bucket:
        await _bucket(ts)
    m = TierManager(client.settings, ts, client)
    await m.start(background=background)
    return m, client


async def _until(pred, timeout: float = 20.0) -> None:
    """Poll a condition (the bound only stops a hung test)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not pred():
        if loop.time() > end:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.02)


async def _put_tiered(m, client, key, value, ttl_s=None) -> None:
    await client.set(key, [value], ttl_s=ttl_s, timeout=5.0)
    m.note_put(key, len(value))
    assert await m.flush(20.0)


def _s3(moto_s3, **kw):
    return tiering(s3_bucket=moto_s3.bucket, s3_endpoint_url=moto_s3.url, **kw)


# --- deletes while the object store is down or black-holed ----------------------------
async def test_delete_while_s3_down_is_never_served_after_restart(small_valkey, moto_s3) -> None:
    ts = _s3(moto_s3)
    m, client = await _manager(small_valkey, ts)
    key, value = chunk(14, 20_000)
    keep, kvalue = chunk(15, 20_000)
    await _put_tiered(m, client, key, value)
    await _put_tiered(m, client, keep, kvalue)
    moto_s3.stop()
    await m.delete([key])
    assert key not in m.ledger and m.stats()["manager"]["s3_deletes_pending"] == 1
    await m.close()
    moto_s3.start()
    m2, _ = await _manager(small_valkey, ts, client, create_bucket=False)
    try:
        assert key not in m2.ledger and keep in m2.ledger  # the recorded intent wins over the listing
        assert not await m2.promote(key, timeout=5.0)
        assert await m2.deleter.retry() == 1  # the background deleter finishes the job
        assert await m2.tier("s3").head(key) is None and await m2.tier("s3").head(keep) is not None
        assert await client.command(b"HLEN", protocol.delete_key("lmcv", "t1"), timeout=5.0) == 0
    finally:
        await m2.close()
        await client.close()



async def test_listing_that_fails_at_start_is_retried(small_valkey, moto_s3) -> None:
    ts = _s3(moto_s3)
    m, client = await _manager(small_valkey, ts)
    key, value = chunk(16, 20_000)
    await _put_tiered(m, client, key, value)
    await m.close()
    await client.command(b"FLUSHALL", timeout=5.0)
    moto_s3.stop()
    m2, _ = await _manager(small_valkey, ts, client, create_bucket=False)
    try:
        assert key not in m2.ledger  # listing failed
        moto_s3.start()
        assert await m2.rebuild_index("s3")
        assert m2.ledger.tiers_of(key) == ["s3"]
        await m2.delete([key])  # an S3 DELETE goes out whatever the index said before
        assert await m2.tier("s3").head(key) is None
    finally:
        await m2.close()
        await client.close()



async def test_black_holed_object_store_does_not_hold_up_delete_or_expiry(small_valkey, nvme_dir, moto_s3) -> None:
    proxy = StallProxy(moto_s3.port)
    url = await proxy.start()
    ts = tiering(nvme_dir=nvme_dir, s3_bucket=moto_s3.bucket, s3_endpoint_url=url, s3_timeout_s=60.0)
    m, client = await _manager(small_valkey, ts)
    try:
        (k1, v1), (k2, v2) = chunk(1, 20_000), chunk(2, 20_000)
        await _put_tiered(m, client, k1, v1)
        await _put_tiered(m, client, k2, v2, ttl_s=0.3)
        proxy.stall = True
        # bounded by its own deadline, not by the store's 60 s timeout
        await asyncio.wait_for(m.delete([k1], timeout=0.3), 20)
        assert await client.exists_many([k1, marker_of(k1)], timeout=5.0) == [False, False]
        assert k1 not in m.ledger and k1 not in m.tier("nvme") and k1 in m.ledger.doomed("s3")
        await _until(lambda: m.ledger.get(k2) is None)
        assert await asyncio.wait_for(m.deleter.expire(), 20) == 1  # hands the object delete over
        assert k2 not in m.tier("nvme") and k2 in m.ledger.doomed("s3")
        proxy.stall = False
        assert await m.settle(60)
        await m.deleter.retry()
        assert not m.ledger.doomed("s3") and await m.tier("s3").head(k1) is None and await m.tier("s3").head(k2) is None
    finally:
        proxy.stall = False
        await m.close()
        await client.close()
        await proxy.close()



# --- a late put hint -----------------------------------------------------------------------
async def test_late_put_hint_never_resurrects_a_deleted_chunk(small_valkey, moto_s3) -> None:
    m, client = await _manager(small_valkey, _s3(moto_s3))
    try:
        key, value = chunk(13, 20_000)
        await client.set(key, [value], ttl_s=None, timeout=5.0)
        moto_s3.stop()  # the upload stays queued
        m.note_put(key, len(value))
        await _until(lambda: m.ledger.state(key, "s3") == "writing")
        await m.delete([key])
        m.note_put(key, len(value))  # a hint batched before the delete arrives after it
        moto_s3.start()
        assert await m.flush(30.0)
        assert await m.settle(20)
        assert key not in m.ledger and not await m.promote(key, timeout=5.0)
        assert await m.tier("s3").head(key) is None
        assert await client.exists_many([marker_of(key)], timeout=5.0) == [False]
        # a real put after the delete is tiered again
        await _put_tiered(m, client, key, value)
        assert m.ledger.tiers_of(key) == ["s3"]
    finally:
        await m.close()
        await client.close()



# --- expiry of object copies after a restart ------------------------------------------------
async def test_object_copy_keeps_its_expiry_after_restart(small_valkey, moto_s3) -> None:
    ts = _s3(moto_s3)
    m, client = await _manager(small_valkey, ts)
    key, value = chunk(12, 20_000)
    k2, v2 = chunk(13, 20_000)
    await _put_tiered(m, client, key, value, ttl_s=30.0)
    await _put_tiered(m, client, k2, v2, ttl_s=30.0)
    await m.close()
    await client.delete([key, k2], timeout=5.0)
    m2, _ = await _manager(small_valkey, ts, client, create_bucket=False)
    try:
        # a promotion takes the expiry the copy records (the listing could not tell it)
        assert await m2.promote(key, timeout=5.0)
        pttl = await client.command(b"PTTL", key, key=key, timeout=5.0)
        assert 0 < pttl <= 30_000  # staged with the chunk's remaining TTL, not forever
        assert 0 < m2.ledger.get(key).expires_ms
        # the background pass learns it for the others (HEAD: lmcv-exp)
        assert await m2.deleter.learn_expiry() == 1
        assert 0 < m2.ledger.get(k2).expires_ms
        assert await m2.settle(20)
        for k in (key, k2):
            assert 0 < await client.command(b"PTTL", marker_of(k), key=marker_of(k), timeout=5.0) <= 30_000
    finally:
        await m2.close()
        await client.close()



# --- failing uploads ----------------------------------------------------------------------
async def test_permanently_refused_upload_is_dropped_and_not_fed_to_the_breaker(small_valkey, moto_s3) -> None:
    ts = tiering(s3_bucket="lmcv-no-such-bucket", s3_endpoint_url=moto_s3.url, breaker_failures=1)
    m, client = await _manager(small_valkey, ts, create_bucket=False)
    try:
        key, value = chunk(1, 20_000)
        await _put_tiered(m, client, key, value)  # NoSuchBucket (404): flush returns
        st = m.tier("s3").stats
        assert st["rejected"] == 1 and st["dropped"] == 1 and st["retries"] == 0
        assert m.tier("s3").breaker.state == "closed" and key not in m.ledger
    finally:
        await m.close()
        await client.close()



async def test_upload_that_keeps_failing_gives_up_after_max_retries(small_valkey, moto_s3) -> None:
    from botocore.exceptions import ClientError

    m, client = await _manager(small_valkey, _s3(moto_s3, s3_max_retries=2, breaker_failures=50))
    bad, vbad = chunk(1, 20_000)
    good, vgood = chunk(2, 20_000)
    real = m.tier("s3")._client.put_object

    async def flaky(**kw):
        if kw["Key"] == m.tier("s3").object_key(bad):
            raise ClientError({"Error": {"Code": "InternalError"}, "ResponseMetadata": {"HTTPStatusCode": 500}},
                              "PutObject")
        return await real(**kw)

    m.tier("s3")._client.put_object = flaky
    try:
        for k, v in ((bad, vbad), (good, vgood)):
            await client.set(k, [v], ttl_s=None, timeout=5.0)
            m.note_put(k, len(v))
        assert await m.flush(30.0)  # not wedged
        st = m.tier("s3").stats
        assert st["gave_up"] == 1 and st["retries"] == 2 and st["dropped"] == 1
        assert m.ledger.tiers_of(good) == ["s3"] and bad not in m.ledger
    finally:
        await m.close()
        await client.close()



# --- promotion under memory pressure ------------------------------------------------------
async def test_promotion_under_memory_pressure_never_scans_inline(small_valkey, nvme_dir) -> None:
    ts = tiering(nvme_dir=nvme_dir, demote_high_watermark=0.02, demote_low_watermark=0.01)
    m, client = await _manager(small_valkey, ts)
    try:
        items = [chunk(i, 100_000) for i in range(6)]
        for k, v in items:
            await _put_tiered(m, client, k, v)
        scans = 0
        real = m.demoter.candidates

        async def counted():
            nonlocal scans
            scans += 1
            return await real()

        m.demoter.candidates = counted
        key, value = items[0]
        await m.evict("ram", keys=[key])
        assert await m.promote(key, timeout=10.0)
        assert scans == 0 and m.stats()["manager"]["demote_wakeups"] == 1 and m.demoter.wake.is_set()
        assert await ram_get(client, key, len(value)) == value
        await m.demote_once()  # the demotion pass does the freeing, once
        assert scans == 1 and m.stats()["manager"]["demoted"] > 0
    finally:
        await m.close()
        await client.close()



# --- service mode without tierd --------------------------------------------------------
async def test_store_delete_removes_ram_and_marker_without_tierd(small_valkey) -> None:
    from dataclasses import replace

    from lmcache_valkey.store import ChunkStore

    client = await resp_client(small_valkey)
    settings = replace(client.settings, op_timeout_s=0.5)
    tc = RemoteTierClient(client, settings)
    store = ChunkStore(settings, NS, client, tiers=tc)
    try:
        key, value = chunk(3, 10_000)
        await client.set(key, [value], ttl_s=None, timeout=5.0)
        await client.command(b"SET", marker_of(key), b"n", key=marker_of(key), timeout=5.0)
        assert await store.delete([f"{3:032x}"]) == 1  # nobody serves the request list
        assert await client.exists_many([key, marker_of(key)], timeout=5.0) == [False, False]
        # the intent waits in Valkey for tierd
        assert await client.command(b"HEXISTS", protocol.delete_key("lmcv", "t1"), key, timeout=5.0) == 1
    finally:
        await tc.close()
        await store.close()



async def test_request_list_is_bounded_while_tierd_is_down(small_valkey, monkeypatch) -> None:
    monkeypatch.setattr(protocol, "REQUEST_MAX", 5)

    client = await resp_client(small_valkey)
    tc = RemoteTierClient(client, client.settings)
    try:
        for i in range(12):
            await tc.note_hit(chunk(i, 1000)[0])
            await tc.flush_hints()
        req = protocol.request_key("lmcv", "t1")
        assert await client.command(b"LLEN", req, key=req, timeout=5.0) == 5
        assert tc.stats["requests_trimmed"] == 7
    finally:
        await tc.close()
        await client.close()



# --- bounded request handling, byte-bounded write-behind ------------------------------
async def test_requests_handled_at_most_serve_max_at_once(small_valkey, nvme_dir, monkeypatch) -> None:
    m, client = await _manager(small_valkey, tiering(nvme_dir=nvme_dir, request_block_s=0.1))
    server = RequestServer(m, max_at_once=4)
    running = peak = 0
    real = server.handle

    async def slow(raw):
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.05)
        running -= 1
        await real(raw)

    server.handle = slow
    req = protocol.request_key("lmcv", "t1")
    for i in range(20):
        await client.command(b"RPUSH", req, protocol.pack({"op": "hint", "hit": [chunk(i, 100)[0]]}), key=req,
                             timeout=5.0)
    stop = asyncio.Event()
    serve = asyncio.create_task(server.serve(stop))
    try:
        await _until(lambda: m.counters["requests"] == 20)
        assert peak == 4
    finally:
        stop.set()
        await asyncio.wait_for(serve, 10)
        await m.close()
        await client.close()



async def test_write_behind_queue_is_bounded_in_bytes(small_valkey, moto_s3) -> None:
    m, client = await _manager(small_valkey, _s3(moto_s3, flush_queue_max_bytes=100_000))
    try:
        moto_s3.stop()
        items = [chunk(i, 40_000) for i in range(5)]
        for k, v in items:
            await client.set(k, [v], ttl_s=None, timeout=5.0)
            m.note_put(k, len(v))
        await _until(lambda: not m.demoter.in_flight)
        assert m.tier("s3").backlog == 2 and m.tier("s3").backlog_bytes <= 100_000 and m.tier("s3").stats["dropped"] == 3
        moto_s3.start()
        assert await m.flush(30.0) and m.tier("s3").backlog_bytes == 0
    finally:
        await m.close()
        await client.close()



# --- stale markers ------------------------------------------------------------------------
async def test_marker_write_racing_a_delete_and_stray_markers_are_removed(small_valkey, nvme_dir) -> None:
    m, client = await _manager(small_valkey, tiering(nvme_dir=nvme_dir))
    try:
        key, value = chunk(1, 10_000)
        await _put_tiered(m, client, key, value)
        t = asyncio.create_task(m.markers.sync([key]))
        await asyncio.sleep(0)  # its SET is on the wire
        m.ledger.lost(key, "nvme")  # ... when the chunk goes
        await t
        assert await client.exists_many([marker_of(key)], timeout=5.0) == [False]
        # a marker tierd wrote that no tier backs any more (left by a crash, or another race)
        # goes at the repair pass: found in tierd's own index of markers, never by SCAN
        other, _ = chunk(2, 10_000)
        await m.markers.index.add([other])
        await client.command(b"SET", marker_of(other), b"s", key=marker_of(other), timeout=5.0)
        k3, v3 = chunk(3, 10_000)
        await _put_tiered(m, client, k3, v3)
        await m.repair_markers()
        assert await client.exists_many([marker_of(other), marker_of(k3)], timeout=5.0) == [False, True]
        assert m.stats()["manager"]["stale_markers_removed"] == 1
    finally:
        await m.close()
        await client.close()



# --- copies of another format version -----------------------------------------------------
async def test_copies_of_another_format_version_are_misses_but_kept(small_valkey, nvme_dir, moto_s3) -> None:
    import struct

    ts = tiering(nvme_dir=nvme_dir, s3_bucket=moto_s3.bucket, s3_endpoint_url=moto_s3.url)
    m, client = await _manager(small_valkey, ts)
    key, value = chunk(1, 20_000)
    await _put_tiered(m, client, key, value)
    await m.evict("ram", keys=[key])
    newer = bytearray(value)
    struct.pack_into("<H", newer, 4, codec.VERSION + 1)  # a newer writer's header
    okey = m.tier("s3").object_key(key)
    await m.tier("s3")._client.put_object(Bucket=moto_s3.bucket, Key=okey, Body=bytes(newer))
    await m.evict("nvme", keys=[key])
    try:
        assert not await m.promote(key, timeout=5.0)
        assert m.tier("s3").stats["format_misses"] == 1 and m.tier("s3").stats["corrupt"] == 0
        assert await m.settle(20)
        assert await m.tier("s3").head(key) is not None  # kept for the other version's readers
    finally:
        await m.close()
    # NVMe: a file whose tier record has another version survives a restart, unindexed
    path = m.tier("nvme").path_of(key)
    m2 = TierManager(client.settings, tiering(nvme_dir=nvme_dir), client)
    await m2.start(background=False)
    assert await m2.tier("nvme").write(key, [value])
    await m2.close()
    with open(path, "r+b") as f:
        f.seek(codec.HEADER_SIZE + 4)
        f.write(struct.pack("<H", 99))
    m3 = TierManager(client.settings, tiering(nvme_dir=nvme_dir), client)
    await m3.start(background=False)
    try:
        assert key not in m3.ledger and os.path.exists(path) and m3.tier("nvme").stats["format_skipped"] == 1
    finally:
        await m3.close()
        await client.close()



# --- a cancelled half-open probe --------------------------------------------------------
async def test_cancelled_half_open_probe_does_not_stick_the_breaker(small_valkey, moto_s3) -> None:
    proxy = StallProxy(moto_s3.port)
    url = await proxy.start()
    ts = tiering(s3_bucket=moto_s3.bucket, s3_endpoint_url=url, breaker_failures=1, breaker_reset_s=0.05)
    m, client = await _manager(small_valkey, ts)
    try:
        key, value = chunk(1, 20_000)
        await _put_tiered(m, client, key, value)
        m.tier("s3").breaker.failure()  # open
        await _until(lambda: m.tier("s3").breaker.state == "half_open")
        proxy.stall = True
        probe = asyncio.create_task(m.tier("s3").read(key, len(value)))
        await _until(lambda: m.tier("s3").breaker.probing)
        probe.cancel()
        await asyncio.gather(probe, return_exceptions=True)
        proxy.stall = False
        assert m.tier("s3").breaker.allow()  # the next request may probe
    finally:
        proxy.stall = False
        await m.close()
        await client.close()
        await proxy.close()



# --- a chunk expiring during its copy; reply lists; close ------------------------------
async def test_chunk_that_expires_during_its_copy_is_not_copied_without_expiry(small_valkey, nvme_dir) -> None:
    m, client = await _manager(small_valkey, tiering(nvme_dir=nvme_dir))
    key, value = chunk(1, 10_000)
    real = client.command

    async def expiring(*args, **kw):
        if args[:2] == (b"PTTL", key):
            return -2  # the key expired between the two reads
        return await real(*args, **kw)

    client.command = expiring
    try:
        await _put_tiered(m, client, key, value, ttl_s=30.0)
        e = m.ledger.get(key)
        assert e is None or e.expires_ms > 0  # never "no expiry" for an expiring chunk
    finally:
        client.command = real
        await m.close()
        await client.close()



async def test_reply_list_never_exists_without_its_ttl(small_valkey, nvme_dir) -> None:
    from lmcache_valkey.errors import ConnectionLost

    m, client = await _manager(small_valkey, tiering(nvme_dir=nvme_dir))
    real = client.command

    async def lossy(*args, **kw):
        if args[:1] == (b"PEXPIRE",):
            raise ConnectionLost("connection lost between RPUSH and PEXPIRE")
        return await real(*args, **kw)

    client.command = lossy
    try:
        rep = protocol.reply_key("lmcv", "t1", "w1")
        await RequestServer(m).handle(protocol.pack({"op": "stats", "id": 1, "reply": rep, "ttl_ms": 5000}))
        assert await real(b"LLEN", rep, key=rep, timeout=5.0) == 1
        assert await real(b"PTTL", rep, key=rep, timeout=5.0) > 0
    finally:
        client.command = real
        await m.close()
        await client.close()



async def test_close_stops_copies_past_the_drain_deadline(small_valkey, nvme_dir) -> None:
    import threading

    m, client = await _manager(small_valkey, tiering(nvme_dir=nvme_dir))
    entered, release = threading.Event(), threading.Event()
    real = m.tier("nvme")._write_file

    def stuck(*a):
        entered.set()
        release.wait(30)
        return real(*a)

    m.tier("nvme")._write_file = stuck
    key, value = chunk(1, 10_000)
    await client.set(key, [value], ttl_s=None, timeout=5.0)
    m.note_put(key, len(value))
    assert m.demoter.copying(key)
    await asyncio.to_thread(entered.wait, 10)
    timer = threading.Timer(1.0, release.set)  # lets the disk thread finish eventually
    timer.start()
    try:
        await m.close(drain_timeout=0.1)
        assert not m.demoter.in_flight  # cancelled, not left running after close
    finally:
        release.set()
        timer.cancel()
        await client.close()



# --- a deferred delete never destroys a newer object --------------------------------------
async def test_deferred_delete_of_a_bad_object_keeps_a_newer_one(small_valkey, moto_s3) -> None:
    m, client = await _manager(small_valkey, _s3(moto_s3))
    try:
        key, value = chunk(3, 50_000)
        await _put_tiered(m, client, key, value)
        bad = bytearray(value)
        bad[codec.HEADER_SIZE + 7] ^= 0x55
        okey = m.tier("s3").object_key(key)
        await m.tier("s3")._client.put_object(Bucket=moto_s3.bucket, Key=okey, Body=bytes(bad))
        with m.tier("s3").pins.pin(key):  # another read holds the object: the removal waits for it
            assert await m.tier("s3").read(key, len(value)) is None
            assert m.tier("s3").stats["corrupt"] == 1
            # meanwhile a writer stores a good copy again
            await m.tier("s3")._client.put_object(Bucket=moto_s3.bucket, Key=okey, Body=value)
        await _until(lambda: m.tier("s3").stats["deleted"] + m.tier("s3").stats.get("delete_skipped_newer", 0) >= 1)
        assert await m.tier("s3").head(key) == len(value)  # the newer object survived
        assert m.tier("s3").stats["delete_skipped_newer"] == 1
    finally:
        await m.close()
        await client.close()



async def test_background_deleter_never_holds_up_the_demotion_loop(small_valkey, moto_s3) -> None:
    proxy = StallProxy(moto_s3.port)
    url = await proxy.start()
    ts = tiering(s3_bucket=moto_s3.bucket, s3_endpoint_url=url, s3_timeout_s=60.0, demote_interval_s=0.05)
    m, client = await _manager(small_valkey, ts, background=True)
    passes = 0
    real = m.demote_once

    async def counted():
        nonlocal passes
        passes += 1
        return await real()

    m.demote_once = counted
    try:
        key, value = chunk(1, 20_000)
        await _put_tiered(m, client, key, value)
        proxy.stall = True
        await m.delete([key], timeout=0.2)  # its object DELETE hangs in the store
        seen = passes
        await _until(lambda: passes >= seen + 5)  # the loop keeps turning meanwhile
        assert key in m.ledger.doomed("s3")
        proxy.stall = False
        await _until(lambda: not m.ledger.doomed("s3"), 60)
        assert await m.tier("s3").head(key) is None
    finally:
        proxy.stall = False
        await m.close()
        await client.close()
        await proxy.close()



# --- a black hole is an outage, not a slow tier ------------------------------------------------
async def test_promotion_from_s3_works_again_as_soon_as_a_black_hole_ends(small_valkey, moto_s3) -> None:
    """A read that ended in a timeout says the store did not answer, not how fast it is: once
    the store answers again, the next promotion reads it (no 30 s probe wait, no minutes of
    misses while a cost estimate poisoned by the timeout decays)."""
    proxy = StallProxy(moto_s3.port)
    url = await proxy.start()
    ts = tiering(s3_bucket=moto_s3.bucket, s3_endpoint_url=url, s3_timeout_s=3.0, recompute_budget_s=0.5)
    m, client = await _manager(small_valkey, ts)
    try:
        key, value = chunk(1, 20_000)
        await _put_tiered(m, client, key, value)
        await m.evict("ram", keys=[key])
        proxy.stall = True  # a black hole: connections accepted, nothing answered
        assert not await m.promote(key, timeout=10.0)  # the read times out: a miss
        assert m.tier("s3").breaker.state == "closed"  # one failure: not an open breaker yet
        proxy.stall = False
        assert await m.promote(key, timeout=10.0)  # the store answers again: read at once
        assert await ram_get(client, key, len(value)) == value
        assert m.stats()["manager"]["skipped_cost"] == 0
    finally:
        proxy.stall = False
        await m.close()
        await client.close()
        await proxy.close()



async def test_after_a_sustained_black_hole_that_opened_the_breaker_promotion_is_back_within_seconds(
        small_valkey, moto_s3) -> None:
    """Many reads in a row time out (the breaker opens, and while it is open S3 is not even
    tried); once the store answers again, the breaker's half-open probe lets the next
    promotion through after ``breaker_reset_s``, and the timeouts left no poisoned cost
    estimate behind (it used to take ~3 minutes of misses)."""
    proxy = StallProxy(moto_s3.port)
    url = await proxy.start()
    ts = tiering(s3_bucket=moto_s3.bucket, s3_endpoint_url=url, s3_timeout_s=0.3, recompute_budget_s=0.5,
                 breaker_failures=2, breaker_reset_s=1.0)
    m, client = await _manager(small_valkey, ts)
    try:
        key, value = chunk(2, 20_000)
        await _put_tiered(m, client, key, value)
        await m.evict("ram", keys=[key])
        proxy.stall = True
        for _ in range(6):  # a sustained outage: every read a timeout, then refused by the open breaker
            assert not await m.promote(key, timeout=2.0)
        assert m.tier("s3").breaker.state == "open"
        proxy.stall = False
        attempts = 0
        while not await m.promote(key, timeout=2.0):  # a few tries: the breaker's reset, not minutes
            attempts += 1
            assert attempts < 40, "S3-only chunk still missing after the store answered again"
            await asyncio.sleep(0.25)
        assert await ram_get(client, key, len(value)) == value
        assert m.tier("s3").breaker.state == "closed"
    finally:
        proxy.stall = False
        await m.close()
        await client.close()
        await proxy.close()


# --- a promoted chunk waits for its reader -------------------------------------------------
async def test_a_chunk_promoted_for_a_worker_stays_in_ram_until_it_is_read(small_valkey, nvme_dir) -> None:
    """Under memory pressure the demotion pass removes every RAM copy a lower tier holds; the
    one just promoted for a waiting worker stays until that worker read it (its hit hint) or
    ``promote_hold_s`` passed."""
    ts = tiering(nvme_dir=nvme_dir, demote_high_watermark=0.02, demote_low_watermark=0.01, promote_hold_s=1.0)
    m, client = await _manager(small_valkey, ts)
    tiers = EmbeddedTierClient(m)
    try:
        items = [chunk(i, 100_000) for i in range(6)]
        for k, v in items:
            await _put_tiered(m, client, k, v)
        (key, value), (other, _) = items[0], items[1]
        await m.evict("ram", keys=[key, other])
        assert await tiers.promote(key, timeout=10.0) and await tiers.promote(other, timeout=10.0)
        assert await m.demote_once() == 4  # the pass runs before the workers read: the others go
        assert await ram_get(client, key, len(value)) == value  # the worker's read hits
        await tiers.note_hit(key)  # ... and says so (the store sends it after every hit)
        assert await m.demote_once() == 1  # read: it may go now; `other` is still awaited
        assert await client.exists_many([key, other], timeout=5.0) == [False, True]
        await _until(lambda: not m.ledger.held(other, time.monotonic())[1])
        assert await m.demote_once() == 1  # nobody read it within promote_hold_s: it goes too
    finally:
        await m.close()
        await client.close()



# --- after a black hole, every S3-only chunk, asked for during it or not (issue 28) -----------
async def test_s3_only_chunks_nobody_asked_for_during_a_black_hole_are_served_once_it_lifts(
        small_valkey, moto_s3) -> None:
    """Reads that a worker started during a black hole wait it out and are answered when it
    lifts: timed as very slow reads, they pushed the cost estimate past the budget, and every
    other S3-only chunk was skipped ("deadline") until a probe every 30 s had worn it down.
    Once the store answers, the chunks nobody asked for come back as well."""
    proxy = StallProxy(moto_s3.port)
    url = await proxy.start()
    ts = tiering(s3_bucket=moto_s3.bucket, s3_endpoint_url=url, recompute_budget_s=0.5,
                 breaker_failures=5, breaker_reset_s=5.0)  # s3_timeout_s: 30 s, longer than the outage
    m, client = await _manager(small_valkey, ts)
    try:
        items = [chunk(i, 20_000) for i in range(10)]
        for k, v in items:
            await _put_tiered(m, client, k, v)
        await m.evict("ram", keys=[k for k, _ in items])  # S3-only now
        asked, others = items[:2], items[2:]
        proxy.stall = True
        for k, _ in asked:  # workers ask: misses at their deadline, the reads stay in flight
            assert not await m.promote(k, timeout=0.5)
        await asyncio.sleep(3.0)  # the outage goes on (the reads wait it out)
        assert m.tier("s3").stats["hits"] == 0
        proxy.stall = False
        await _until(lambda: m.tier("s3").stats["hits"] == len(asked))  # answered when it lifted
        for k, v in asked:
            assert await ram_get(client, k, len(v)) == v
        pending = dict(others)
        loop = asyncio.get_running_loop()
        end = loop.time() + 20.0  # the bound only stops a hung test (it used to take minutes)
        while pending and loop.time() < end:
            for k in list(pending):
                if await m.promote(k, timeout=0.5):
                    assert await ram_get(client, k, len(pending[k])) == pending.pop(k)
            await asyncio.sleep(0.1)
        assert not pending, f"{len(pending)} of {len(others)} S3-only chunks nobody asked for still missing"
    finally:
        proxy.stall = False
        await m.close()
        await client.close()
        await proxy.close()


async def test_drain_during_an_outage_reports_the_uploads_it_could_not_flush(small_valkey, moto_s3) -> None:
    """Uploads that fail through an outage are given up after ``s3_max_retries``: the backlog
    empties, and `drain` used to say "drained" although none reached the store. It reports
    them (each once), and the CLI exits non-zero."""
    from lmcache_valkey.tiering.tierd import drain

    proxy = StallProxy(moto_s3.port)
    url = await proxy.start()
    ts = tiering(s3_bucket=moto_s3.bucket, s3_endpoint_url=url, s3_timeout_s=0.3, s3_max_retries=1,
                 breaker_failures=1000)  # the breaker stays closed: the uploads are given up
    m, client = await _manager(small_valkey, ts)
    try:
        proxy.stall = True
        items = [chunk(i, 20_000) for i in range(3)]
        for k, v in items:
            await client.set(k, [v], ttl_s=None, timeout=5.0)
            m.note_put(k, len(v))
        report = await drain(m, timeout=30.0)
        assert m.tier("s3").stats["gave_up"] == len(items)  # the backlog is empty ...
        assert not report and report.dropped == len(items) and report.backlog == 0  # ... but nothing flushed
        assert report.tiers["s3"]["dropped"] == len(items)
        assert "3 chunk(s) dropped" in report.describe(30.0)
        proxy.stall = False
        assert await drain(m, timeout=30.0)  # each drop is reported once; nothing is left
        assert all(m.ledger.state(k, "s3") == "absent" for k, _ in items)
    finally:
        proxy.stall = False
        await m.close()
        await client.close()
        await proxy.close()
