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


def _table(heading: str) -> dict[str, str]:
    """key -> default column of the README table under ``heading``."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index(heading):]
    section = section[: section.index("\n\n", section.index("| key |"))]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\| `([a-z0-9_]+)` \| (.*?) \|", line)
        if m:
            rows[m.group(1)] = m.group(2).strip("`")
    return rows


def test_every_tiering_setting_is_in_the_readme_table_with_its_default():
    from dataclasses import fields

    from lmcache_valkey.config import parse_size
    from lmcache_valkey.tiering.settings import KNOWN_KEYS, TieringSettings

    rows = _table("### Tiering settings")
    assert set(rows) == set(KNOWN_KEYS)
    defaults = {("tiering" if f.name == "mode" else f.name): f.default for f in fields(TieringSettings)}
    for key, shown in rows.items():
        want = defaults[key]
        if want is None:
            assert shown == "—", key
        elif isinstance(want, bool):
            assert shown == str(want).lower(), key
        elif isinstance(want, str):
            assert shown == want, key
        elif key.endswith(("_bytes", "_threshold")):
            assert parse_size(key, shown) == want, key
        else:
            assert float(shown) == want, key


def test_setup_says_which_host_services_it_stops(tmp_path):
    """A stand-in `service` (the host's service manager cannot be touched in a test) reports
    two services running: exactly those are stopped, each with a line saying so."""
    import os
    import subprocess

    calls = tmp_path / "calls"
    fake = tmp_path / "bin" / "service"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n'
                    '[ "$2" = status ] && { [ "$1" = redis-server ] || [ "$1" = prometheus-redis-exporter ]; } '
                    '&& exit 0\n[ "$2" = stop ] && exit 0\nexit 3\n')
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{fake.parent}:{os.environ['PATH']}")
    out = subprocess.run(["bash", str(ROOT / "scripts/stop-host-services.sh")], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    said = [line for line in out.stderr.splitlines() if "stopping the host service" in line]
    assert [line.split("service ")[1].split()[0] for line in said] == ["redis-server", "prometheus-redis-exporter"]
    stops = [line for line in calls.read_text().splitlines() if line.endswith(" stop")]
    assert stops == ["redis-server stop", "prometheus-redis-exporter stop"]
    listed = subprocess.run(["bash", str(ROOT / "scripts/stop-host-services.sh"), "--list"], capture_output=True,
                            text=True, timeout=60).stdout.split()
    setup = (ROOT / "scripts/setup.sh").read_text()
    assert "bash scripts/stop-host-services.sh" in setup
    readme = (ROOT / "README.md").read_text()
    for svc in listed:
        assert f"`{svc}`" in readme, svc
