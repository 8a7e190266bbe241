"""MP mode with tiering: chunks that left Valkey RAM are found by LMCache's lookups and loaded
from NVMe, then from S3 (moto), byte-exact; a lookup-and-lock leases them until the unlock."""

from __future__ import annotations

import asyncio

import pytest
from mphelp import CHUNK_BYTES, T1, adapter_of, keys, prefetch, read, wait_for, wait_stored, want, write

pytestmark = pytest.mark.timeout(240)


def test_tiered_chunks_are_found_and_loaded_from_nvme_then_s3(valkey_server, managers, tmp_path, s3_bucket):
    endpoint, bucket = s3_bucket
    sm = managers({"url": valkey_server.url, **T1, "tiering": "embedded", "nvme_dir": str(tmp_path / "nvme"),
                   "admission": "always", "s3_bucket": bucket, "s3_endpoint_url": endpoint, "s3_region": "us-east-1"})
    adapter = adapter_of(sm)
    manager = next(o for o in adapter.store.owned if type(o).__name__ == "TierManager")

    def run(coro, timeout=60):
        return adapter._session.run_sync(coro, timeout)

    ks, seeds = keys(range(4)), range(40, 44)
    write(sm, ks, seeds)
    wait_stored(sm, 4 * CHUNK_BYTES)
    assert run(manager.flush(30.0)), "lower-tier copies were not written"
    data_keys = [k for k in valkey_server.cmd("KEYS", "lmcv:t1:*:c:*")]
    assert len(data_keys) == 4

    # RAM loses them (as under memory pressure) and so does L1: LMCache must go to L2
    valkey_server.cmd("DEL", *data_keys)
    sm.delete_l1_keys(ks, force=True)
    r = prefetch(sm, ks)
    assert r.l2_hit_count == 4
    assert read(sm, ks) == want(seeds)

    # now only S3 holds them
    valkey_server.cmd("DEL", *data_keys)
    run(manager.evict("nvme", keys=data_keys))
    sm.delete_l1_keys(ks, force=True)
    r = prefetch(sm, ks)
    assert r.l2_hit_count == 4
    assert read(sm, ks) == want(seeds)

    # a lookup-and-lock leases them in the tiers until the unlock
    task = adapter.submit_lookup_and_lock_task(ks, {})
    wait_for(lambda: adapter.query_lookup_and_lock_result(task) is not None, 30, "lookup")
    assert manager.stats()["leases"] == 4
    adapter.submit_unlock(ks)
    run(asyncio.sleep(0))  # the unlock's release was queued on the adapter's loop before this
    assert manager.stats()["leases"] == 0

    # LMCache's eviction deletes through every tier
    adapter.delete(ks[:1])
    sm.delete_l1_keys(ks, force=True)
    assert prefetch(sm, ks[:1]).l2_hit_count == 0
