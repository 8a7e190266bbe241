"""A secret typed into the wrong place never comes back out (issue 28, item 3).

The usual slips -- a misspelt key in a URL's query string, in LMCache YAML's extra_config,
in an MP adapter_params object, in vLLM's and SGLang's tier settings, in tierd's --set, a
password typed into password_file, a misspelt environment variable -- are made with a
distinctive secret, and every error message, log record and ``doctor --json`` output is
searched for any piece of it."""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
from typing import Any, Callable

import pytest

from lmcache_valkey.config import settings_from_mapping, settings_from_url
from lmcache_valkey.errors import ConfigError
from lmcache_valkey.settings import load_settings, plugin_keys, plugin_prefix
from support.servers import free_port

SECRET = "Kx9~S3CRETtypo_Vb2q"
# Misspelt or misplaced keys a person may put a password (or tenant secret) under.
TYPOS = ("passwrd", "pasword", "passw0rd", "pass", "pwd", "password_fle", "tenant_secert", "tenantsecret",
         "secret", "Password", "auth")


def _pieces(secret: str = SECRET, n: int = 5) -> list[str]:
    """Every run of n characters of the secret: 'any part of it'."""
    return [secret[i:i + n] for i in range(len(secret) - n + 1)]


def _assert_clean(text: str, where: str) -> None:
    leaked = [p for p in _pieces() if p in text]
    assert not leaked, f"{where} shows {leaked!r}: {text}"


def _refusal(make: Callable[[], Any]) -> str:
    with pytest.raises(ConfigError) as e:
        make()
    err = e.value
    # The message, and every field a caller may format on its own (a log line, a --json field).
    return " | ".join(str(x) for x in (err, err.key, err.expected, err.got, repr(err), err.args))


def _dead_url() -> str:
    return f"valkey://127.0.0.1:{free_port()}"


def _url_typos() -> list[str]:
    base = _dead_url()
    out = [f"{base}?{k}={SECRET}" for k in TYPOS]
    out += [
        f"{base}?tenant=a&{TYPOS[0]}={SECRET}",
        f"valkey://user:{SECRET}@127.0.0.1:1?passwrd=x",  # credentials, then a bad query key
        f"valkey://:{SECRET}127.0.0.1:1",  # the '@' forgotten
        f"valkey://127.0.0.1:1?{SECRET}",  # the secret alone, as a query key
        f"http://127.0.0.1:1?password={SECRET}",  # a wrong scheme
        f"127.0.0.1:1?password={SECRET}",  # no scheme
        f"valkey://127.0.0.1:notaport?password={SECRET}",
        f"unix://relative.sock?password={SECRET}",
    ]
    return out


@pytest.mark.parametrize("url", _url_typos())
def test_misspelt_keys_in_a_url_show_no_secret(url, caplog):
    caplog.set_level(logging.DEBUG)
    text = _refusal(lambda: settings_from_url(url, env={}))
    _assert_clean(text, "the error")
    _assert_clean(caplog.text, "the log")


@pytest.mark.parametrize("key", TYPOS + ("password_file", "tenant_secret_file"))
def test_misspelt_or_misplaced_keys_in_every_settings_table_show_no_secret(key, caplog, tmp_path):
    """The same slip through each component's entry point, as the user wrote it."""
    from lmcache_valkey.integrations.lmcache_mp.config import LmcvL2AdapterConfig
    from lmcache_valkey.integrations.sglang.settings import parse_backend_settings
    from lmcache_valkey.integrations.vllm.settings import parse_tier_settings
    from lmcache_valkey.tiering.tierd import add_tierd_arguments, settings_from_tierd_args

    caplog.set_level(logging.DEBUG)
    url = _dead_url()
    raw = {"url": url, key: SECRET}
    extra_config = {plugin_prefix("valkey") + k: v for k, v in raw.items()}  # LMCache YAML's extra_config
    tierd_args = add_tierd_arguments(argparse.ArgumentParser()).parse_args(
        ["--valkey-url", url, "--tenant", "t", "--nvme-dir", str(tmp_path), "--set", f"{key}={SECRET}"])
    entry_points = {
        "settings_from_mapping": lambda: settings_from_mapping(raw, env={}),
        "extra_config": lambda: load_settings(plugin_keys(extra_config, "valkey"), key_prefix=plugin_prefix("valkey"),
                                              env={}),
        "adapter_params": lambda: LmcvL2AdapterConfig.from_dict({"type": "plugin", **raw}),
        "vllm tier": lambda: parse_tier_settings(raw, "valkey", env={}),
        "sglang": lambda: parse_backend_settings(raw, env={}),
        "tierd --set": lambda: settings_from_tierd_args(tierd_args),
    }
    for where, make in entry_points.items():
        text = _refusal(make)
        assert key.lower() in text.lower() or "--set" in text, (where, text)  # the key is still named
        _assert_clean(text, where)
    _assert_clean(caplog.text, "the log")


