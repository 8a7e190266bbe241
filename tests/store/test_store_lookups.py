"""ChunkStore lookups: a prefix for LMCache, every key answered for engines that scan their own way."""

from __future__ import annotations


import pytest

from lmcache_valkey.codec import ChunkMeta
from lmcache_valkey.keys import make_namespace
from lmcache_valkey.store import ChunkRef, open_store

pytestmark = pytest.mark.timeout(60)

NS = make_namespace("lmcv", "default", {"model": "lookup-test"})
META = ChunkMeta(shapes=((64,),), dtypes=("uint8",), fmt=0)


def refs(n: int) -> list[ChunkRef]:
    return [ChunkRef(NS.chunk_id(f"key-{i}"), f"key-{i}") for i in range(n)]


async def test_contains_each_answers_every_key_in_one_pass_while_prefix_stops_at_the_first_gap(valkey_server) -> None:
    store = await open_store(valkey_server.settings(transport="tcp"), NS)
    try:
        r = refs(5)
        stored = [r[0], r[2], r[4]]
        assert all(await store.put_many([(x, META, memoryview(bytes(64))) for x in stored]))
        ids = [x.chunk_id for x in r]
        assert await store.contains_each(ids) == [True, False, True, False, True]
        assert await store.contains_prefix(ids) == 1
        assert await store.contains_each(list(reversed(ids))) == [True, False, True, False, True][::-1]
        assert await store.contains_each([]) == []
    finally:
        await store.close()



async def test_contains_each_with_a_dead_server_answers_misses_not_an_error(valkey_server) -> None:
    store = await open_store(valkey_server.settings(transport="tcp", lookup_timeout_s=0.5, connect_timeout_s=0.5), NS)
    try:
        valkey_server.kill9()
        assert await store.contains_each([x.chunk_id for x in refs(3)]) == [False, False, False]
    finally:
        await store.close()

