"""One set of connections serves several namespaces (an engine with several layouts)."""

from __future__ import annotations


import pytest

from lmcache_valkey.codec import ChunkMeta
from lmcache_valkey.keys import make_namespace
from lmcache_valkey.store import ChunkRef, open_store

pytestmark = pytest.mark.timeout(60)

META = ChunkMeta(shapes=((16,),), dtypes=("uint8",), fmt=0)


async def test_a_view_for_another_namespace_shares_connections_and_keeps_chunks_apart(valkey_server) -> None:
    a = make_namespace("lmcv", "default", {"layout": "a"})
    b = make_namespace("lmcv", "default", {"layout": "b"})

    store = await open_store(valkey_server.settings(transport="tcp"), a)
    view = store.for_namespace(b)
    try:
        assert view.transport is store.transport and view.namespace == b
        ra, rb = ChunkRef(a.chunk_id("k"), "k"), ChunkRef(b.chunk_id("k"), "k")
        assert await store.put(ra, META, memoryview(b"A" * 16))
        assert await view.contains_prefix([rb.chunk_id]) == 0
        assert await view.put(rb, META, memoryview(b"B" * 16))
        dest = bytearray(16)
        assert await view.get_into(rb, memoryview(dest)) is not None and dest == b"B" * 16
        await view.close()  # the view owns nothing: the store still works
        assert await store.get_into(ra, memoryview(dest)) is not None and dest == b"A" * 16
    finally:
        await store.close()

