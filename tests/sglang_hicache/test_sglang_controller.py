"""SGLang's own cache controller drives the backend: its backup thread stores pages, its
prefetch threads look them up and load them, as in a running SGLang server."""

from __future__ import annotations

import time

import pytest
from sglanghelp import BACKEND

from lmcache_valkey.integrations.sglang.backend import ValkeyHiCacheStorage

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def servers():
    from sglangctl import Server

    made = []

    def make(url: str, **kw):
        s = Server({**BACKEND, "url": url, "op_timeout_s": 5, "lookup_timeout_s": 2}, **kw)
        made.append(s)
        return s

    yield make
    for s in reversed(made):
        s.close()


def test_sglangs_controller_attaches_the_backend_with_the_zero_copy_page_api(valkey_server, servers) -> None:
    a = servers(valkey_server.url)
    assert isinstance(a.backend, ValkeyHiCacheStorage)
    assert a.controller.page_get_func.__name__ == "_page_get_zero_copy"
    assert a.controller.page_set_func.__name__ == "_page_set_zero_copy"


def test_a_prefix_backed_up_by_one_server_is_prefetched_by_another(valkey_server, servers) -> None:
    a, b = servers(valkey_server.url), servers(valkey_server.url)
    prompt = list(range(1000, 1000 + 4 * 12))  # 12 pages of 4 tokens
    pages = a.back_up(prompt, seed=50)
    assert b.fetch(prompt) == pages
    # A longer prompt with the same prefix: the stored prefix only, in order.
    assert b.fetch(prompt + list(range(7, 7 + 8))) == pages
    # Another prompt: nothing.
    assert b.fetch(list(range(5, 5 + 16))) == []


def test_layouts_with_the_same_page_bytes_share_through_the_controllers(valkey_server, servers) -> None:
    a = servers(valkey_server.url, layout="layer_first")
    b = servers(valkey_server.url, layout="page_first_direct")
    c = servers(valkey_server.url, layout="page_first")
    prompt = list(range(300, 300 + 4 * 5))
    pages = a.back_up(prompt, seed=51)
    assert b.fetch(prompt) == pages
    assert c.fetch(prompt) == []


def test_with_valkey_gone_the_controller_gets_misses_then_resumes_after_a_restart(valkey_server) -> None:
    from sglangctl import Server

    s = Server({**BACKEND, "url": valkey_server.url, "op_timeout_s": 1, "lookup_timeout_s": 0.5,
                "connect_timeout_s": 0.5})
    try:
        before = list(range(2000, 2000 + 4 * 3))
        s.back_up(before, seed=52)
        valkey_server.kill9()
        assert s.fetch(before) == []  # a miss within the lookup deadline: SGLang recomputes
        s.back_up(list(range(3000, 3000 + 8)), seed=53, stored=False)
        valkey_server.restart()
        after = list(range(4000, 4000 + 4 * 3))
        deadline = time.monotonic() + 30
        while True:  # the transport reconnects on its own after its back-off
            try:
                pages = s.back_up(after, seed=54)
                break
            except AssertionError:
                assert time.monotonic() < deadline, "the backend did not recover"
        assert s.fetch(after) == pages
        assert s.fetch(before) == []  # gone with the restart
    finally:
        s.close()
