"""A user's settings are checked once, at start-up, with errors that name the key."""

import re

import pytest

from lmcache_valkey.config import settings_from_mapping, settings_from_url
from lmcache_valkey.errors import ConfigError
from lmcache_valkey.settings import load_settings, plugin_keys

P = "remote_storage_plugin.valkey."


def test_extra_config_keys_become_typed_settings(tmp_path):
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    s, _ = load_settings(plugin_keys(
        {
            P + "module_path": "lmcache_valkey.integrations.lmcache.adapter",
            P + "class_name": "ValkeyConnectorAdapter",
            P + "url": "valkey://10.0.0.1:7000,10.0.0.2:7001/0",
            P + "username": "tenant-a",
            P + "password_file": str(pw),
            P + "tenant": "tenant-a",
            P + "op_timeout_s": "2.5",
            P + "lookup_timeout_s": 0.25,
            P + "connections_per_node": 8,
            P + "ttl_s": 3600,
            P + "max_chunk_bytes": "64MiB",
            P + "transport": "TCP",
            "some_other_plugin.key": "ignored",
        },
        "valkey",
    ), key_prefix=P)
    assert [n.name for n in s.nodes] == ["10.0.0.1:7000", "10.0.0.2:7001"]
    assert (s.username, s.password, s.tenant) == ("tenant-a", "s3cret", "tenant-a")
    assert (s.op_timeout_s, s.lookup_timeout_s, s.connections_per_node) == (2.5, 0.25, 8)
    assert s.ttl_s == 3600 and s.max_chunk_bytes == 64 << 20 and s.transport == "tcp"
    assert "s3cret" not in repr(s)


@pytest.mark.parametrize(
    "key,value,named",
    [
        ("url", "http://x:1", "url"),
        ("url", "valkey://host:99999", "url"),
        ("op_timeout_s", "soon", "op_timeout_s"),
        ("op_timeout_s", -1, "op_timeout_s"),
        ("connections_per_node", 0, "connections_per_node"),
        ("transport", "carrier-pigeon", "transport"),
        ("prefix_lookup", "guess", "prefix_lookup"),
        ("tenant", "a:b", "tenant"),
        ("max_chunk_bytes", "lots", "max_chunk_bytes"),
        ("tls_ca_file", "/nonexistent/ca.pem", "tls_ca_file"),
        ("conections_per_node", 4, "conections_per_node"),
    ],
)
def test_malformed_setting_fails_naming_the_key(key, value, named):
    with pytest.raises(ConfigError) as e:
        load_settings(plugin_keys({P + key: value}, "valkey"), key_prefix=P)
    assert e.value.key == P + named
    assert P + named in str(e.value)


def test_lookup_deadline_cannot_exceed_op_deadline():
    with pytest.raises(ConfigError, match="lookup_timeout_s"):
        settings_from_mapping({"op_timeout_s": 1, "lookup_timeout_s": 2})


def test_tls_url_and_unix_socket_and_env_secrets(tmp_path):
    s = settings_from_url("valkeys://cache.example:6380", env={"LMCACHE_VALKEY_PASSWORD": "envpw"})
    assert s.tls is not None and s.tls.verify and s.password == "envpw"
    u = settings_from_url("unix:///run/valkey.sock?tenant=t1")
    assert u.nodes[0].path == "/run/valkey.sock" and u.tenant == "t1" and u.tls is None
    with pytest.raises(ConfigError, match="url\\?bogus"):
        settings_from_url("valkey://h:1?bogus=1")


def test_url_credentials_are_used_when_no_explicit_ones():
    s = settings_from_url("valkey://alice:p%40ss@h:6379", env={})
    assert (s.username, s.password) == ("alice", "p@ss")


def test_errors_never_echo_secrets():
    with pytest.raises(ConfigError) as e:
        settings_from_mapping({"url": "valkeyss://alice:hunter2@h:1"})
    assert "hunter2" not in str(e.value)
    with pytest.raises(ConfigError) as e:
        settings_from_mapping({"password": 12345678})
    assert "12345678" not in str(e.value)


