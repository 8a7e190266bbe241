"""Through LMCache: chunks that left Valkey RAM come back from NVMe, then from S3, byte-exact."""

from __future__ import annotations

import time

from conftest_helpers import SMALL, filled, payload, put_and_wait


def wait_for(pred, timeout=30.0, what="condition"):
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_embedded_tiering_serves_evicted_chunks_from_nvme_then_s3(valkey_server, make_stack, tmp_path, s3_bucket):
    endpoint, bucket = s3_bucket
    stack = make_stack({
        "url": valkey_server.url, "tenant": "t1", "tenant_secret": "t1-secret-0123456789abcdef",
        "tiering": "embedded", "nvme_dir": str(tmp_path / "nvme"), "admission": "always",
        "s3_bucket": bucket, "s3_endpoint_url": endpoint, "s3_region": "us-east-1",
    })
    assert stack.connector is not None, "plugin failed to start"
    store = stack.connector.store
    manager = next(o for o in store.owned if type(o).__name__ == "TierManager")
    ids = list(range(6))
    keys = [SMALL.key(i) for i in ids]
    objs = [filled(stack, i) for i in ids]
    want = [payload(o) for o in objs]
    put_and_wait(stack, keys, objs)
    for o in objs:
        o.ref_count_down()
    ns = store.namespace
    data_keys = [ns.data_key(ns.chunk_id(k.to_string())) for k in keys]
    marker_keys = [ns.marker_key(ns.chunk_id(k.to_string())) for k in keys]
    wait_for(lambda: all(valkey_server.cmd("EXISTS", m) for m in marker_keys), what="lower-tier copies")
    assert stack.connector._io.run_sync(manager.flush(30.0), 40), "S3 write-behind did not drain"

    # RAM loses them (as under memory pressure): lookups still see them, gets promote from NVMe.
    valkey_server.cmd("DEL", *data_keys)
    assert stack.remote.batched_contains(keys) == 6
    got = stack.remote.batched_get_blocking(keys)
    assert [payload(g) for g in got] == want
    for g in got:
        g.ref_count_down()

    # Now only S3 holds them.
    valkey_server.cmd("DEL", *data_keys)
    stack.connector._io.run_sync(manager.evict("nvme", keys=data_keys), 30)
    assert stack.remote.batched_contains(keys) == 6
    got = stack.remote.batched_get_blocking(keys)
    assert [payload(g) for g in got] == want
    for g in got:
        g.ref_count_down()

    # Deleting through LMCache removes every copy: no tier answers afterwards.
    assert stack.remote.remove(keys[0])
    assert stack.remote.batched_contains(keys[:1]) == 0
    assert stack.remote.get_blocking(keys[0]) is None
