"""A tenant's chunk ids are keyed with its secret: another tenant that can list key names (an
ACL that still allows SCAN) and knows the model cannot tell whether a guessable prompt is
cached, and equal prompts of two tenants never share a key. Real LMCache, real Valkey."""

from __future__ import annotations

from dataclasses import replace

from conftest_helpers import SMALL, filled, put_and_wait
from lmcache_valkey.integrations.lmcache.connector import namespace_fields
from lmcache_valkey.session import namespace_for

SECRETS = {"alice": "alice-secret-0123456789abcdef", "bob": "bob-secret-fedcba9876543210"}
# The tenant line this project recommended before it became an allow-list: SCAN was allowed.
OLD_LINE = ["-@all", "+@read", "+@write", "+@connection", "+info"]


def _keys_bob_can_list(valkey_server) -> set[bytes]:
    cursor, seen = b"0", set()
    while True:
        cursor, keys = valkey_server.cmd("SCAN", cursor, "MATCH", "lmcv:alice:*", "COUNT", 1000, auth=("bob", "bob-pw"))
        seen.update(keys)
        if cursor == b"0":
            return seen


def test_a_listing_tenant_cannot_probe_another_tenants_prompts(valkey_server, make_stack):
    for user in SECRETS:
        valkey_server.cmd("ACL", "SETUSER", user, "on", f">{user}-pw", "resetkeys", f"~lmcv:{user}:*", *OLD_LINE)
    stacks = {u: make_stack({"url": valkey_server.url, "username": u, "password": f"{u}-pw", "tenant": u,
                             "tenant_secret": SECRETS[u]}) for u in SECRETS}
    alice, bob = stacks["alice"], stacks["bob"]
    prompt = [SMALL.key(i) for i in (1, 2)]  # "the guessable prompt": bob knows its tokens and the model
    for stack in (alice, bob):
        objs = [filled(stack, i) for i in (1, 2)]
        put_and_wait(stack, prompt, objs)
        for o in objs:
            o.ref_count_down()

    listed = _keys_bob_can_list(valkey_server)
    own = alice.connector.namespace
    assert {own.data_key(own.chunk_id(k.to_string())) for k in prompt} <= listed  # the chunks are there
    # Bob computes where alice would keep the prompt: with no secret, or with his own.
    fields = namespace_fields(bob.config, bob.metadata, bob.connector)
    for secret in (None, SECRETS["bob"].encode()):
        ns = namespace_for(replace(bob.connector.settings, tenant="alice", tenant_secret=secret,
                                   require_tenant_secret=False), fields)
        guesses = {ns.data_key(ns.chunk_id(k.to_string())) for k in prompt}
        assert not guesses & listed
        assert not any(g.split(b":c:")[0] in {k.split(b":c:")[0] for k in listed} for g in guesses)  # nor the model
    # the same prompt cached by both tenants: no key in common, and each reads its own
    mine = bob.connector.namespace
    assert {mine.chunk_id(k.to_string()) for k in prompt}.isdisjoint({own.chunk_id(k.to_string()) for k in prompt})
    for stack in (alice, bob):
        assert stack.remote.batched_contains(prompt) == 2
