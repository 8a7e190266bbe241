"""``--hicache-storage-backend-extra-config`` is validated when SGLang creates the backend: a bad
or unknown key fails start-up with the key named; SGLang's own keys pass through."""

from __future__ import annotations

from pathlib import Path

import pytest
from sglanghelp import BACKEND, make_config, make_pool

from lmcache_valkey.config import check_tenant_secret
from lmcache_valkey.errors import ConfigError
from lmcache_valkey.integrations.sglang.settings import parse_backend_settings
from support.tenant_secrets import with_test_secret

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("key, value, named", [
    ("url", "http://nope", "hicache_storage_backend_extra_config.url"),
    ("op_timeout_s", -1, "hicache_storage_backend_extra_config.op_timeout_s"),
    ("tenant", "a:b", "hicache_storage_backend_extra_config.tenant"),
    ("skip_existing", "maybe", "hicache_storage_backend_extra_config.skip_existing"),
    ("tiering", "sometimes", "hicache_storage_backend_extra_config.tiering"),
    ("urll", "valkey://x:1", "hicache_storage_backend_extra_config.urll"),
])
def test_a_bad_key_fails_start_up_naming_it(valkey_server, backends, key, value, named) -> None:
    with pytest.raises(ConfigError) as e:
        if key == "url":
            backends(value, pool=make_pool())
        else:
            backends(valkey_server.url, pool=make_pool(), **{key: value})
    assert e.value.key == named


def test_sglangs_own_keys_are_accepted() -> None:
    s = parse_backend_settings({**BACKEND, "prefetch_threshold": 64, "tp_lcm_size": 8,
                                "hicache_storage_pass_prefix_keys": True, "url": "valkey://kv:6379"})
    assert s.interface_v1 and s.store.nodes[0].host == "kv"
    assert not parse_backend_settings({"url": "valkey://kv:6379"}).interface_v1


def test_an_unsupported_host_pool_layout_fails_at_registration_naming_it(valkey_server, backends) -> None:
    pool = make_pool("mha", "page_head")
    with pytest.raises(ValueError, match="page_head"):
        backends(valkey_server.url, pool=pool, config=make_config(layout="page_head"))


def test_the_example_config_is_read_by_sglangs_own_parser_and_validates() -> None:
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController

    path = ROOT / "configs" / "sglang-hicache.yaml"
    raw, prefetch_threshold, *_ = HybridCacheController.parse_storage_backend_extra_config(f"@{path}")
    assert prefetch_threshold == 256 and "prefetch_threshold" not in raw
    assert {k: raw[k] for k in ("backend_name", "module_path", "class_name")} == {
        k: BACKEND[k] for k in ("backend_name", "module_path", "class_name")}
    assert "tenant_secret_file" in raw, "the example's tenant gives its secret"
    s = parse_backend_settings(with_test_secret(raw))  # (the example names the pod's mount path)
    assert s.interface_v1 and s.store.tenant == "team-a" and s.store.ttl_s == 86400
    check_tenant_secret(s.store)


def test_the_readme_command_line_config_validates() -> None:
    import re

    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController

    block = re.search(r"--hicache-storage-backend-extra-config \\\n  '(\{.*?\})'", (ROOT / "README.md").read_text(), re.S)
    assert block, "README lost its SGLang command line"
    raw, *_ = HybridCacheController.parse_storage_backend_extra_config(block.group(1))
    s = parse_backend_settings(raw)
    assert s.interface_v1 and s.store.tenant == "team-a"
    assert raw["module_path"] == BACKEND["module_path"] and raw["class_name"] == BACKEND["class_name"]
