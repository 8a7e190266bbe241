"""LMCache's own L2 eviction runs on our byte accounting: past the watermark of `max_capacity`,
its eviction controller deletes the least recently used chunks through the adapter, and
`get_usage` (per cache_salt too) and Valkey agree on what is left."""

from __future__ import annotations

import pytest
from mphelp import CHUNK_BYTES, T1, adapter_of, keys, l2_lookup, wait_for, write

pytestmark = pytest.mark.timeout(180)


def test_lmcache_l2_eviction_deletes_through_the_adapter_and_usage_follows(valkey_server, managers):
    capacity = 10 * CHUNK_BYTES
    sm = managers({"url": valkey_server.url, **T1, "max_capacity": capacity},
                  eviction={"eviction_policy": "LRU", "trigger_watermark": 0.8, "eviction_ratio": 0.5})
    adapter = adapter_of(sm)
    assert adapter.supports_global_eviction
    first, second = keys(range(6), salt="a"), keys(range(6, 12), salt="b")
    write(sm, first, range(6))
    wait_for(lambda: adapter.get_usage().total_bytes_used == 6 * CHUNK_BYTES, 30, "6 chunks accounted")
    write(sm, second, range(6, 12))  # 12 chunks > 80% of 10: LMCache evicts half

    def evicted() -> bool:
        u = adapter.get_usage().total_bytes_used
        return 0 < u <= 0.8 * capacity and valkey_server.cmd("DBSIZE") < 12

    wait_for(evicted, 60, "LMCache's L2 eviction to bring usage under the watermark")
    wait_for(lambda: adapter.report_status()["running_tasks"]["store"] == 0, 30, "stores to finish")
    usage = adapter.get_usage()
    left = usage.total_bytes_used // CHUNK_BYTES
    assert valkey_server.cmd("DBSIZE") == left  # what the accounting says is what Valkey holds
    assert sum(usage.bytes_by_cache_salt.values()) == usage.total_bytes_used
    # what was evicted is gone for every instance, and only that
    assert sum(l2_lookup(adapter, first + second)) == left
