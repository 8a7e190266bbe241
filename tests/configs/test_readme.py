"""The LMCache YAML a user copies from the README loads and validates as written."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_readme_yaml_loads_with_lmcache_and_the_plugin_parser(tmp_path):
    from lmcache.v1.config import LMCacheEngineConfig

    from lmcache_valkey.integrations.lmcache.adapter import parse_plugin_settings

    block = re.search(r"```yaml\n(# lmcache\.yaml.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert block, "README lost its LMCache YAML example"
    path = tmp_path / "lmcache.yaml"
    path.write_text(block.group(1))
    cfg = LMCacheEngineConfig.from_file(str(path))
    assert cfg.remote_storage_plugins == ["valkey"]
    settings, tiering = parse_plugin_settings(cfg.extra_config, "valkey", env={})
    assert settings.tenant == "team-a" and settings.nodes[0].host == "valkey.cache.svc"
    assert not tiering.enabled
