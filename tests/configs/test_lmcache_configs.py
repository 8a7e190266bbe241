"""configs/*.yaml: each loads with LMCache's own config loader, names the plugin the way LMCache
0.5 loads it, uses only keys our settings know (and that validate), and the TCP and
multi-tenant examples drive a real LMCache storage stack against real Valkey servers."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest

lmcache_config = pytest.importorskip("lmcache.v1.config", reason="lmcache (extra 'lmcache') is not installed")

from lmcache_valkey.config import KNOWN_KEYS, LMCACHE_OWN_KEYS, check_tenant_secret, settings_from_mapping  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
NAMES = ["tcp.yaml", "fabric.yaml", "tiered.yaml", "multi-tenant.yaml"]
PLUGIN = "valkey"
PREFIX = f"remote_storage_plugin.{PLUGIN}."

try:
    from lmcache_valkey.tiering.settings import KNOWN_KEYS as TIERING_KEYS
    from lmcache_valkey.tiering.settings import tiering_settings_from_mapping
except ImportError:  # tiering not installed in this tree
    TIERING_KEYS, tiering_settings_from_mapping = frozenset(), None


def _load(name: str) -> Any:
    return lmcache_config.LMCacheEngineConfig.from_file(str(CONFIGS / name))


def _plugin_keys(cfg: Any) -> dict[str, Any]:
    return {k[len(PREFIX):]: v for k, v in (cfg.extra_config or {}).items() if k.startswith(PREFIX)}


def test_every_config_is_here():
    assert set(NAMES) <= {p.name for p in CONFIGS.glob("*.yaml")}


@pytest.mark.parametrize("name", NAMES)
def test_loads_with_lmcache_and_names_the_plugin(name):
    text = (CONFIGS / name).read_text()
    assert text.lstrip().startswith("#"), "each example opens with a comment saying what it is for"
    cfg = _load(name)
    assert cfg.remote_storage_plugins == [PLUGIN]
    # LMCache 0.5 builds one RemoteBackend per remote_storage_plugins entry (dialling
    # plugin://valkey) and a second one from remote_url: the examples must not set it.
    assert cfg.remote_url is None
    assert cfg.remote_serde == "naive"
    assert cfg.local_cpu is True and cfg.max_local_cpu_size > 0  # the remote backend's buffer
    assert cfg.pre_caching_hash_algorithm == "sha256_cbor"
    keys = _plugin_keys(cfg)
    assert keys["module_path"] == "lmcache_valkey.integrations.lmcache.adapter"
    assert keys["class_name"] == "ValkeyConnectorAdapter"
    for required in ("url", "tenant", "transport"):
        assert required in keys, required
    unknown = set(keys) - KNOWN_KEYS - LMCACHE_OWN_KEYS - TIERING_KEYS
    assert not unknown, f"keys our settings do not know: {sorted(unknown)}"


def test_module_path_and_class_name_resolve():
    from lmcache.v1.storage_backend.connector import ConnectorAdapter

    keys = _plugin_keys(_load("tcp.yaml"))
    cls = getattr(importlib.import_module(keys["module_path"]), keys["class_name"])
    assert issubclass(cls, ConnectorAdapter)
    assert cls().can_parse(f"plugin://{PLUGIN}")


def _localize(keys: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    """Point file settings at files that exist here (the examples name pod mount paths)."""
    out = dict(keys)
    for k in ("password_file", "tls_ca_file", "tls_cert_file", "tls_key_file"):
        if k in out:
            path = tmp_path / k
            path.write_text("secret\n")
            out[k] = str(path)
    if "tenant_secret_file" in out:
        path = tmp_path / "tenant_secret"
        path.write_text("a-tenant-secret-of-32-characters\n")
        out["tenant_secret_file"] = str(path)
    return out


@pytest.mark.parametrize("name", NAMES)
def test_plugin_keys_validate(name, tmp_path):
    keys = _localize(_plugin_keys(_load(name)), tmp_path)
    tiering = {k: v for k, v in keys.items() if k in TIERING_KEYS and k not in KNOWN_KEYS}
    connection = {k: v for k, v in keys.items() if k not in tiering}
    settings = settings_from_mapping(connection, env={})
    check_tenant_secret(settings)  # a worker of this example starts (a named tenant gives its secret)
    assert settings.tenant == keys["tenant"]
    assert settings.transport == keys["transport"]
    if name == "multi-tenant.yaml":
        assert settings.tls is not None and settings.username == "team-a" and settings.password == "secret"
    if name == "fabric.yaml":
        assert settings.fabric is not None
    if tiering:
        assert tiering_settings_from_mapping is not None
        ts = tiering_settings_from_mapping(tiering, key_prefix=PREFIX)
        assert ts.mode == "embedded" and ts.nvme_dir and ts.s3_bucket


# --- the examples drive LMCache's storage stack against real servers --------------------------
def _round_trip(settings: dict[str, Any]) -> None:
    import threading

    from lmcache_valkey.integrations.lmcache.stack import Layout, build_stack

    import torch

    layout = Layout(model="cfg-model", num_layers=2, num_kv_heads=2, head_dim=32, chunk_size=16, dtype=torch.bfloat16)
    stack = build_stack(layout, plugin_settings=settings, cpu_gb=0.25)
    try:
        assert stack.connector is not None, "plugin failed to start (see the log)"
        remote = stack.remote
        keys = [layout.key(7000 + i) for i in range(3)]
        objs = [stack.allocate(fill=i + 1) for i in range(3)]
        want = [bytes(o.tensor.view(torch.uint8).view(-1).tolist()) for o in objs]
        done = threading.Semaphore(0)
        remote.batched_submit_put_task(keys, objs, on_complete_callback=lambda _k: done.release())
        for _ in keys:
            assert done.acquire(timeout=30), "put did not complete"
        assert remote.batched_contains(keys) == 3
        got = remote.get_blocking(keys[1])
        assert got is not None
        assert bytes(got.tensor.view(torch.uint8).view(-1).tolist()) == want[1]
        got.ref_count_down()
        for o in objs:
            o.ref_count_down()
    finally:
        stack.close()


def test_tcp_example_round_trip(valkey_server):
    keys = _plugin_keys(_load("tcp.yaml"))
    keys["url"] = valkey_server.url
    _round_trip({k: v for k, v in keys.items() if k not in LMCACHE_OWN_KEYS})


def test_multi_tenant_example_round_trip_with_acl_and_tls(valkey_tls_server, tmp_path):
    from support.acl_lines import acl_lines, setuser

    server = valkey_tls_server
    keys = _localize(_plugin_keys(_load("multi-tenant.yaml")), tmp_path)
    user = keys["username"]
    setuser(server, acl_lines((CONFIGS / "multi-tenant.yaml").read_text())[user], "team-a-pw")  # the documented line
    (tmp_path / "password").write_text("team-a-pw\n")
    keys.update(url=server.url, tls_ca_file=server.tls.ca_file, password_file=str(tmp_path / "password"))
    _round_trip({k: v for k, v in keys.items() if k not in LMCACHE_OWN_KEYS})
    # the tenant's user cannot touch another tenant's keys
    with pytest.raises(Exception, match="NOPERM"):
        server.cmd("SET", "lmcv:team-b:x", "1", auth=(user, "team-a-pw"))


@pytest.mark.parametrize("name", NAMES)
def test_adapter_settings_accept_the_config(name, tmp_path):
    from lmcache_valkey.integrations.lmcache.adapter import parse_plugin_settings

    cfg = _load(name)
    extra = dict(cfg.extra_config)
    for k, v in _localize(_plugin_keys(cfg), tmp_path).items():
        extra[PREFIX + k] = v
    parse_plugin_settings(extra, PLUGIN, env={})
