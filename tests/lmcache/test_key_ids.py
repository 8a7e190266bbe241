"""A lookup's chunk ids, taken by chunk hash instead of each key's string, are the very ids
the key strings give: for one request's keys, and for every batch the shortcut must refuse."""

from __future__ import annotations

import torch
from lmcache.utils import CacheEngineKey, LayerCacheEngineKey

from lmcache_valkey.integrations.lmcache import key_ids
from lmcache_valkey.integrations.lmcache.key_ids import EngineKeyIds
from lmcache_valkey.keys import ChunkIds, make_namespace

from conftest_helpers import SMALL, filled, put_and_wait


def _ids() -> ChunkIds:
    return ChunkIds(make_namespace("lmcv", "t", {"model": "m"}))


def _keys(n: int, *, model: str = "m", worker: int = 0, start: int = 0, **kw) -> list[CacheEngineKey]:
    return [CacheEngineKey(model, 2, worker, (start + i) * 0x9E3779B97F4A7C15 % (1 << 63), torch.bfloat16, **kw)
            for i in range(n)]


def _by_string(ids: ChunkIds, keys) -> list[str]:
    return [ids.namespace.chunk_id(k.to_string()) for k in keys]


def test_the_installed_lmcache_key_class_is_the_one_the_shortcut_was_written_for() -> None:
    # (if LMCache adds a field, the shortcut turns itself off, and this says so)
    assert key_ids._fast_path_exact()
    assert EngineKeyIds(_ids())._fast


def test_a_request_looked_up_twice_gets_the_ids_of_its_key_strings() -> None:
    ids = _ids()
    k = EngineKeyIds(ids)
    keys = _keys(64)
    assert k.many(keys) == _by_string(ids, keys)
    assert k.many(keys) == _by_string(ids, keys)  # (from the shortcut now)
    assert k._entries == 64
    longer = _keys(96)  # the same prompt grown by 32 chunks, new key objects
    assert k.many(longer) == _by_string(ids, longer)
    assert k._entries == 96


def test_the_same_chunk_hashes_of_another_model_rank_or_dtype_are_other_ids() -> None:
    ids = _ids()
    k = EngineKeyIds(ids)
    base = _keys(16)
    assert k.many(base) == _by_string(ids, base)
    for other in (_keys(16, model="m2"), _keys(16, worker=1),
                  [CacheEngineKey("m", 2, 0, x.chunk_hash, torch.float16) for x in base]):
        got = k.many(other)
        assert got == _by_string(ids, other)
        assert not set(got) & set(k.many(base))


def test_batches_the_shortcut_refuses_still_get_their_exact_ids() -> None:
    ids = _ids()
    k = EngineKeyIds(ids)
    mixed = _keys(8) + _keys(8, worker=1, start=8)  # two contexts in one lookup
    tagged = _keys(16, request_configs={"lmcache.tag.user": "alice"})
    tagged_int = _keys(16, request_configs={"lmcache.tag.user": 1})
    tagged_bool = _keys(16, request_configs={"lmcache.tag.user": True})  # == 1, prints "True"
    plain = [CacheEngineKey("m", 2, 0, 7 + i, torch.bfloat16) for i in range(16)]
    layers = [LayerCacheEngineKey("m", 2, 0, 7 + i, torch.bfloat16, layer_id=i) for i in range(16)]
    assert k.many(plain) == _by_string(ids, plain)  # (the same hashes, known now)
    bytes_hashes = [CacheEngineKey("m", 2, 0, bytes([i]) * 8, torch.bfloat16) for i in range(16)]
    few = _keys(3)
    for batch in (mixed, tagged, tagged_int, tagged_bool, layers, bytes_hashes, few):
        assert k.many(batch) == _by_string(ids, batch)
    assert k.many(tagged_int) != k.many(tagged_bool)
    assert not set(k.many(layers)) & set(k.many(plain))


def test_fields_equal_in_value_but_printed_differently_are_never_taken_for_each_other() -> None:
    """``True == 1 == 1.0`` and they hash alike, yet a key string prints each its own way."""
    ids = _ids()
    k = EngineKeyIds(ids)
    def make(ws, wid):
        return [CacheEngineKey("m", ws, wid, 7 + i, torch.bfloat16) for i in range(16)]

    variants = [make(1, 0), make(True, 0), make(1.0, 0), make(1, False), make(1, 0.0)]
    mixed = variants[0][:8] + variants[1][8:]  # one lookup, both kinds
    for batch in (*variants, mixed):
        assert k.many(batch) == _by_string(ids, batch)
    hashes_as_bools = [CacheEngineKey("m", 2, 0, h, torch.bfloat16) for h in (False, True) * 8]
    ints = [CacheEngineKey("m", 2, 0, h, torch.bfloat16) for h in (0, 1) * 8]
    assert k.many(ints) == _by_string(ids, ints)
    assert k.many(hashes_as_bools) == _by_string(ids, hashes_as_bools)


def test_the_shortcuts_are_bounded_and_forgotten_at_once() -> None:
    ids = _ids()
    k = EngineKeyIds(ids, max_entries=40)
    for start in range(0, 200, 16):
        batch = _keys(16, start=start)
        assert k.many(batch) == _by_string(ids, batch)
        assert k._entries <= 40
        assert sum(map(len, k._by_context.values())) == k._entries


def test_the_connector_finds_by_id_what_it_stored_by_key_string(make_stack, valkey_server) -> None:
    """Through LMCache's RemoteBackend: a put names chunks by key string, a lookup of new key
    objects by the shortcut, and finds them (and a prompt grown since, up to its new part)."""
    stack = make_stack({"url": valkey_server.url})
    keys = [SMALL.key(1000 + i) for i in range(12)]
    objs = [filled(stack, i) for i in range(12)]
    put_and_wait(stack, keys, objs)
    for o in objs:
        o.ref_count_down()
    for _ in range(2):
        assert stack.remote.batched_contains([SMALL.key(1000 + i) for i in range(12)]) == 12
        assert stack.remote.batched_contains([SMALL.key(1000 + i) for i in range(20)]) == 12
