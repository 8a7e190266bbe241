"""``load_into`` hands a missed buffer back only when no transfer can still write into it
(RMA: the server writes, maybe after the store gave up)."""

from __future__ import annotations

import asyncio

import pytest

from lmcache_valkey.config import Settings
from lmcache_valkey.keys import make_namespace
from lmcache_valkey.store import ChunkRef, ChunkStore

pytestmark = pytest.mark.timeout(30)

NS = make_namespace("lmcv", "default", {"model": "load-into"})


class LateReleaseTransport:
    """A corner case no server produces on demand: every item is absent, and the transport
    reports its transfer over only ``delay`` seconds later, from another thread's timer."""

    supports_release_callbacks = True

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.released_at: list[float] = []

    async def get_many_into(self, items, *, timeout, on_release=None):
        loop = asyncio.get_running_loop()
        for cb in on_release or ():
            loop.call_later(self.delay, lambda cb=cb: (self.released_at.append(loop.time()), cb()))
        return [None] * len(items)

    async def close(self) -> None:
        pass


async def test_load_into_returns_only_after_every_missed_buffer_is_released() -> None:
    transport = LateReleaseTransport(delay=0.2)
    store = ChunkStore(Settings(), NS, transport, transport_name="fabric")
    refs = [ChunkRef(NS.chunk_id(f"k{i}"), f"k{i}") for i in range(3)]
    results = await store.load_into([(r, memoryview(bytearray(16))) for r in refs])
    returned = asyncio.get_running_loop().time()
    assert results == [None] * 3
    assert len(transport.released_at) == 3 and max(transport.released_at) <= returned
    # get_many_into itself does not wait: its caller owns the callbacks.
    transport.released_at.clear()
    await store.get_many_into([(refs[0], memoryview(bytearray(16)))], on_release=lambda i: None)
    assert transport.released_at == []
    await asyncio.sleep(0.3)
    await store.close()



async def test_load_into_returns_when_no_transfer_ever_took_a_buffer() -> None:
    """Past the deadline before the first round, no transfer targets any buffer: each is
    handed back at once (it used to wait for a release no transport would ever send)."""
    transport = LateReleaseTransport(delay=0.2)
    store = ChunkStore(Settings(op_timeout_s=0.0), NS, transport, transport_name="fabric")
    refs = [ChunkRef(NS.chunk_id(f"k{i}"), f"k{i}") for i in range(2)]
    released = []
    results = await asyncio.wait_for(
        store.load_into([(r, memoryview(bytearray(16))) for r in refs]), timeout=10)
    assert results == [None, None] and transport.released_at == []
    await store.get_many_into([(refs[0], memoryview(bytearray(16)))], on_release=released.append)
    assert released == [0]
    await store.close()
