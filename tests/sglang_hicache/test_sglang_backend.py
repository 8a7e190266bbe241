"""SGLang's host KV pool → Valkey → host KV pool, through SGLang's own classes and loader."""

from __future__ import annotations

import pytest
import torch
from sglanghelp import LAYOUTS, fill_pages, indices, keys, make_config, make_pool, page_bytes, zero_pages

from lmcache_valkey.integrations.sglang.backend import ValkeyHiCacheStorage

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("kind", ["mha", "mla"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_pages_round_trip_byte_exact_through_the_zero_copy_api(valkey_server, backends, kind, layout) -> None:
    pool = make_pool(kind, layout)
    backend = backends(valkey_server.url, pool=pool)
    assert isinstance(backend, ValkeyHiCacheStorage)
    src, dst = [0, 4, 8, 12, 16], [40, 48, 44, 60, 52]  # page starts (page size 4), not in order
    ks = keys(len(src))
    want = fill_pages(pool, src, seed=1)
    assert backend.batch_exists(ks) == 0
    assert backend.batch_set_v1(ks, indices(pool, src)) == [True] * len(ks)
    assert backend.batch_exists(ks) == len(ks)
    assert backend.exists(ks[2])
    zero_pages(pool, dst)
    assert backend.batch_get_v1(ks, indices(pool, dst)) == [True] * len(ks)
    assert [page_bytes(pool, s) for s in dst] == want


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_plain_api_and_the_zero_copy_api_store_the_same_page_bytes(valkey_server, backends, layout) -> None:
    pool = make_pool("mha", layout)
    backend = backends(valkey_server.url, pool=pool)
    want = fill_pages(pool, [0, 4], seed=2)
    # SGLang's copying path: get_data_page(flat) in, get_dummy_flat_data_page out.
    assert backend.batch_set(keys(2, "plain"), [pool.get_data_page(s, flat=True) for s in (0, 4)])
    assert backend.set(keys(1, "one")[0], pool.get_data_page(0, flat=True))
    got = backend.batch_get(keys(2, "plain"), [pool.get_dummy_flat_data_page() for _ in range(2)])
    assert [t.view(torch.uint8).numpy().tobytes() for t in got] == want
    assert backend.get(keys(1, "none")[0], pool.get_dummy_flat_data_page()) is None
    # ...and each path reads what the other stored.
    zero_pages(pool, [20, 24])
    assert backend.batch_get_v1(keys(2, "plain"), indices(pool, [20, 24])) == [True, True]
    assert [page_bytes(pool, s) for s in (20, 24)] == want
    assert backend.batch_set_v1(keys(2, "v1"), indices(pool, [0, 4])) == [True, True]
    got = backend.batch_get(keys(2, "v1"))  # SGLang-sized pages allocated by the backend
    assert [t.view(torch.uint8).numpy().tobytes() for t in got] == want


def test_batch_exists_answers_the_consecutive_prefix(valkey_server, backends) -> None:
    pool = make_pool("mha", "page_first")
    backend = backends(valkey_server.url, pool=pool)
    ks = keys(6)
    fill_pages(pool, [0, 4, 8, 12, 16, 20], seed=3)
    stored = [0, 1, 2, 4]
    assert all(backend.batch_set_v1([ks[i] for i in stored], indices(pool, [4 * i for i in stored])))
    assert backend.batch_exists(ks) == 3
    assert backend.batch_exists(ks[4:]) == 1
    assert backend.batch_exists([]) == 0


def test_layouts_with_the_same_page_bytes_share_pages_and_others_never_hit(valkey_server, backends) -> None:
    """layer_first and page_first_direct store a page as layer, then token: they share. page_first
    stores token, then layer: its pages are another namespace and never a hit for them."""
    layer_first = make_pool("mha", "layer_first")
    direct = make_pool("mha", "page_first_direct")
    page_first = make_pool("mha", "page_first")
    a = backends(valkey_server.url, pool=layer_first)
    b = backends(valkey_server.url, pool=direct)
    c = backends(valkey_server.url, pool=page_first)
    ks = keys(3)
    want = fill_pages(layer_first, [0, 4, 8], seed=4)
    assert all(a.batch_set_v1(ks, indices(layer_first, [0, 4, 8])))
    assert b.batch_exists(ks) == 3
    assert b.batch_get_v1(ks, indices(direct, [12, 16, 20])) == [True] * 3
    assert [page_bytes(direct, s) for s in (12, 16, 20)] == want
    assert c.batch_exists(ks) == 0
    zero_pages(page_first, [12, 16, 20])
    assert c.batch_get_v1(ks, indices(page_first, [12, 16, 20])) == [False] * 3
    assert all(page_bytes(page_first, s) == bytes(len(want[0])) for s in (12, 16, 20))


def test_other_models_dtypes_and_page_sizes_never_hit(valkey_server, backends) -> None:
    pool = make_pool("mha", "page_first")
    writer = backends(valkey_server.url, pool=pool)
    ks = keys(2)
    fill_pages(pool, [0, 4], seed=5)
    assert all(writer.batch_set_v1(ks, indices(pool, [0, 4])))
    other_model = backends(valkey_server.url, pool=make_pool("mha", "page_first"),
                           config=make_config(model="other/model"))
    other_dtype = backends(valkey_server.url, pool=make_pool("mha", "page_first", dtype=torch.float16))
    other_page = backends(valkey_server.url, pool=make_pool("mha", "page_first", page_size=8))
    other_rank = backends(valkey_server.url, pool=make_pool("mha", "page_first"), config=make_config(tp_rank=1, tp_size=2))
    other_tenant = backends(valkey_server.url, pool=make_pool("mha", "page_first"), tenant="team-b",
                            tenant_secret="team-b-secret-0123456789")
    for b in (other_model, other_dtype, other_page, other_rank, other_tenant):
        assert b.batch_exists(ks) == 0
    same = backends(valkey_server.url, pool=make_pool("mha", "page_first"))
    assert same.batch_exists(ks) == 2


def test_mla_ranks_share_one_copy_written_by_the_shard_writer(valkey_server, backends) -> None:
    """As SGLang's own backends do: MLA KV is the same on every TP rank, so rank 0 writes and
    every rank reads; a non-writer's set stores nothing. MHA ranks hold different heads."""
    rank0_pool, rank3_pool = make_pool("mla", "page_first"), make_pool("mla", "page_first")
    rank0 = backends(valkey_server.url, pool=rank0_pool, config=make_config(mla=True, tp_rank=0, tp_size=8))
    rank3 = backends(valkey_server.url, pool=rank3_pool, config=make_config(mla=True, tp_rank=3, tp_size=8))
    assert rank0.storage_config.is_storage_writer and not rank3.storage_config.is_storage_writer
    mine = keys(2, "rank3")
    fill_pages(rank3_pool, [0, 4], seed=6)
    assert rank3.batch_set_v1(mine, indices(rank3_pool, [0, 4])) == [True, True]  # left to the writer
    assert rank3.batch_exists(mine) == 0 and rank0.batch_exists(mine) == 0
    ks = keys(2, "rank0")
    want = fill_pages(rank0_pool, [0, 4], seed=7)
    assert all(rank0.batch_set_v1(ks, indices(rank0_pool, [0, 4])))
    assert rank3.batch_get_v1(ks, indices(rank3_pool, [8, 12])) == [True, True]
    assert [page_bytes(rank3_pool, s) for s in (8, 12)] == want
    mha1 = backends(valkey_server.url, pool=make_pool("mha", "page_first"), config=make_config(tp_rank=1, tp_size=8))
    mha0 = backends(valkey_server.url, pool=make_pool("mha", "page_first"), config=make_config(tp_rank=0, tp_size=8))
    fill_pages(mha0.mem_pool_host, [0], seed=8)
    assert mha0.batch_set_v1(keys(1, "mha"), indices(mha0.mem_pool_host, [0])) == [True]
    assert mha1.batch_exists(keys(1, "mha")) == 0


def test_a_corrupt_page_is_a_miss_never_wrong_bytes_and_is_removed(valkey_server, backends) -> None:
    pool = make_pool("mha", "layer_first")
    backend = backends(valkey_server.url, pool=pool)
    ks = keys(2)
    want = fill_pages(pool, [0, 4], seed=9)
    assert all(backend.batch_set_v1(ks, indices(pool, [0, 4])))
    key = backend._store.namespace.data_key(backend._store.namespace.chunk_id(ks[1]))
    byte = valkey_server.cmd("GETRANGE", key, 600, 600)
    valkey_server.cmd("SETRANGE", key, 600, bytes([byte[0] ^ 0x01]))
    zero_pages(pool, [8, 12])
    assert backend.batch_get_v1(ks, indices(pool, [8, 12])) == [True, False]
    assert page_bytes(pool, 8) == want[0]
    for _ in range(100):
        if backend.batch_exists(ks) == 1:
            break
    assert backend.batch_exists(ks) == 1


def test_host_indices_that_are_not_whole_pages_fail_without_io(valkey_server, backends) -> None:
    pool = make_pool("mha", "page_first")
    backend = backends(valkey_server.url, pool=pool)
    ks = keys(2)
    assert backend.batch_set_v1(ks, torch.arange(0, 7)) == [False, False]  # 7 slots for 2 pages of 4
    assert backend.batch_set_v1(ks, torch.arange(2, 10)) == [False, False]  # pages not aligned
    assert backend.batch_set_v1(ks, torch.arange(pool.size - 4, pool.size + 4)) == [False, False]
    assert backend.batch_exists(ks) == 0


def test_clear_removes_only_this_backends_pages(valkey_server, backends) -> None:
    pool = make_pool("mha", "page_first")
    mine = backends(valkey_server.url, pool=pool)
    theirs = backends(valkey_server.url, pool=make_pool("mha", "page_first"), config=make_config(model="other/model"))
    fill_pages(pool, [0, 4, 8], seed=10)
    assert all(mine.batch_set_v1(keys(3), indices(pool, [0, 4, 8])))
    fill_pages(theirs.mem_pool_host, [0], seed=11)
    assert all(theirs.batch_set_v1(keys(1), indices(theirs.mem_pool_host, [0])))
    valkey_server.cmd("SET", "unrelated", "x")
    mine.clear()
    assert mine.batch_exists(keys(3)) == 0
    assert theirs.batch_exists(keys(1)) == 1
    assert valkey_server.cmd("GET", "unrelated") == b"x"


def test_get_stats_feeds_sglangs_storage_metrics(valkey_server, backends) -> None:
    from sglang.srt.observability.metrics_collector import StorageMetrics

    pool = make_pool("mha", "page_first")
    backend = backends(valkey_server.url, pool=pool, config=make_config(metrics=True))
    fill_pages(pool, [0, 4, 8], seed=12)
    assert all(backend.batch_set_v1(keys(3), indices(pool, [0, 4, 8])))
    assert backend.batch_set_v1(keys(3), indices(pool, [0, 4, 8])) == [True] * 3  # already stored: not sent
    assert backend.batch_get_v1(keys(3), indices(pool, [20, 24, 28])) == [True] * 3
    stats = backend.get_stats()
    assert isinstance(stats, StorageMetrics)
    assert stats.backup_pgs == [3] and stats.prefetch_pgs == [3]
    assert len(stats.prefetch_bandwidth) == 1 and stats.prefetch_bandwidth[0] > 0
    again = backend.get_stats()
    assert again.prefetch_pgs == [] and again.backup_pgs == []


def test_sglangs_storage_metrics_collector_logs_what_get_stats_returns(valkey_server, backends) -> None:
    pytest.importorskip("prometheus_client")
    from sglang.srt.observability.metrics_collector import StorageMetricsCollector

    pool = make_pool("mha", "page_first")
    backend = backends(valkey_server.url, pool=pool, config=make_config(metrics=True))
    fill_pages(pool, [0], seed=13)
    assert all(backend.batch_set_v1(keys(1), indices(pool, [0])))
    collector = StorageMetricsCollector(labels={"storage_backend": "valkey-test"})
    collector.log_storage_metrics(backend.get_stats())


@pytest.mark.parametrize("mla, tp_rank, tp_size", [(False, 0, 1), (True, 0, 1), (False, 1, 4), (True, 3, 8)])
def test_sglangs_own_backend_scenario_batch_operations(valkey_server, backends, mla, tp_rank, tp_size) -> None:
    """SGLang's Mooncake store test (13 keys, batch_set_v1 -> batch_exists -> batch_get_v1 into
    other slots, per config); an MLA rank that is not the writer reads the writer's pages."""
    kind = "mla" if mla else "mha"
    pool = make_pool(kind, "page_first")
    me = backends(valkey_server.url, pool=pool, config=make_config(mla=mla, tp_rank=tp_rank, tp_size=tp_size))
    writer = me
    if mla and tp_rank != 0:
        wpool = make_pool(kind, "page_first")
        writer = backends(valkey_server.url, pool=wpool, config=make_config(mla=True, tp_rank=0, tp_size=tp_size))
        pool_for_set = wpool
    else:
        pool_for_set = pool
    ks = keys(13, f"scenario-{kind}-{tp_rank}")
    want = fill_pages(pool_for_set, [4 * i for i in range(13)], seed=60)
    assert all(writer.batch_set_v1(ks, indices(pool_for_set, [4 * i for i in range(13)])))
    assert me.batch_exists(ks) == 13
    got_at = [4 * (13 + i) for i in range(13)]
    assert all(me.batch_get_v1(ks, indices(pool, got_at)))
    assert [page_bytes(pool, s) for s in got_at] == want


@pytest.mark.parametrize("page_size", [1, 2])
def test_sglangs_own_backend_scenario_partial_keys(valkey_server, backends, page_size) -> None:
    """SGLang's AIBrix store test: layer_first pages of 1 and 2 tokens, 64 layers; the plain API
    stores and loads, and a batch starting in the middle of the stored keys hits all of them."""
    pool = make_pool("mha", "layer_first", page_size=page_size, layers=64, heads=1, head_dim=128,
                     dtype=torch.float16)
    backend = backends(valkey_server.url, pool=pool)
    ks = keys(4, f"aibrix-{page_size}")
    assert backend.batch_exists(ks) == 0
    values = [torch.rand((2, 64, page_size, 1, 128), dtype=torch.float16) for _ in ks]
    assert backend.batch_set(ks, values)
    got = backend.batch_get(ks, [torch.rand((2, 64, page_size, 1, 128), dtype=torch.float16).flatten() for _ in ks])
    assert all(torch.equal(g, v.flatten()) for g, v in zip(got, values))
    assert backend.batch_exists(ks) == 4
    assert backend.batch_exists(ks[2:]) == 2
