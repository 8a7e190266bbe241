"""Chunk ids and namespace digests are keyed per tenant; the tenant's secret is checked at
start-up and never shown."""

import pytest

from lmcache_valkey.config import Settings, settings_from_mapping
from lmcache_valkey.errors import ConfigError
from lmcache_valkey.keys import ChunkIds, make_namespace
from lmcache_valkey.session import namespace_for

FIELDS = {"model": "m", "kv_dtype": "bf16", "chunk_size": 256}
SECRET = "0123456789abcdef-team-a-secret"


def test_equal_prompts_of_two_tenants_never_share_a_key():
    a, b = make_namespace("lmcv", "a", FIELDS), make_namespace("lmcv", "b", FIELDS)
    assert a.digest != b.digest and a.chunk_id("prompt") != b.chunk_id("prompt")
    assert a.key_digest("prompt") != b.key_digest("prompt")


def test_without_the_secret_nobody_computes_a_tenants_ids():
    with_secret = make_namespace("lmcv", "a", FIELDS, secret=SECRET.encode())
    guesses = [make_namespace("lmcv", "a", FIELDS), make_namespace("lmcv", "a", FIELDS, secret=b"another secret!!")]
    for g in guesses:
        assert g.digest != with_secret.digest and g.chunk_id("prompt") != with_secret.chunk_id("prompt")
    again = make_namespace("lmcv", "a", FIELDS, secret=SECRET.encode())  # another worker of tenant a
    assert again.data_key(again.chunk_id("prompt")) == with_secret.data_key(with_secret.chunk_id("prompt"))
    assert SECRET not in repr(with_secret)
    import pickle

    assert pickle.loads(pickle.dumps(with_secret)).chunk_id("prompt") == with_secret.chunk_id("prompt")


def test_the_secret_comes_from_a_value_a_file_or_the_environment(tmp_path):
    f = tmp_path / "secret"
    f.write_text(SECRET + "\n")
    for raw, env in [({"tenant_secret": SECRET}, {}), ({"tenant_secret_file": str(f)}, {}),
                     ({}, {"LMCACHE_VALKEY_TENANT_SECRET": SECRET}),
                     ({}, {"LMCACHE_VALKEY_TENANT_SECRET_FILE": str(f)})]:
        s = settings_from_mapping({"tenant": "a", **raw}, env=env)
        assert s.tenant_secret == SECRET.encode() and SECRET not in repr(s)
        assert namespace_for(s, FIELDS).chunk_id("p") == make_namespace("lmcv", "a", {**FIELDS, "revision": ""},
                                                                        secret=SECRET.encode()).chunk_id("p")
    assert settings_from_mapping({}, env={}).tenant_secret is None


@pytest.mark.parametrize("raw,env,key", [
    ({"tenant_secret": "short-secret"}, {}, "tenant_secret"),
    ({"tenant_secret": 12345678901234567890}, {}, "tenant_secret"),
    ({}, {"LMCACHE_VALKEY_TENANT_SECRET": "short-secret"}, "LMCACHE_VALKEY_TENANT_SECRET"),
    ({"tenant_secret_file": "/nonexistent/secret"}, {}, "tenant_secret_file"),
])
def test_a_bad_secret_fails_at_start_up_naming_the_key_not_the_secret(raw, env, key):
    with pytest.raises(ConfigError) as e:
        settings_from_mapping(raw, env=env)
    assert e.value.key == key
    assert "short-secret" not in str(e.value) and "1234567890" not in str(e.value)


def test_a_worker_of_a_named_tenant_without_a_secret_refuses_to_start_naming_both_fixes():
    for s in (settings_from_mapping({"tenant": "team-a"}, env={}), Settings(tenant="team-a")):
        with pytest.raises(ConfigError) as e:
            namespace_for(s, FIELDS)
        assert e.value.key == "tenant_secret"
        for fix in ("tenant_secret_file", "LMCACHE_VALKEY_TENANT_SECRET_FILE", "require_tenant_secret: false",
                    "LMCACHE_VALKEY_REQUIRE_TENANT_SECRET=0"):
            assert fix in str(e.value)
    namespace_for(settings_from_mapping({}, env={}), FIELDS)  # the default tenant: no secret needed
    namespace_for(settings_from_mapping({"tenant": "team-a", "tenant_secret": SECRET}, env={}), FIELDS)


@pytest.mark.parametrize("raw,env", [
    ({"require_tenant_secret": False}, {}),
    ({"url": "valkey://h:6379?require_tenant_secret=no"}, {}),
    ({}, {"LMCACHE_VALKEY_REQUIRE_TENANT_SECRET": "0"}),
    ({"require_tenant_secret": "false"}, {"LMCACHE_VALKEY_REQUIRE_TENANT_SECRET": "1"}),  # the key wins
])
def test_the_opt_out_is_an_explicit_setting_or_its_environment_variable(raw, env):
    s = settings_from_mapping({"tenant": "team-a", **raw}, env=env)
    assert s.require_tenant_secret is False
    ns = namespace_for(s, FIELDS)
    assert ns.secret is None and ns.chunk_id("p") == make_namespace("lmcv", "team-a", {**FIELDS, "revision": ""}).chunk_id("p")


def test_a_bad_opt_out_value_fails_at_start_up():
    with pytest.raises(ConfigError) as e:
        settings_from_mapping({"tenant": "team-a"}, env={"LMCACHE_VALKEY_REQUIRE_TENANT_SECRET": "maybe"})
    assert e.value.key == "LMCACHE_VALKEY_REQUIRE_TENANT_SECRET"


def test_remembered_ids_are_the_ids_the_namespace_derives_and_stay_bounded():
    ns = make_namespace("lmcv", "acme", {"model": "m"}, secret=b"s" * 32)
    ids = ChunkIds(ns, max_entries=8)
    strings = [f"m@1@0@{i:x}@bfloat16" for i in range(20)]
    assert ids.many(strings) == [ns.chunk_id(s) for s in strings]
    assert ids.many(strings[:5]) == [ns.chunk_id(s) for s in strings[:5]]  # asked again
    assert ids.of(strings[7]) == ns.chunk_id(strings[7])
    assert len(ids._ids) <= 8
    assert ns.data_keys(ids.many(strings[:3])) == [ns.data_key(ns.chunk_id(s)) for s in strings[:3]]
    assert ns.marker_keys(["ab"]) == [ns.marker_key("ab")] == [f"{ns.base}:t:{{ab}}".encode()]


def test_a_lookups_keys_built_in_one_pass_are_each_ids_own_key_even_for_an_id_with_a_newline():
    ns = make_namespace("lmcv", "acme", {"model": "m"})
    many = [ns.chunk_id(f"k{i}") for i in range(600)]
    assert ns.data_keys(many) == [ns.data_key(c) for c in many]
    assert ns.marker_keys(many) == [ns.marker_key(c) for c in many]
    odd = many[:10] + ["not\nhex"] + many[10:20]  # the one-pass split would count it twice
    assert ns.data_keys(odd) == [ns.data_key(c) for c in odd]
