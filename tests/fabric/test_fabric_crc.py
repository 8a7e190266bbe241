"""The endpoint's own CRC32C equals google_crc32c (Castagnoli) on awkward lengths,
through bulk SET (CRC at once) and RMA SET (CRC folded in chunk by chunk); a chunk put over
the fabric carries its CRC, and the server refuses bytes that do not match it."""

from __future__ import annotations

import os

import google_crc32c
import pytest

from lmcache_valkey import codec
from lmcache_valkey.codec import HEADER_SIZE, ChunkMeta
from lmcache_valkey.keys import make_namespace
from lmcache_valkey.transport.fabric import FabricTransport
from lmcache_valkey.transport.fabric.errors import ChecksumRefused

SIZES = [0, 1, 7, 8, 8191, 3 * 8192 - 1, 3 * 8192, 3 * 8192 + 9, 100_003, (1 << 20) + 5, (5 << 20) + 3]


async def test_crc_matches_google_crc32c(start_server):
    srv = start_server("tcp;ofi_rxm", extra=("chunk_kb", "64"))  # many chunks: exercises the fold
    c = srv.client()
    values = {n: os.urandom(n) for n in SIZES}
    for n, v in values.items():
        # An empty value only through the deprecated name: the large-object dialect refuses it.
        c.execute_command("BLOB.TCP_SET" if n else "BLOB.SET", b"bulk%d" % n, v)
        assert c.execute_command("BLOB.INFO", b"bulk%d" % n, "CRC") == google_crc32c.value(v), n

    async with FabricTransport("127.0.0.1", srv.port) as t:
        arena = bytearray(8 << 20)
        t.register_buffer(arena)
        mv = memoryview(arena)
        for n, v in values.items():
            if n == 0:
                continue
            mv[1:n + 1] = v  # odd offset on purpose
            await t.set_from(b"rma%d" % n, [mv[1 : n + 1]], None, 10)
            assert (await t.info(b"rma%d" % n))[1] == google_crc32c.value(v), n



async def test_a_chunk_whose_bytes_changed_under_the_put_is_refused_not_stored(start_server):
    # The client sends the chunk's CRC with BLOB.RDMA_SET (from its header, no payload byte
    # read); the server compares it with what it read and stores nothing on a mismatch. So a
    # payload that is not what its header was made for -- LMCache's buffer reused under the
    # put, bytes damaged on the way -- is never stored, and never retried over TCP either.
    srv = start_server("tcp;ofi_rxm")
    meta = ChunkMeta(shapes=((4096,),), dtypes=("uint8",), fmt=1, key="k")
    ns = make_namespace("lmcv", "t", {"model": "m"})
    good = os.urandom(4096)
    header = codec.encode_header(meta, good, ns.digest_bytes, ns.key_digest("k"))
    async with FabricTransport("127.0.0.1", srv.port) as t:
        arena = bytearray(2 * 4096)
        t.register_buffer(arena)
        payload = memoryview(arena)[:4096]
        payload[:] = good
        await t.set_from(b"good", [memoryview(header), payload], None, 10)
        assert (await t.info(b"good")) == (HEADER_SIZE + 4096, google_crc32c.value(bytes(header) + good))

        payload[:1] = bytes([payload[0] ^ 0xFF])  # the buffer changed after its header was made
        with pytest.raises(ChecksumRefused, match="CRC32C"):
            await t.set_from(b"changed", [memoryview(header), payload], None, 10)
        assert await t.info(b"changed") is None
        assert t.stats["bulk_fallbacks"] == 0
    assert srv.client().exists(b"changed") == 0
