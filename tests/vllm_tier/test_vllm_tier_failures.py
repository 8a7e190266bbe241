"""A dead, wedged or restarted Valkey costs vLLM at most the tier's deadlines, never a hang
or a wrong block, and the tier recovers when the server is back."""

from __future__ import annotations

import os
import signal
import time

import pytest
from vllmhelp import SLOTS, Harness, block_bytes, keys

from vllm.v1.kv_offload.base import LookupResult, ReqContext

pytestmark = pytest.mark.timeout(180)

DEADLINES = {"op_timeout_s": 1.0, "lookup_timeout_s": 0.5, "connect_timeout_s": 0.5}


def wait_until(cond, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


@pytest.fixture
def harness(valkey_server):
    made = []

    def make(**kw) -> Harness:
        h = Harness(valkey_server.url, **{**DEADLINES, **kw})
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


def test_server_killed_mid_job_fails_the_jobs_then_the_tier_recovers_on_restart(harness, valkey_server) -> None:
    h = harness()
    ks = keys("killed", SLOTS)
    h.store(ks[:4], [0, 1, 2, 3])
    os.kill(valkey_server.pid, signal.SIGSTOP)  # the jobs below are surely in flight
    try:
        for i in range(4, SLOTS):
            h.fill(i, block_bytes(ks[i], len(h.slot(i))))
        store = h.job(ks[4:], [4, 5, 6, 7])
        load = h.job(ks[:4], [4, 5, 6, 7], promotion=True)
        h.tier.submit_store(store)
        h.tier.submit_load(load)
        assert h.tier.has_pending_work()
    finally:
        valkey_server.kill9()
    results = {r.job_id: r for r in h.drain()}  # returns: bounded by the deadlines
    assert set(results) == {store.job_id, load.job_id}
    assert not results[store.job_id].success and not results[load.job_id].success
    assert not results[load.job_id].successful_keys

    valkey_server.restart()  # same port, empty: what was stored is gone
    # The transport backs off from a node that refused it, then reconnects on its own.
    wait_until(lambda: h.store(ks[4:], [4, 5, 6, 7])[0].success)
    assert h.lookup_and_wait(ks[:1], ReqContext(req_id="after-restart")) == [LookupResult.MISS]
    expected = [h.slot(i) for i in (4, 5, 6, 7)]
    (r,) = h.load(ks[4:], [0, 1, 2, 3])
    assert r.success and [h.slot(i) for i in range(4)] == expected


def test_a_wedged_server_fails_jobs_and_lookups_at_their_deadlines(harness, valkey_server) -> None:
    h = harness()
    ks = keys("wedged", 2)
    h.store(ks, [0, 1])
    os.kill(valkey_server.pid, signal.SIGSTOP)
    try:
        (r,) = h.load(ks, [2, 3])
        assert not r.success
        # A lookup is a miss once the lookup deadline passed: the scheduler recomputes
        # instead of waiting for a server that does not answer.
        assert h.lookup_and_wait(ks, ReqContext(req_id="while-wedged")) == [LookupResult.MISS] * 2
    finally:
        os.kill(valkey_server.pid, signal.SIGCONT)
    # Once the server answers again (and the transport's back-off passed), new requests hit.
    n = iter(range(10**6))
    wait_until(lambda: h.lookup_and_wait(ks, ReqContext(req_id=f"resumed-{next(n)}")) == [LookupResult.HIT] * 2)
    (r,) = h.load(ks, [2, 3])
    assert r.success


def test_shutdown_is_bounded_while_the_server_does_not_answer(harness, valkey_server) -> None:
    h = harness(op_timeout_s=30.0, shutdown_timeout_s=0.5)
    ks = keys("stuck", 4)
    h.store(ks, [0, 1, 2, 3])
    os.kill(valkey_server.pid, signal.SIGSTOP)
    try:
        h.tier.submit_load(h.job(ks, [4, 5, 6, 7], promotion=True))
        h.tier.shutdown()  # does not wait out the 30 s deadline
        (r,) = list(h.tier.get_finished_jobs())
        assert not r.success
    finally:
        os.kill(valkey_server.pid, signal.SIGCONT)


def test_an_engine_started_while_valkey_is_up_keeps_serving_across_a_restart(engines, valkey_server) -> None:
    a = engines(valkey_server.url, tier_settings=DEADLINES)
    b = engines(valkey_server.url, tier_settings=DEADLINES)
    first = keys("before", 2)
    a.offload(first)
    valkey_server.kill9()
    assert b.fetch(first) == []  # Valkey is gone: a miss, the request recomputes
    valkey_server.restart()
    second = keys("after", 2)
    wait_until(lambda: a.offload(second) is not None and len(b.fetch(second)) == 2)
    assert b.fetch(second) == [block_bytes(k, a.block_size) for k in second]
