"""Every component parses its settings, and every adapter names its namespace and opens its store, the same way."""

import pytest

from lmcache_valkey.config import settings_from_mapping
from lmcache_valkey.errors import ConfigError
from lmcache_valkey.keys import make_namespace
from lmcache_valkey.session import StoreSession, namespace_for
from lmcache_valkey.settings import load_settings


def test_a_bad_core_key_is_named_as_the_user_wrote_it():
    with pytest.raises(ConfigError) as e:
        load_settings({"url": "valkey://h:6379", "tenant": "a:b"}, key_prefix="adapter_params.", env={})
    assert e.value.key == "adapter_params.tenant"


def test_a_bad_tiering_key_is_named_as_the_user_wrote_it():
    with pytest.raises(ConfigError) as e:
        load_settings({"url": "valkey://h:6379", "tiering": "embedded"}, key_prefix="adapter_params.", env={})
    assert e.value.key == "adapter_params.tiering"


def test_an_unknown_key_is_refused():
    with pytest.raises(ConfigError) as e:
        load_settings({"url": "valkey://h:6379", "tenantt": "x"}, key_prefix="p.", env={})
    assert e.value.key == "p.tenantt"


def test_core_and_tiering_keys_are_split():
    settings, tiering = load_settings(
        {"url": "valkey://h:6379", "tenant": "t1", "tiering": "service"}, env={}
    )
    assert settings.tenant == "t1" and tiering.mode == "service" and tiering.enabled


def test_the_namespace_always_carries_the_model_revision():
    fields = {"model": "m", "kv_dtype": "bf16"}
    a = namespace_for(settings_from_mapping({"model_revision": "r1"}, env={}), fields)
    b = namespace_for(settings_from_mapping({"model_revision": "r2"}, env={}), fields)
    assert a.digest != b.digest
    # the same digest the in-process plugin computed before the revision moved here
    assert a == make_namespace("lmcv", "default", {**fields, "revision": "r1"})


def test_an_unreachable_server_fails_the_session_and_stops_its_loop():
    settings = settings_from_mapping({"url": "valkey://127.0.0.1:1", "connect_timeout_s": 0.2, "transport": "tcp"}, env={})
    import threading

    before = {t.name for t in threading.enumerate()}
    with pytest.raises(Exception):
        StoreSession(settings, namespace_for(settings, {"model": "m"}), name="lmcv-test-session")
    assert "lmcv-test-session" not in {t.name for t in threading.enumerate()} - before
