"""vLLM's real TieringOffloadingManager driving the Valkey tier against a real Valkey."""

from __future__ import annotations

import pytest
from vllmhelp import Layout, block_bytes, keys

from lmcache_valkey.integrations.vllm.compat import CONFIG_INFO, VLLM_VERSION
from vllm.v1.kv_offload.base import LookupResult

pytestmark = pytest.mark.timeout(120)


def test_blocks_offloaded_by_one_server_load_byte_exact_into_another(valkey_server, engines) -> None:
    writer = engines(valkey_server.url)
    reader = engines(valkey_server.url)  # another vLLM server: its own, empty primary tier
    ks = keys("system prompt + manual", 6)
    writer.offload(ks)
    got = reader.fetch(ks)
    assert got == [block_bytes(k, writer.block_size) for k in ks]
    stats = reader.tier.get_stats()
    assert stats is not None
    data = stats.data["data"]
    assert data["vllm:kv_offload_valkey_blocks"][(reader.tier.tier_type, "load", "ok")] == 6


def test_a_lookup_never_blocks_the_scheduler_it_is_answered_at_the_next_step(valkey_server, engines) -> None:
    writer = engines(valkey_server.url)
    reader = engines(valkey_server.url)
    ks = keys("prefix", 3)
    writer.offload(ks)
    ctx = reader.ctx()
    with reader.lock:
        reader.manager.on_new_request(ctx)
    assert reader.lookup_all(ctx, ks) == [LookupResult.RETRY] * 3  # asked, not answered yet
    assert reader.resolve(ctx, ks) == 3


def test_the_prefix_stops_at_the_first_block_no_server_stored(valkey_server, engines) -> None:
    writer = engines(valkey_server.url)
    reader = engines(valkey_server.url)
    ks = keys("partly cached", 5)
    writer.offload(ks[:2])
    writer.offload(ks[3:])
    assert reader.fetch(ks) == [block_bytes(k, writer.block_size) for k in ks[:2]]


@pytest.mark.parametrize("change", [
    {"model": "test/another-model"},
    {"dtype": "float16"},
    {"tokens_per_block": 32},
    {"worker_block_bytes": 32 << 10},
    {"world_size": 2},
    {"layers": ("model.layers.0.self_attn",)},
])
def test_a_different_layout_never_hits(valkey_server, engines, change) -> None:
    writer = engines(valkey_server.url)
    other = engines(valkey_server.url, layout=Layout().with_(**change))
    ks = keys("shared prompt", 3)
    writer.offload(ks)
    assert other.fetch(ks) == []
    assert engines(valkey_server.url).fetch(ks) == [block_bytes(k, writer.block_size) for k in ks]


def test_tenants_do_not_see_each_others_blocks(valkey_server, engines) -> None:
    team_a = {"tenant": "team-a", "tenant_secret": "team-a-secret-0123456789"}
    team_b = {"tenant": "team-b", "tenant_secret": "team-b-secret-0123456789"}
    engines(valkey_server.url, tier_settings=team_a).offload(keys("p", 2))
    assert engines(valkey_server.url, tier_settings=team_b).fetch(keys("p", 2)) == []
    assert len(engines(valkey_server.url, tier_settings=team_a).fetch(keys("p", 2))) == 2


def exported(valkey_server, engines, *, info: bool) -> tuple[str, str]:
    """What vLLM's frontend exporter (OffloadPromMetrics, built from the same
    kv_connector_extra_config) prints after a reader loaded three blocks; and the tier type."""
    import functools
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadPromMetrics

    writer = engines(valkey_server.url)
    reader = engines(valkey_server.url)
    ks = keys("observed", 3)
    writer.offload(ks)
    assert len(reader.fetch(ks)) == 3

    registry = CollectorRegistry()
    types = {cls: functools.partial(cls, registry=registry) for cls in (Counter, Gauge, Histogram)}
    config = SimpleNamespace(kv_transfer_config=SimpleNamespace(
        kv_connector_extra_config={"spec_name": "TieringOffloadingSpec", **reader.spec.config.extra_config}))
    prom = OffloadPromMetrics(config, types, ["engine"], {0: ["0"]})
    with reader.lock:
        stats = reader.manager.get_stats()
    if info:  # what vLLM's scheduler adds to the stats it sends (0.33+)
        stats.set_info(reader.manager.config_info())
    prom.observe(stats.data, 0)
    return generate_latest(registry).decode(), reader.tier.tier_type


def test_the_tiers_series_reach_vllms_prometheus_exporter(valkey_server, engines) -> None:
    text, tier = exported(valkey_server, engines, info=False)
    assert f'vllm:kv_offload_valkey_blocks_total{{engine="0",op="load",outcome="ok",tier_type="{tier}"}} 3.0' in text
    assert "vllm:kv_offload_valkey_lookup_batch_seconds_count" in text


@pytest.mark.skipif(not CONFIG_INFO, reason=f"vLLM {VLLM_VERSION} has no vllm:kv_offload_config_info")
def test_the_tiers_config_info_reaches_vllms_prometheus_exporter(valkey_server, engines) -> None:
    text, _ = exported(valkey_server, engines, info=True)
    assert 'valkey_tenant="default"' in text and 'valkey_transport="resp"' in text


def test_blocks_are_shared_through_a_valkey_cluster(valkey_cluster, engines) -> None:
    writer = engines(valkey_cluster.url)
    reader = engines(valkey_cluster.url)
    ks = keys("spread over shards", 8)
    writer.offload(ks)
    assert reader.fetch(ks) == [block_bytes(k, writer.block_size) for k in ks]
