"""A chunk scattered over several buffers (an engine's page spread over its layers) is stored
from its parts and read back into parts, in place; corruption in any part is a counted miss."""

from __future__ import annotations

import asyncio
import os

import pytest

from lmcache_valkey import codec
from lmcache_valkey.codec import HEADER_SIZE, ChunkMeta
from lmcache_valkey.keys import make_namespace
from lmcache_valkey.store import ChunkRef, open_store

pytestmark = pytest.mark.timeout(60)

NS = make_namespace("lmcv", "default", {"model": "parts-test"})
SIZES = (100, 3000, 7, 65536 + 13)
META = ChunkMeta(shapes=((sum(SIZES),),), dtypes=("uint8",), fmt=0)


def ref(name: str) -> ChunkRef:
    return ChunkRef(NS.chunk_id(name), name)


def split(buf: bytearray, sizes=SIZES) -> list[memoryview]:
    mv, out, at = memoryview(buf), [], 0
    for n in sizes:
        out.append(mv[at:at + n])
        at += n
    return out


async def test_parts_round_trip_and_mix_with_single_buffers(valkey_server) -> None:
    store = await open_store(valkey_server.settings(transport="tcp"), NS)
    try:
        data = os.urandom(sum(SIZES))
        # Parts scattered over a larger region, with gaps between them (like layers of a pool).
        arena = bytearray(2 * sum(SIZES))
        scattered = [memoryview(arena)[2 * sum(SIZES[:i]): 2 * sum(SIZES[:i]) + n] for i, n in enumerate(SIZES)]
        at = 0
        for p in scattered:
            p[:] = data[at:at + p.nbytes]
            at += p.nbytes
        assert await store.put(ref("scattered"), META, scattered)
        assert await store.put(ref("single"), META, memoryview(bytearray(data)))

        one = bytearray(len(data))
        got = await store.get_into(ref("scattered"), memoryview(one))
        assert got is not None and got.nbytes == len(data) and bytes(one) == data

        back = bytearray(len(data))
        got = await store.get_into(ref("single"), split(back))
        assert got is not None and got.nbytes == len(data) and bytes(back) == data

        again = bytearray(len(data))
        parts = split(again, tuple(reversed(SIZES)))  # other boundaries, same total
        got = await store.get_into(ref("scattered"), parts)
        assert got is not None and bytes(again) == data
    finally:
        await store.close()



async def test_a_flipped_byte_in_any_part_is_a_counted_miss_and_the_copy_is_deleted(valkey_server) -> None:
    store = await open_store(valkey_server.settings(transport="tcp"), NS)
    try:
        data = bytearray(os.urandom(sum(SIZES)))
        r = ref("flipped")
        assert await store.put(r, META, split(data))
        key = NS.data_key(r.chunk_id)
        offset = HEADER_SIZE + SIZES[0] + SIZES[1] + 3  # inside the third part
        stored = valkey_server.cmd("GETRANGE", key, offset, offset)
        valkey_server.cmd("SETRANGE", key, offset, bytes([stored[0] ^ 0xFF]))
        dest = bytearray(len(data))
        assert await store.get_into(r, split(dest)) is None
        for _ in range(100):
            if not valkey_server.cmd("EXISTS", key):
                break
            await asyncio.sleep(0.02)
        assert valkey_server.cmd("EXISTS", key) == 0
    finally:
        await store.close()



async def test_a_value_too_large_for_the_parts_is_a_miss(valkey_server) -> None:
    store = await open_store(valkey_server.settings(transport="tcp"), NS)
    try:
        r = ref("large")
        meta = ChunkMeta(shapes=((sum(SIZES) + 1,),), dtypes=("uint8",), fmt=0)
        assert await store.put(r, meta, memoryview(bytearray(os.urandom(sum(SIZES) + 1))))
        assert await store.get_into(r, split(bytearray(sum(SIZES)))) is None
    finally:
        await store.close()



def test_codec_checks_parts_like_their_concatenation() -> None:
    data = os.urandom(sum(SIZES))
    parts = split(bytearray(data))
    assert codec.crc32c_parts(parts) == codec.crc32c(data)
    assert codec.parts_nbytes(parts) == len(data)
    assert b"".join(bytes(p) for p in codec.clip_parts(parts, 3105)) == data[:3105]
    kd = NS.key_digest("k")
    header = codec.encode_header(META, parts, NS.digest_bytes, kd)
    h = codec.decode_header(header)
    assert h.payload_len == len(data) and h.payload_crc == codec.crc32c(data)
    codec.check(h, HEADER_SIZE + len(data), parts, NS.digest_bytes, kd)
