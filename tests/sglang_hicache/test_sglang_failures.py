"""A dead, wedged or restarted Valkey costs SGLang misses within the backend's deadlines, never
a hang or a wrong page, and the backend recovers when the server is back."""

from __future__ import annotations

import os
import signal
import time

import pytest
from sglanghelp import fill_pages, indices, keys, make_pool, page_bytes, zero_pages
from support.chunks import cut_short, relabelled, rewrite

pytestmark = pytest.mark.timeout(180)

DEADLINES = {"op_timeout_s": 1.0, "lookup_timeout_s": 0.5, "connect_timeout_s": 0.5}


def wait_until(cond, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_server_killed_gives_misses_then_the_backend_recovers_on_restart(valkey_server, backends) -> None:
    pool = make_pool("mha", "page_first")
    backend = backends(valkey_server.url, pool=pool, **DEADLINES)
    before, after = keys(2, "before"), keys(2, "after")
    fill_pages(pool, [0, 4], seed=20)
    assert all(backend.batch_set_v1(before, indices(pool, [0, 4])))
    valkey_server.kill9()
    assert backend.batch_exists(before) == 0
    zero_pages(pool, [8, 12])
    assert backend.batch_get_v1(before, indices(pool, [8, 12])) == [False, False]
    assert backend.batch_set_v1(after, indices(pool, [0, 4])) == [False, False]
    assert backend.get(before[0], pool.get_dummy_flat_data_page()) is None
    assert page_bytes(pool, 8) == page_bytes(pool, 12) == bytes(len(page_bytes(pool, 8)))

    valkey_server.restart()  # same port, empty: the pages stored before are gone
    # The transport backs off from a node that refused it, then reconnects on its own.
    wait_until(lambda: all(backend.batch_set_v1(after, indices(pool, [0, 4]))))
    assert backend.batch_exists(before) == 0 and backend.batch_exists(after) == 2
    assert backend.batch_get_v1(after, indices(pool, [8, 12])) == [True, True]
    assert [page_bytes(pool, s) for s in (8, 12)] == [page_bytes(pool, s) for s in (0, 4)]


def test_a_wedged_server_answers_misses_at_the_deadlines_and_hits_once_it_resumes(valkey_server, backends) -> None:
    pool = make_pool("mla", "layer_first")
    backend = backends(valkey_server.url, pool=pool, **DEADLINES)
    ks = keys(3)
    fill_pages(pool, [0, 4, 8], seed=21)
    assert all(backend.batch_set_v1(ks, indices(pool, [0, 4, 8])))
    os.kill(valkey_server.pid, signal.SIGSTOP)
    try:
        assert backend.batch_exists(ks) == 0  # SGLang recomputes instead of waiting
        assert backend.batch_get_v1(ks, indices(pool, [12, 16, 20])) == [False] * 3
        assert backend.batch_set_v1(keys(1, "new"), indices(pool, [0])) == [False]
    finally:
        os.kill(valkey_server.pid, signal.SIGCONT)
    wait_until(lambda: backend.batch_exists(ks) == 3)
    assert backend.batch_get_v1(ks, indices(pool, [12, 16, 20])) == [True] * 3
    assert [page_bytes(pool, s) for s in (12, 16, 20)] == [page_bytes(pool, s) for s in (0, 4, 8)]


def test_close_is_bounded_while_the_server_does_not_answer(valkey_server, backends) -> None:
    pool = make_pool("mha", "page_first")
    backend = backends(valkey_server.url, pool=pool, **DEADLINES)
    os.kill(valkey_server.pid, signal.SIGSTOP)
    try:
        backend.close()
        assert backend.batch_exists(keys(1)) == 0  # closed: a miss, no error
    finally:
        os.kill(valkey_server.pid, signal.SIGCONT)


@pytest.mark.parametrize("change", [cut_short, relabelled])
def test_a_page_with_valid_checksums_but_lying_metadata_is_a_miss_and_deleted(valkey_server, backends, change) -> None:
    """Rewritten by someone with the tenant's credentials: every CRC and digest checks out, but
    the payload is not the page its metadata describes, or the metadata is not a page."""
    pool = make_pool("mha", "page_first")
    backend = backends(valkey_server.url, pool=pool)
    ks = keys(1, f"lie-{change.__name__}")
    fill_pages(pool, [0], seed=31)
    assert backend.batch_set_v1(ks, indices(pool, [0])) == [True]
    (key,) = [k for k in valkey_server.cmd("KEYS", "*") if b":c:{" in k]
    rewrite(valkey_server, key, change)
    zero_pages(pool, [4])
    assert backend.batch_get_v1(ks, indices(pool, [4])) == [False]
    wait_until(lambda: valkey_server.cmd("EXISTS", key) == 0)
    assert backend.batch_exists(ks) == 0
