"""vLLM 0.34's deferred release, through vLLM's real TieringOffloadingManager: a promotion
that fails while the server may still RMA-write into its primary chunks is failed at once
(its keys miss), and the manager holds those chunks until our I/O can no longer touch them;
``drain_jobs`` sets every such hold, so ``reset_cache`` proceeds.

The scenarios of vLLM 0.34's own tests (tests/v1/kv_offload/tiering/test_tiering_offloading.py,
``test_deferred_release_*``, ``test_reset_after_deferred_release_succeeds``), with a real
server paused mid-promotion instead of a hand-made event. On 0.33 (no deferred release) the
same failure is reported only once the I/O is over: test_vllm_fabric.py.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from vllmhelp import keys

from lmcache_valkey.integrations.vllm.compat import DEFERRED_RELEASE, VLLM_VERSION
from vllm.v1.kv_offload.base import LookupResult, ReqContext

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(not DEFERRED_RELEASE, reason=f"vLLM {VLLM_VERSION} has no JobResult.deferred_release"),
]

FABRIC = {"transport": "fabric", "fabric_provider": "tcp;ofi_rxm", "op_timeout_s": 1.0, "lookup_timeout_s": 0.5}


def wait_until(cond, engine, timeout: float = 60.0) -> None:
    """Step the engine until ``cond()`` (a hang guard, not a timing check)."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        engine.step()
        time.sleep(0.005)


def promote_while_paused(writer, reader, server, ks) -> ReqContext:
    """The writer offloads ``ks``; the reader finds them in Valkey and promotes them, and the
    server is paused just before the promotion is submitted, so it fails at the deadline
    with the server's RMA writes still possible. Returns the request."""
    # The reader's fabric session exists before the pause (a promotion that could not even
    # open one sent nothing, so it holds nothing).
    warm = keys(f"warm-up {ks[0].hex()}", 1)
    writer.offload(warm + ks)
    assert len(reader.fetch(warm)) == 1
    ctx = reader.ctx()
    with reader.lock:
        reader.manager.on_new_request(ctx)
    deadline = time.monotonic() + 60
    while (results := reader.lookup_all(ctx, ks)) != [LookupResult.HIT_PENDING] * len(ks):
        assert LookupResult.MISS not in results and time.monotonic() < deadline, results
        reader.step()  # answers the tier's batched lookup; the promotion is submitted at the next step
        time.sleep(0.002)
    os.kill(server.pid, signal.SIGSTOP)
    reader.step()  # submit_load: the command reaches a server that does not run
    return ctx


def deferred_gauges(engine) -> dict[str, float]:
    with engine.lock:
        reduced = engine.manager.get_stats().reduce()
    return {k: v for k, v in reduced.items() if "deferred_release" in k}