@pytest.mark.parametrize(
    "raw",
    [
        {"url": "valkey://h:0"},
        {"url": "valkey://a:1,b:2/3"},  # a database number with several (cluster) seeds
        {"lookup_timeout_s": 1e308},
        {"max_chunk_bytes": "1GiB"},
    ],
)
def test_values_that_could_only_fail_later_fail_now(raw):
    with pytest.raises(ConfigError):
        settings_from_mapping(raw, env={})


@pytest.mark.parametrize("password", ["Qz?Kx7", "Qz/Kx?W", "Qz#Kx", "Q@z:K?x", "77?Qz", "77/Qz", "Qz?a=b"])
def test_a_password_with_url_delimiters_parses_or_fails_without_quoting_it(password):
    url = f"valkey://alice:{password}@127.0.0.1:6379"
    s = settings_from_url(url, env={})
    assert (s.username, s.password, [n.name for n in s.nodes]) == ("alice", password, ["127.0.0.1:6379"])
    pieces = [p for p in re.split(r"[^A-Za-z0-9]", password) if len(p) >= 2]
    for bad in (f"valkey://alice:{password}@127.0.0.1:99999", f"valkey://{password}@h:1/99",
                f"valkey://alice:{password}@h:1?nope=1", f"valkey://{password}@", f"valkey://{password}@h:x"):
        with pytest.raises(ConfigError) as e:
            settings_from_url(bad, env={})
        assert not [p for p in pieces if p in str(e.value)], (bad, str(e.value))


def test_an_at_sign_in_the_query_is_not_a_userinfo(tmp_path):
    ca = tmp_path / "a@b"
    ca.mkdir()
    (ca / "ca.pem").write_text("x")
    s = settings_from_url(f"valkey://h:1?tls_ca_file={ca}/ca.pem", env={})
    assert s.password is None and [n.name for n in s.nodes] == ["h:1"] and s.tls.ca_file == f"{ca}/ca.pem"


def test_an_unknown_key_is_named_without_its_value():
    with pytest.raises(ConfigError) as e:
        settings_from_mapping({"pasword": "hunter2-secret"}, env={})
    assert "pasword" in str(e.value) and "hunter2" not in str(e.value)


@pytest.mark.parametrize("spelling,value", [(True, True), ("yes", True), ("On", True), ("1", True), (1, True),
                                            (False, False), ("no", False), ("off", False), ("0", False), (0, False)])
def test_a_boolean_means_the_same_in_core_and_tiering_keys(spelling, value):
    settings, tiering = load_settings({"tls": True, "tls_verify": spelling, "nvme_direct": spelling,
                                       "promote_to_nvme": spelling}, env={})
    assert (settings.tls.verify, tiering.nvme_direct, tiering.promote_to_nvme) == (value, value, value)


@pytest.mark.parametrize("key", ["tls_verify", "nvme_direct"])
@pytest.mark.parametrize("spelling", ["maybe", 2, 0.5, None, ""])
def test_a_non_boolean_is_refused_by_core_and_tiering_keys_alike(key, spelling):
    with pytest.raises(ConfigError) as e:
        load_settings({"tls": True, key: spelling}, key_prefix=P, env={})
    assert e.value.key == P + key and "boolean" in e.value.expected


@pytest.mark.parametrize("key", ["op_timeout_s", "s3_timeout_s", "breaker_reset_s", "marker_repair_s"])
@pytest.mark.parametrize("seconds", [0, -1, "nan", "inf", 2 * 86400, True])
def test_a_duration_has_the_same_bounds_in_core_and_tiering_keys(key, seconds):
    with pytest.raises(ConfigError) as e:
        load_settings({key: seconds}, key_prefix=P, env={})
    assert e.value.key == P + key and "seconds" in e.value.expected
