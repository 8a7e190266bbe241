"""Store sessions as an engine adapter holds one, for tests that drive a store directly."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from lmcache_valkey.codec import ChunkMeta
from lmcache_valkey.keys import Namespace
from lmcache_valkey.session import StoreSession
from lmcache_valkey.store import ChunkRef

SMALL_META = ChunkMeta(shapes=((64,),), dtypes=("uint8",), fmt=0)


@contextmanager
def opened(settings: Any, namespace: Namespace, tiering: Any = None) -> Iterator[StoreSession]:
    """A store session, closed after the block."""
    session = StoreSession(settings, namespace, tiering)
    try:
        yield session
    finally:
        session.close()


def put_small(session: StoreSession, chunk_ids: list[str], meta: ChunkMeta = SMALL_META) -> None:
    """Store a 64-byte chunk under each id (its id as its key string); every one must land."""
    items = [(ChunkRef(c, c), meta, memoryview(bytes(64))) for c in chunk_ids]
    assert all(session.run_sync(session.store.put_many(items), 20))
