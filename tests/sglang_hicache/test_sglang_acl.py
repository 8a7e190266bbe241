"""Under the tenant's confined worker ACL user (lmcache_valkey/acl.py), every backend call SGLang
makes in serving works; ``clear`` needs SCAN, which that user is not given (it would list every
tenant's key names): it is refused, removes nothing, and says so."""

from __future__ import annotations

import logging

import pytest
from sglanghelp import fill_pages, indices, keys, make_pool, page_bytes, zero_pages

from lmcache_valkey import acl

pytestmark = pytest.mark.timeout(120)


def test_serving_calls_work_under_the_worker_acl_and_clear_is_refused(valkey_server, backends, caplog) -> None:
    line = acl.worker_line("team-a", "team-a", password="s3cret")
    valkey_server.cmd("ACL", "SETUSER", *line.split()[1:])
    pool = make_pool("mha", "layer_first")
    backend = backends(valkey_server.url, pool=pool, tenant="team-a", username="team-a", password="s3cret",
                       tenant_secret="team-a-secret-0123456789",
                       transport="tcp", cluster="no")
    ks = keys(3)
    want = fill_pages(pool, [0, 4, 8], seed=70)
    assert all(backend.batch_set_v1(ks, indices(pool, [0, 4, 8])))
    assert backend.batch_set_v1(ks, indices(pool, [0, 4, 8])) == [True] * 3  # skip_existing: EXISTS only
    assert backend.batch_exists(ks) == 3
    zero_pages(pool, [12, 16, 20])
    assert backend.batch_get_v1(ks, indices(pool, [12, 16, 20])) == [True] * 3
    assert [page_bytes(pool, s) for s in (12, 16, 20)] == want
    got = backend.batch_get(ks[:1])
    assert got[0] is not None
    with caplog.at_level(logging.ERROR, logger="lmcache_valkey"):
        assert backend.clear() is False
    assert any("SCAN" in r.getMessage() for r in caplog.records)
    assert backend.batch_exists(ks) == 3
