"""The store's logic against the in-memory transport: no server, so each check runs in
milliseconds (the same behaviours are checked against real Valkey in the other store tests)."""

from __future__ import annotations

import asyncio
import os

import pytest

from lmcache_valkey.codec import HEADER_SIZE, ChunkMeta
from lmcache_valkey.config import Settings
from lmcache_valkey.keys import make_namespace
from lmcache_valkey.store import ChunkRef, ChunkStore
from lmcache_valkey.transport.memory import MemoryTransport

NS = make_namespace("lmcv", "default", {"model": "memory-test"})
META = ChunkMeta(shapes=((4096,),), dtypes=("uint8",), fmt=0)


def ref(i: int) -> ChunkRef:
    return ChunkRef(NS.chunk_id(f"chunk{i}"), f"chunk{i}")


def store_on(transport: MemoryTransport) -> ChunkStore:
    return ChunkStore(transport.settings, NS, transport, transport_name="resp")


@pytest.fixture
def clock() -> list[float]:
    return [1_000_000.0]


@pytest.fixture
def transport(clock) -> MemoryTransport:
    return MemoryTransport(Settings(ttl_s=60.0), clock=lambda: clock[0])


async def test_chunks_round_trip_and_the_lookup_counts_the_stored_prefix(transport):
    store = store_on(transport)
    data = [os.urandom(4096) for _ in range(3)]
    assert await store.put_many([(ref(i), META, memoryview(d)) for i, d in enumerate(data)]) == [True] * 3
    assert await store.contains_prefix([ref(i).chunk_id for i in (0, 1, 2, 3)]) == 3
    assert await store.contains_each([ref(i).chunk_id for i in (3, 1)]) == [False, True]
    dest = bytearray(4096)
    parts = [memoryview(dest)[:1000], memoryview(dest)[1000:]]  # read into parts, in place
    got = await store.get_into(ref(1), parts)
    assert got is not None and got.nbytes == 4096 and bytes(dest) == data[1] and got.meta.shapes == META.shapes
    assert transport.calls["EXISTS"] == 2  # one pass per lookup


async def test_a_corrupt_chunk_is_a_counted_miss_and_is_deleted(transport):
    store = store_on(transport)
    assert await store.put(ref(0), META, memoryview(os.urandom(4096)))
    key = NS.data_key(ref(0).chunk_id)
    value = bytearray(await transport.command(b"GET", key, timeout=1))
    value[HEADER_SIZE + 7] ^= 0x55
    await transport.set(key, [bytes(value)], ttl_s=None, timeout=1)
    assert await store.get_into(ref(0), memoryview(bytearray(4096))) is None
    for _ in range(10):  # the bad copy is deleted in the background
        if not (await transport.exists_many([key], timeout=1))[0]:
            break
        await asyncio.sleep(0)
    assert await transport.exists_many([key], timeout=1) == [False]


async def test_a_chunk_past_its_ttl_is_a_miss(transport, clock):
    store = store_on(transport)
    assert await store.put(ref(0), META, memoryview(os.urandom(4096)))
    clock[0] += 61
    assert await store.contains_prefix([ref(0).chunk_id]) == 0
    assert await store.get_into(ref(0), memoryview(bytearray(4096))) is None


async def test_headers_are_read_without_the_payload(transport):
    store = store_on(transport)
    assert await store.put(ref(0), META, memoryview(os.urandom(4096)))
    (h,) = await store.peek_headers([ref(0).chunk_id])
    assert h is not None and h.payload_len == 4096 and transport.calls.get("GET", 0) == 0
    assert await store.peek_headers([ref(1).chunk_id]) == [None]


async def test_a_dead_server_is_a_miss_never_an_exception(transport):
    store = store_on(transport)
    assert await store.put(ref(0), META, memoryview(os.urandom(4096)))
    transport.down = True
    assert await store.contains_prefix([ref(0).chunk_id]) == 0
    assert await store.get_into(ref(0), memoryview(bytearray(4096))) is None
    assert await store.put(ref(1), META, memoryview(os.urandom(4096))) is False
    assert not await store.ping()


async def test_a_miss_releases_its_buffer_once(transport):
    store = store_on(transport)
    released: list[int] = []
    got = await store.get_many_into([(ref(5), memoryview(bytearray(4096)))], on_release=released.append)
    assert got == [None] and released == [0]


def test_the_memory_transport_needs_no_registration():
    assert store_on(MemoryTransport()).register_memory(0x1000, 4096) is False
