"""tierd placement: workers promote and send hints through Valkey lists; CLI controls
(stats, evict per tier, drain) reach tierd the same way; restart rebuilds the index."""

from __future__ import annotations

import argparse
import asyncio
import urllib.request

import pytest
from tierhelp import NS, _free_port, chunk, ram_get, resp_client

from lmcache_valkey.tiering import RemoteTierClient
from lmcache_valkey.tiering.markers import marker_of
from lmcache_valkey.tiering.tierd import add_tierd_arguments, drain, evict, run_tierd, tier_stats

pytestmark = pytest.mark.timeout(120)


def _args(valkey, nvme_dir, moto_s3, metrics_port=None) -> argparse.Namespace:
    argv = ["--valkey-url", valkey.url, "--tenant", "t1", "--nvme-dir", nvme_dir, "--nvme-budget-bytes", "64MiB",
            "--s3-bucket", moto_s3.bucket, "--s3-endpoint-url", moto_s3.url, "--admission", "always",
            "--drain-timeout-s", "20", "--set", "request_block_s=0.2", "--set", "demote_interval_s=3600"]
    if metrics_port:
        argv += ["--metrics-port", str(metrics_port)]
    return add_tierd_arguments(argparse.ArgumentParser()).parse_args(argv)


async def _start_tierd(args):
    ready, stop = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(run_tierd(args, ready=ready, stop=stop))
    waiter = asyncio.create_task(ready.wait())
    done, _ = await asyncio.wait({task, waiter}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        task.result()  # raises the start-up error
    assert waiter in done
    return task, stop


async def test_tierd_promotion_controls_and_restart(small_valkey, nvme_dir, moto_s3) -> None:
    from lmcache_valkey.tiering.object_store import ObjectTier
    from lmcache_valkey.tiering.settings import tiering_settings_from_mapping

    o = ObjectTier(tiering_settings_from_mapping({"s3_bucket": moto_s3.bucket, "s3_endpoint_url": moto_s3.url}))
    await o.start()
    await o.create_bucket()
    await o.close()

    port = _free_port()
    task, stop = await _start_tierd(_args(small_valkey, nvme_dir, moto_s3, port))
    client = await resp_client(small_valkey)
    tc = RemoteTierClient(client, client.settings)
    items = [chunk(i, 300_000) for i in range(6)]
    try:
        for key, value in items:
            await client.set(key, [value], ttl_s=None, timeout=5.0)
            await tc.note_put(key, len(value))
        await tc.flush_hints()
        assert await drain(tc, timeout=30)
        st = await tier_stats(tc)
        assert st["index"]["nvme"]["chunks"] == 6 and st["index"]["s3"]["chunks"] == 6
        assert st["s3"]["backlog"] == 0 and st["nvme"]["direct_io"] is True
        # /metrics and /healthz are served
        body = await asyncio.to_thread(lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz").read())
        assert body.startswith(b"ok")
        metrics = await asyncio.to_thread(lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read())
        assert b"lmcache_valkey_" in metrics

        # the CLI removes the faster copies: RAM, then NVMe, for the whole namespace
        assert await evict(tc, "ram", namespace=NS.digest, tenant="t1") == 6
        assert await evict(tc, "nvme", namespace=NS.digest, tenant="t1") == 6
        markers = await client.exists_many([marker_of(k) for k, _ in items], timeout=5.0)
        assert all(markers)  # the object copy still makes them visible to lookups
        for key, value in items:
            assert await ram_get(client, key, len(value)) is None
            assert await tc.promote(key, timeout=10.0)
            assert await ram_get(client, key, len(value)) == value
        st = await tier_stats(tc)
        assert st["s3"]["hits"] == 6 and st["manager"]["promotions"] == 6
        # a chunk nobody has is a miss, quickly
        assert not await tc.promote(NS.data_key("f" * 32), timeout=5.0)
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 30) == 0
    # tierd restarted (and Valkey's RAM copies gone): index rebuilt, hits continue
    await client.command(b"FLUSHALL", timeout=5.0)
    task, stop = await _start_tierd(_args(small_valkey, nvme_dir, moto_s3))
    try:
        st = await tier_stats(tc)
        assert st["index"]["s3"]["chunks"] == 6 and st["index"]["nvme"]["chunks"] == 6  # S3 hits were re-cached
        for key, value in items:
            assert await tc.promote(key, timeout=10.0)
            assert await ram_get(client, key, len(value)) == value
        assert (await tier_stats(tc))["nvme"]["hits"] == 6
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 30) == 0
        await tc.close()
        await client.close()



async def test_promote_respects_deadline_when_tierd_is_absent(small_valkey) -> None:
    client = await resp_client(small_valkey)
    tc = RemoteTierClient(client, client.settings)
    try:
        key, _ = chunk(1, 1000)
        assert not await tc.promote(key, timeout=0.3)  # nobody serves the list: a miss at the deadline
        assert tc.stats["promote_miss"] == 1
    finally:
        await tc.close()
        await client.close()



async def test_tierd_re_creates_a_marker_a_worker_lookup_missed(small_valkey, nvme_dir, moto_s3) -> None:
    """Service placement: the worker's lookup that misses a chunk tierd holds (its marker
    evicted) reports it in its hints, and tierd puts the marker back."""
    from lmcache_valkey.store import ChunkStore
    from lmcache_valkey.tiering.object_store import ObjectTier
    from lmcache_valkey.tiering.settings import tiering_settings_from_mapping

    o = ObjectTier(tiering_settings_from_mapping({"s3_bucket": moto_s3.bucket, "s3_endpoint_url": moto_s3.url}))
    await o.start()
    await o.create_bucket()
    await o.close()
    task, stop = await _start_tierd(_args(small_valkey, nvme_dir, moto_s3))
    client = await resp_client(small_valkey)
    tc = RemoteTierClient(client, client.settings)
    store = ChunkStore(client.settings, NS, client, tiers=tc)
    items = [chunk(i, 50_000) for i in range(3)]
    ids = [f"{i:032x}" for i in range(3)]
    try:
        for key, value in items:
            await client.set(key, [value], ttl_s=None, timeout=5.0)
            await tc.note_put(key, len(value))
        await tc.flush_hints()
        assert await drain(tc, timeout=30)
        assert await evict(tc, "ram", namespace=NS.digest, tenant="t1") == 3
        await client.delete([marker_of(items[1][0])], timeout=5.0)  # as if Valkey evicted it
        assert await store.contains_prefix(ids) == 1
        await tc.flush_hints()
        for _ in range(250):
            if await store.contains_prefix(ids) == 3:
                break
            await asyncio.sleep(0.02)
        assert await store.contains_prefix(ids) == 3
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 30) == 0
        await tc.close()
        await client.close()