def test_a_failed_promotion_misses_at_once_and_its_chunks_are_held_until_the_server_cannot_write(
        blob_server, engines) -> None:
    writer = engines(blob_server.url, tier_settings=FABRIC, cpu_blocks=16)
    reader = engines(blob_server.url, tier_settings=FABRIC, cpu_blocks=16)
    # Only the server's reply ends these transfers (no timed revocation while it is paused).
    reader.tier._session.store.transport._grace = 600.0
    primary = reader.manager.primary_tier
    ks = keys("deferred", 2)
    try:
        ctx = promote_while_paused(writer, reader, blob_server, ks)
        wait_until(lambda: primary.num_deferred_release_chunks == 2, reader)
        with reader.lock:  # failed at once: the request recomputes these blocks
            assert [primary.lookup(k, ctx) for k in ks] == [LookupResult.MISS] * 2
            (held,) = [d.chunk_ids for d in reader.manager._deferred_releases.values()]
        gauges = deferred_gauges(reader)
        assert [v for k, v in gauges.items() if k.startswith("vllm:kv_offload_tiering_deferred_release_chunks")] == [2]
        assert not any("hold_seconds" in k and k.endswith("_count") for k in gauges)
        with reader.lock:
            assert reader.manager.has_pending_work()

        # The same blocks computed again go to fresh chunks, which the late writer cannot touch.
        pattern = b"\xa5" * reader.block_size
        again = reader.ctx()
        with reader.lock:
            reader.manager.on_new_request(again)
            out = reader.manager.prepare_store(ks, again)
            fresh = [int(c) for c in out.store_spec.chunk_ids]
        assert not set(fresh) & set(held)
        with reader.view.cast("B") as flat:
            for c in fresh:
                flat[c * reader.block_size:(c + 1) * reader.block_size] = pattern
        with reader.lock:
            reader.manager.complete_store(ks, again, success=True)
            reader.manager.on_request_finished(again)
    finally:
        os.kill(blob_server.pid, signal.SIGCONT)
    # The server runs again and answers: only now can nothing of ours touch the held chunks.
    wait_until(lambda: primary.num_deferred_release_chunks == 0, reader)
    gauges = deferred_gauges(reader)
    assert [v for k, v in gauges.items() if "hold_seconds" in k and k.endswith("_count")] == [1]
    with reader.view.cast("B") as flat:
        assert all(flat[c * reader.block_size:(c + 1) * reader.block_size] == pattern for c in fresh)
    with reader.lock:
        assert [primary.lookup(k, ReqContext(req_id="later")) for k in ks] == [LookupResult.HIT] * 2
        reader.manager.on_request_finished(ctx)
    reader.wait_idle()


def test_drain_jobs_sets_every_deferred_release_so_reset_cache_proceeds(blob_server, engines) -> None:
    writer = engines(blob_server.url, tier_settings=FABRIC, cpu_blocks=16)
    reader = engines(blob_server.url, tier_settings=FABRIC, cpu_blocks=16)
    primary = reader.manager.primary_tier
    ks = keys("reset", 3)
    try:
        ctx = promote_while_paused(writer, reader, blob_server, ks)
        wait_until(lambda: primary.num_deferred_release_chunks == 3, reader)
        with reader.lock:
            # drain_jobs() waits until the transport revoked the link the stalled transfer
            # used (deadline + drain grace), then reset_cache asserts no release is pending.
            reader.manager.reset_cache()
            assert primary.num_deferred_release_chunks == 0
        pattern = b"\x5a" * reader.view.nbytes
        with reader.view.cast("B") as flat:
            flat[:] = pattern
    finally:
        os.kill(blob_server.pid, signal.SIGCONT)
    time.sleep(1.0)  # the resumed server would write now, if it still could
    with reader.view.cast("B") as flat:
        assert flat == pattern
    with reader.lock:
        reader.manager.on_request_finished(ctx)


def test_a_failed_load_whose_io_is_over_defers_nothing(valkey_server, engines) -> None:
    """RESP: nothing can write into a slot once the read returned, so the failure carries no
    hold and the chunks go back at once (vLLM's test_deferred_release_already_set_with_result)."""
    writer = engines(valkey_server.url)
    reader = engines(valkey_server.url)
    ks = keys("flushed", 2)
    # The reader's fabric session exists before the pause (a promotion that could not even
    # open one sent nothing, so it holds nothing).
    warm = keys(f"warm-up {ks[0].hex()}", 1)
    writer.offload(warm + ks)
    assert len(reader.fetch(warm)) == 1
    ctx = reader.ctx()
    with reader.lock:
        reader.manager.on_new_request(ctx)
    deadline = time.monotonic() + 60
    while (results := reader.lookup_all(ctx, ks)) != [LookupResult.HIT_PENDING] * 2:
        assert time.monotonic() < deadline, results
        reader.step()
        time.sleep(0.002)
    valkey_server.cmd("FLUSHALL")  # evicted after the lookup
    reader.wait_idle()
    primary = reader.manager.primary_tier
    with reader.lock:
        assert primary.num_deferred_release_chunks == 0 and not reader.manager._deferred_releases
        assert [primary.lookup(k, ctx) for k in ks] == [LookupResult.MISS] * 2
        reader.manager.on_request_finished(ctx)