def test_slips_of_shape_show_no_secret(caplog):
    """Not a misspelt key but a misshapen entry: a secret-bearing adapter_params given as a
    string, tierd's --set without '=', a password given as a number."""
    from lmcache_valkey.integrations.lmcache_mp.config import LmcvL2AdapterConfig
    from lmcache_valkey.tiering.tierd import add_tierd_arguments, settings_from_tierd_args

    caplog.set_level(logging.DEBUG)
    args = add_tierd_arguments(argparse.ArgumentParser()).parse_args(
        ["--valkey-url", _dead_url(), "--tenant", "t", "--set", f"password:{SECRET}"])
    for make in (lambda: LmcvL2AdapterConfig.from_dict(f'{{"password": "{SECRET}"}}'),
                 lambda: settings_from_tierd_args(args)):
        _assert_clean(_refusal(make), "the error")
    _assert_clean(_refusal(lambda: settings_from_mapping({"password": 1234567890123}, env={})), "the error")
    _assert_clean(caplog.text, "the log")


def test_a_misspelt_environment_variable_is_named_not_shown(caplog):
    caplog.set_level(logging.DEBUG)
    env = {"LMCACHE_VALKEY_PASWORD": SECRET, "LMCACHE_VALKEY_TENANT_SECERT": SECRET}
    s = settings_from_mapping({"url": _dead_url()}, env=env)
    assert s.password is None and s.tenant_secret is None
    assert "LMCACHE_VALKEY_PASWORD" in caplog.text and "LMCACHE_VALKEY_TENANT_SECERT" in caplog.text
    _assert_clean(caplog.text, "the log")


def _doctor(*args: str, env: dict[str, str] | None = None) -> str:
    p = subprocess.run([sys.executable, "-m", "lmcache_valkey", "doctor", "--json", *args], capture_output=True,
                       text=True, timeout=120, env={**os.environ, **(env or {})})
    if p.returncode != 2:
        json.loads(p.stdout)  # a report was written
    return p.stdout + p.stderr


def test_doctor_json_shows_no_secret_whatever_was_mistyped(tmp_path):
    url = _dead_url()
    yaml_file = tmp_path / "lmcache.yaml"
    yaml_file.write_text("chunk_size: 256\nremote_storage_plugins: [valkey]\nextra_config:\n"
                         f"  remote_storage_plugin.valkey.url: {url}\n"
                         f"  remote_storage_plugin.valkey.passwrd: {SECRET}\n")
    outputs = {
        "the issue's URL": _doctor("--url", f"{url}?passwrd={SECRET}"),
        "a URL with credentials": _doctor("--url", f"valkey://u:{SECRET}@127.0.0.1:1?passwrd=x"),
        "YAML extra_config": _doctor("--config", str(yaml_file)),
        "a misspelt env variable": _doctor("--url", url, "--transport", "tcp",
                                           env={"LMCACHE_VALKEY_PASWORD": SECRET}),
        "a password in password_file": _doctor("--url", url, "--transport", "tcp",
                                               env={"LMCACHE_VALKEY_PASSWORD_FILE": SECRET}),
    }
    for where, text in outputs.items():
        _assert_clean(text, f"doctor ({where})")
    assert "passwrd" in outputs["the issue's URL"]  # the key is still named
