"""The kv_transfer_config a user copies (configs/vllm-tier.json, the README) is one vLLM 0.33
accepts, names our tier the way vLLM loads it, and starts a working tier; a bad key stops
the start naming it."""

from __future__ import annotations

import json
import pathlib
import re

import pytest
from vllmhelp import Engine, Layout, block_bytes, keys, offloading_config

from lmcache_valkey.errors import ConfigError
from vllm.config import KVTransferConfig
from vllm.v1.kv_offload.factory import OffloadingSpecFactory
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

pytestmark = pytest.mark.timeout(120)

ROOT = pathlib.Path(__file__).resolve().parents[2]


def readme_config() -> dict:
    text = (ROOT / "README.md").read_text()
    m = re.search(r"--kv-transfer-config '(\{.*?\})'\n", text, re.S)
    assert m, "README lost its vLLM --kv-transfer-config example"
    return json.loads(m.group(1))


def shipped_config() -> dict:
    return json.loads((ROOT / "configs" / "vllm-tier.json").read_text())


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
    assert "valkey_tenant" in TieringOffloadingSpec.config_info_keys(extra)


def test_the_shipped_entry_pointed_at_a_server_shares_blocks(valkey_server, engines) -> None:
    entry = dict(shipped_config()["kv_connector_extra_config"]["secondary_tiers"][0])
    entry["url"] = valkey_server.url
    settings = {k: v for k, v in entry.items() if k not in ("type", "module_path", "url")}
    a = engines(valkey_server.url, tier_settings=settings)
    b = engines(valkey_server.url, tier_settings=settings)
    ks = keys("from the shipped config", 2)
    a.offload(ks)
    assert b.fetch(ks) == [block_bytes(k, a.block_size) for k in ks]
    assert b.tier.config_info()["valkey_tenant"] == "team-a"


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
