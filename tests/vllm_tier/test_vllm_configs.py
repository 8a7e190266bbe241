"""The kv_transfer_config a user copies (configs/vllm-tier.json, the README) is one vLLM
accepts, names our tier the way vLLM loads it, and starts a working tier; a bad key stops
the start naming it."""

from __future__ import annotations

import json
import pathlib
import re

import pytest
from vllmhelp import Engine, Layout, block_bytes, keys, offloading_config

from lmcache_valkey.errors import ConfigError
from lmcache_valkey.integrations.vllm.compat import CONFIG_INFO, VLLM_VERSION
from support.tenant_secrets import with_test_secret
from vllm.config import KVTransferConfig
from vllm.v1.kv_offload.factory import OffloadingSpecFactory
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

pytestmark = pytest.mark.timeout(120)

ROOT = pathlib.Path(__file__).resolve().parents[2]


def readme_config() -> dict:
    text = (ROOT / "README.md").read_text()
    found = [m.group(1) for m in re.finditer(r"--kv-transfer-config '(\{.*?\})'\n", text, re.S)
             if "OffloadingConnector" in m.group(1)]  # (the vLLM-CPU section shows LMCache's connector)
    assert found, "README lost its vLLM tier --kv-transfer-config example"
    return json.loads(found[0])


def shipped_config() -> dict:
    """configs/vllm-tier.json, its tenant secret's pod path swapped for a secret given here."""
    cfg = json.loads((ROOT / "configs" / "vllm-tier.json").read_text())
    tiers = cfg["kv_connector_extra_config"]["secondary_tiers"]
    assert all("tenant_secret_file" in t for t in tiers), "the example's tenant gives its secret"
    cfg["kv_connector_extra_config"]["secondary_tiers"] = [with_test_secret(t) for t in tiers]
    return cfg


@pytest.mark.parametrize("load", [shipped_config, readme_config], ids=["configs/vllm-tier.json", "README"])
def test_the_config_is_one_vllm_accepts_and_it_names_our_tier(load) -> None:
    cfg = KVTransferConfig(**load())
    extra = cfg.kv_connector_extra_config
    assert cfg.kv_connector == "OffloadingConnector"
    assert OffloadingSpecFactory.get_spec_cls(extra) is TieringOffloadingSpec
    # vLLM's API server does this at start-up: it imports our tier by module_path, which
    # validates the entry and declares our series.
    metrics = TieringOffloadingSpec.build_metric_definitions(extra)
    assert "vllm:kv_offload_valkey_blocks" in metrics


def test_the_shipped_entry_pointed_at_a_server_shares_blocks(valkey_server, engines) -> None:
    entry = dict(shipped_config()["kv_connector_extra_config"]["secondary_tiers"][0])
    entry["url"] = valkey_server.url
    settings = {k: v for k, v in entry.items() if k not in ("type", "module_path", "url")}
    a = engines(valkey_server.url, tier_settings=settings)
    b = engines(valkey_server.url, tier_settings=settings)
    ks = keys("from the shipped config", 2)
    a.offload(ks)
    assert b.fetch(ks) == [block_bytes(k, a.block_size) for k in ks]


@pytest.mark.skipif(not CONFIG_INFO, reason=f"vLLM {VLLM_VERSION} has no vllm:kv_offload_config_info")
def test_the_tier_declares_and_fills_vllms_config_info_labels(valkey_server, engines) -> None:
    extra = shipped_config()["kv_connector_extra_config"]
    assert "valkey_tenant" in TieringOffloadingSpec.config_info_keys(extra)
    entry = dict(extra["secondary_tiers"][0])
    settings = {k: v for k, v in entry.items() if k not in ("type", "module_path", "url")}
    info = engines(valkey_server.url, tier_settings=settings).tier.config_info()
    assert info["valkey_tenant"] == "team-a" and info["valkey_transport"] == "resp"


@pytest.mark.parametrize("bad, key", [
    ({"tenant": "a:b"}, "tenant"),
    ({"op_timeout_s": "soon"}, "op_timeout_s"),
    ({"locality": "nearby"}, "locality"),
    ({"enable_kv_events": "maybe"}, "enable_kv_events"),
    ({"tiering": "embedded"}, "tiering"),
    ({"urll": "valkey://x:1"}, "urll"),
])
def test_a_bad_key_stops_the_start_naming_it(bad, key) -> None:
    extra = shipped_config()["kv_connector_extra_config"]
    extra["secondary_tiers"][0].update(bad)
    name = f"kv_connector_extra_config.secondary_tiers[ValkeySecondaryTier].{key}"
    with pytest.raises(ConfigError) as e:  # the API server, before any engine starts
        TieringOffloadingSpec.build_metric_definitions(extra)
    assert e.value.key == name
    with pytest.raises(ConfigError) as e:  # the engine's scheduler, building the tier
        TieringOffloadingSpec(offloading_config(Layout(), extra["secondary_tiers"])).get_manager()
    assert e.value.key == name


def test_an_unreachable_valkey_stops_the_start_with_the_url(tmp_path) -> None:
    from support.servers import free_port

    with pytest.raises(Exception) as e:
        Engine(f"valkey://127.0.0.1:{free_port()}", tier_settings={"connect_timeout_s": 0.5})
    assert "127.0.0.1" in str(e.value)


def test_vllm_creates_a_multiprocess_directory_only_for_several_api_servers() -> None:
    """What docs/metrics.md tells operators: `vllm serve` with one API server (the default)
    leaves PROMETHEUS_MULTIPROC_DIR alone, so our store's series (in the engine process)
    reach /metrics only when the operator sets it."""
    import ast
    import importlib.util

    # Read, not imported: the API server's module needs uvicorn, which this environment lacks.
    source = pathlib.Path(importlib.util.find_spec("vllm.entrypoints.cli.serve").origin).read_text()
    tree = ast.parse(source)
    guarded, unguarded = [], []

    def visit(node, guards):
        for child in ast.iter_child_nodes(node):
            g = guards + [ast.unparse(child.test)] if isinstance(child, ast.If) else guards
            if isinstance(child, ast.Call) and ast.unparse(child.func) == "setup_multiprocess_prometheus":
                (guarded if guards else unguarded).append(guards)
            visit(child, g)

    visit(tree, [])
    assert not unguarded and guarded == [["num_api_servers > 1"]], guarded


@pytest.mark.parametrize("multiproc_dir", [None, "set"])
def test_the_api_server_warns_when_the_stores_series_cannot_reach_metrics(multiproc_dir, monkeypatch, caplog, tmp_path):
    monkeypatch.delenv("prometheus_multiproc_dir", raising=False)
    if multiproc_dir:
        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    else:
        monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    extra = shipped_config()["kv_connector_extra_config"]
    with caplog.at_level("WARNING", logger="lmcache_valkey"):
        TieringOffloadingSpec.build_metric_definitions(extra)
    warned = [r.getMessage() for r in caplog.records if "PROMETHEUS_MULTIPROC_DIR" in r.getMessage()]
    if multiproc_dir:
        assert not warned
    else:
        assert len(warned) == 1 and "--api-server-count" in warned[0] and "/metrics" in warned[0]
