"""A chunk read back is either exactly what was stored under that key, or a counted miss."""

import os

import crc32c as reference
import pytest

from lmcache_valkey import codec
from lmcache_valkey.codec import HEADER_SIZE, ChunkMeta
from lmcache_valkey.errors import CorruptChunk
from lmcache_valkey.keys import make_namespace



def meta_for(tokens: int) -> ChunkMeta:
    """LMCache's ``[2, layers, tokens, hidden]`` bfloat16 layout: 1024 bytes per token here."""
    return ChunkMeta(shapes=((2, 4, tokens, 64),), dtypes=("torch.bfloat16",), fmt=1, key="vllm@m@1@0@abc@bfloat16")


META = meta_for(4)  # a 4096-byte chunk
NS = make_namespace("lmcv", "t", {"model": "m"})
KD = NS.key_digest(META.key)


def roundtrip(payload: bytes, buf_size: int | None = None):
    header = codec.encode_header(meta_for(len(payload) // 1024), payload, NS.digest_bytes, KD)
    value = bytes(header) + payload
    dest = bytearray(buf_size or len(payload))
    h = codec.decode_header(value[:HEADER_SIZE])
    n = min(len(value) - HEADER_SIZE, len(dest))
    dest[:n] = value[HEADER_SIZE : HEADER_SIZE + n]
    codec.check(h, len(value), memoryview(dest), NS.digest_bytes, KD)
    return h, dest


def test_roundtrip_keeps_metadata_and_bytes():
    payload = os.urandom(4096)
    h, dest = roundtrip(payload)
    assert h.meta == META and bytes(dest) == payload and h.payload_len == 4096


def test_partial_chunk_in_full_buffer_is_accepted():
    payload = os.urandom(1024)
    h, dest = roundtrip(payload, buf_size=4096)
    assert bytes(dest[:1024]) == payload


def test_flipped_payload_bit_is_a_crc_miss():
    payload = bytearray(os.urandom(4096))
    header = codec.encode_header(META, payload, NS.digest_bytes, KD)
    payload[100] ^= 1
    h = codec.decode_header(header)
    with pytest.raises(CorruptChunk) as e:
        codec.check(h, HEADER_SIZE + len(payload), memoryview(payload), NS.digest_bytes, KD)
    assert e.value.reason == "crc"


@pytest.mark.parametrize("offset", [0, 8, 30, 70])
def test_damaged_header_is_never_accepted(offset):
    header = codec.encode_header(META, b"x" * 10, NS.digest_bytes, KD)
    header[offset] ^= 0xFF
    with pytest.raises(CorruptChunk) as e:
        codec.decode_header(header)
    assert e.value.reason in {"crc", "foreign"}


def test_truncated_value_and_foreign_key_and_namespace():
    payload = os.urandom(2048)
    header = codec.encode_header(meta_for(2), payload, NS.digest_bytes, KD)
    h = codec.decode_header(header)
    with pytest.raises(CorruptChunk, match="truncated"):
        codec.check(h, HEADER_SIZE + 1000, memoryview(bytearray(2048)), NS.digest_bytes, KD)
    with pytest.raises(CorruptChunk, match="foreign"):
        codec.check(h, HEADER_SIZE + 2048, memoryview(payload), NS.digest_bytes, NS.key_digest("other"))
    other_ns = make_namespace("lmcv", "t", {"model": "other"})
    with pytest.raises(CorruptChunk, match="foreign"):
        codec.check(h, HEADER_SIZE + 2048, memoryview(payload), other_ns.digest_bytes, KD)
    with pytest.raises(CorruptChunk, match="oversized"):
        codec.check(h, HEADER_SIZE + 2048, memoryview(bytearray(100)), NS.digest_bytes, KD)
    with pytest.raises(CorruptChunk, match="truncated"):
        codec.decode_header(bytes(header[:100]))
    with pytest.raises(CorruptChunk, match="foreign"):
        codec.decode_header(b"GARBAGE!" * 64)


def test_namespaces_differ_by_every_field_and_tenant():
    base = {"model": "m", "kv_dtype": "bf16", "chunk_size": 256, "world_size": 1}
    a = make_namespace("lmcv", "t", base)
    for k, v in [("model", "m2"), ("kv_dtype", "fp16"), ("chunk_size", 128), ("world_size", 2)]:
        assert make_namespace("lmcv", "t", {**base, k: v}).digest != a.digest
    b = make_namespace("lmcv", "u", base)
    assert b.digest != a.digest and b.chunk_id("k") != a.chunk_id("k")  # keyed per tenant
    assert a.data_key(a.chunk_id("k")).startswith(b"lmcv:t:") and a.tenant_pattern == "~lmcv:t:*"


def test_long_keys_and_many_groups_still_fit_the_header():
    meta = ChunkMeta(shapes=tuple((2, 32, 256, 1024) for _ in range(8)), dtypes=("torch.bfloat16",) * 8, fmt=1,
                     key="vllm@" + "a-very-long-model-name/" * 20 + "@1@0@abc@bfloat16")
    header = codec.encode_header(meta, b"x" * 10, NS.digest_bytes, KD)
    h = codec.decode_header(header)
    assert h.meta.shapes == meta.shapes and meta.key.startswith(h.meta.key)


def test_other_format_version_is_a_format_miss_not_foreign():
    header = codec.encode_header(META, b"x", NS.digest_bytes, KD)
    header[4] = 99  # format version
    with pytest.raises(CorruptChunk) as e:
        codec.decode_header(header)
    assert e.value.reason == "format"


@pytest.mark.parametrize("payload_len", [0, 1, 1023, 3072, 4095, 5120])
def test_a_payload_its_metadata_does_not_describe_is_refused_whatever_its_crc(payload_len):
    """A 0-byte or cut payload with a CRC recomputed over what is left still fails: the
    header's shapes and dtypes say 4096 bytes."""
    payload = os.urandom(payload_len)
    h = codec.decode_header(codec.encode_header(META, payload, NS.digest_bytes, KD))
    with pytest.raises(CorruptChunk) as e:
        codec.check(h, HEADER_SIZE + payload_len, memoryview(bytearray(8192)), NS.digest_bytes, KD)
    assert e.value.reason == "meta"


@pytest.mark.parametrize("meta", [
    ChunkMeta(shapes=(), dtypes=(), fmt=1),
    ChunkMeta(shapes=((4096,),), dtypes=("uint8", "uint8"), fmt=1),
    ChunkMeta(shapes=((-4096,),), dtypes=("uint8",), fmt=1),
])
def test_metadata_that_describes_no_tensors_is_refused(meta):
    header = codec.encode_header(meta, b"x" * 4096, NS.digest_bytes, KD)
    with pytest.raises(CorruptChunk) as e:
        codec.decode_header(header)
    assert e.value.reason == "meta"


def test_described_size_knows_engine_dtypes_and_leaves_unknown_ones_to_the_reader():
    assert codec.described_nbytes(ChunkMeta(((2, 3),), ("torch.float8_e4m3fn",), 0)) == 6
    assert codec.described_nbytes(ChunkMeta(((2, 3), (5,)), ("torch.float32", "bfloat16"), 0)) == 34
    assert codec.described_nbytes(ChunkMeta(((7,),), ("torch.some_future_type",), 0)) is None


def test_a_namespace_layout_admits_its_full_and_partial_chunks_only():
    lay = codec.ChunkLayout(shapes=((2, 4, 256, 64), (2, 4, 256, 32)), dtypes=("torch.bfloat16",) * 2, fmt=1, token_dim=2)
    fits = lambda shapes, dtypes=("torch.bfloat16",) * 2, fmt=1: lay.admits(ChunkMeta(shapes, dtypes, fmt))  # noqa: E731
    assert fits(((2, 4, 256, 64), (2, 4, 256, 32)))
    assert fits(((2, 4, 17, 64), (2, 4, 17, 32)))  # a partial last chunk
    assert not fits(((2, 4, 17, 64), (2, 4, 18, 32)))  # tensors disagree on the token count
    assert not fits(((2, 4, 0, 64), (2, 4, 0, 32)))  # no tokens
    assert not fits(((2, 4, 257, 64), (2, 4, 257, 32)))  # more than a chunk
    assert not fits(((2, 8, 128, 64), (2, 4, 256, 32)))  # another dimension
    assert not fits(((2, 4, 256, 64), (2, 4, 256, 32)), ("torch.float16",) * 2)  # another dtype
    assert not fits(((2, 4, 256, 64), (2, 4, 256, 32)), fmt=2)  # another format
    assert not fits(((2, 4, 256, 64),), ("torch.bfloat16",))  # a group missing


def test_a_stored_values_crc_comes_from_its_header_without_reading_the_payload():
    # What BLOB.RDMA_SET ... CRC carries: the CRC32C of header + payload, as the server computes it.
    payload = os.urandom(16 * 1024)
    header = codec.encode_header(meta_for(16), payload, NS.digest_bytes, KD)
    total = HEADER_SIZE + len(payload)
    assert codec.value_crc(header, total) == reference.crc32c(bytes(header) + payload)
    assert codec.value_crc(memoryview(header), total) == reference.crc32c(bytes(header) + payload)
    # Not a header of ours, or one that describes another length: no CRC to send.
    assert codec.value_crc(b"x" * HEADER_SIZE, total) is None
    assert codec.value_crc(header, total + 1) is None
    assert codec.value_crc(header[:100], total) is None
    assert codec.value_crc(object(), total) is None
