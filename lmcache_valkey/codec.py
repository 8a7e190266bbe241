"""Chunk wire format: a fixed-size header followed by the raw payload.

The header is fixed-size so that a reader can scatter one value into two
buffers it already owns: the first ``HEADER_SIZE`` bytes into a small scratch,
the rest straight into the destination (LMCache's ``MemoryObj``), with no
intermediate copy. Layout, little-endian::

    0   4s   magic b"LMCV"
    4   H    format version
    6   H    header size
    8   Q    payload length
    16  I    CRC32C of the payload
    20  I    CRC32C of the header (this field taken as zero)
    24  Q    created, Unix milliseconds
    32  16s  namespace digest        -> another namespace's chunk is "foreign"
    48  16s  key digest              -> a value under the wrong key is "foreign"
    64  H    metadata length
    66  ...  msgpack metadata {"s": shapes, "d": dtypes, "f": fmt, "k": key string}

Validation never raises on bad data: :func:`check` returns a
:class:`~lmcache_valkey.errors.CorruptChunk` reason which the store counts as a miss.

What the checks prove (docs/security.md, "Chunk integrity"): the CRCs catch accidents —
a torn write, a flipped bit, a value cut short — and the digests catch a value stored
under the wrong key or namespace. They are not a signature: whoever can write a tenant's
keys can write a value that passes them. So the metadata is checked against what it
describes (:func:`described_nbytes`: shapes × element sizes must be the payload length)
and against what the reader can use (:class:`ChunkLayout`), and a chunk's integrity rests on
write confinement (ACL users confined to their tenant's keys).
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from typing import Sequence, Union

import msgpack

from .checksum import crc32c, crc32c_combine
from .errors import CorruptChunk

MAGIC = b"LMCV"
VERSION = 1
HEADER_SIZE = 512
_FIXED = struct.Struct("<4sHHQIIQ16s16sH")
_CRC_OFFSET = 20
_META_MAX = HEADER_SIZE - _FIXED.size
_KEY_STRING_MAX = 256


# A chunk's payload: one buffer, or a list/tuple of buffers whose concatenation, in order,
# is the payload (a page an engine keeps scattered over its layers: SGLang's layer_first
# host pool). Parts are sent and received in place, never joined into one buffer.
Payload = Union[bytes, bytearray, memoryview, Sequence[memoryview]]


def payload_parts(payload: Payload) -> tuple[memoryview, ...]:
    """The buffers of a payload, in order (a list or tuple is parts; anything else is one)."""
    if isinstance(payload, (list, tuple)):
        return tuple(memoryview(p) for p in payload)
    return (memoryview(payload),)


def parts_nbytes(parts: Sequence[memoryview]) -> int:
    return sum(p.nbytes for p in parts)


def clip_parts(parts: Sequence[memoryview], n: int) -> tuple[memoryview, ...]:
    """The views covering the first ``n`` bytes of ``parts`` (byte views, no copy)."""
    out = []
    for p in parts:
        if n <= 0:
            break
        b = p.cast("B") if p.format != "B" or p.ndim != 1 else p
        out.append(b[:n])
        n -= min(n, b.nbytes)
    return tuple(out)


def scatter(value: bytes | bytearray | memoryview, parts: Sequence[memoryview]) -> int:
    """Copy ``value`` into ``parts`` in order: a shorter value fills only their start, bytes
    beyond their capacity are dropped. Returns the bytes copied."""
    src = memoryview(value).cast("B")
    at = 0
    for p in clip_parts(parts, src.nbytes):
        p[:] = src[at : at + p.nbytes]
        at += p.nbytes
    return at


def crc32c_parts(parts: Sequence[memoryview], value: int = 0) -> int:
    """CRC32C of the concatenation of ``parts`` (chained, nothing joined)."""
    for p in parts:
        value = crc32c(p, value)
    return value


class PayloadSink(list):
    """Scatter buffers for one value: ``[header scratch, payload destination, ...]``.

    A transport that can, sets ``crc`` to the CRC32C of the bytes it wrote into the
    buffers from index ``crc_from`` on, computed as they arrive (while they are still in
    cache), which saves the store a second pass over the payload. ``None`` means the
    transport did not compute it.
    """

    __slots__ = ("crc_from", "crc")

    def __init__(self, bufs: "list[memoryview]", crc_from: int = 1) -> None:
        super().__init__(bufs)
        self.crc_from = crc_from
        self.crc: int | None = None


@dataclass(frozen=True)
class ChunkMeta:
    """What a reader needs to allocate and interpret a chunk."""

    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    fmt: int
    key: str = ""  # LMCache key string (informational; may be truncated)


# Bytes per element of the dtypes engines store, by name (``torch.`` prefix or not).
_ITEMSIZE = {
    **dict.fromkeys(("bool", "uint8", "int8", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2",
                     "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2"), 1),
    **dict.fromkeys(("int16", "uint16", "float16", "half", "bfloat16", "short"), 2),
    **dict.fromkeys(("int32", "uint32", "float32", "float", "int", "complex32"), 4),
    **dict.fromkeys(("int64", "uint64", "float64", "double", "long", "complex64"), 8),
    "complex128": 16,
}


def dtype_size(name: str) -> int | None:
    """Bytes per element of a dtype named like ``torch.bfloat16`` or ``uint8``; None if unknown."""
    return _ITEMSIZE.get(name[6:] if name.startswith("torch.") else name)


def described_nbytes(meta: ChunkMeta) -> int | None:
    """The payload length ``meta`` describes: the sum over its tensors of elements × element
    size. None when a dtype is not one this module knows (then only the reader's own layout
    check applies)."""
    total = 0
    for shape, dtype in zip(meta.shapes, meta.dtypes):
        size = dtype_size(dtype)
        if size is None:
            return None
        n = size
        for d in shape:
            n *= d
        total += n
    return total


@dataclass(frozen=True)
class ChunkLayout:
    """The layout every chunk of a namespace has, when the namespace's fingerprint covers it
    (LMCache's in-process plugin, the vLLM tier): a stored chunk that does not fit it can
    never be served there, whatever its checksums say.

    ``dtypes`` and ``fmt`` match exactly; each shape matches exactly or, with ``token_dim``,
    holds fewer tokens along that dimension only, the same number in every tensor (a
    partial last chunk: 1 to all of the full chunk's tokens).
    """

    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    fmt: int
    token_dim: int | None = None

    def admits(self, meta: ChunkMeta) -> bool:
        if meta.dtypes != self.dtypes or meta.fmt != self.fmt or len(meta.shapes) != len(self.shapes):
            return False
        tokens: set[int] = set()
        for got, want in zip(meta.shapes, self.shapes):
            if len(got) != len(want):
                return False
            for d, (g, w) in enumerate(zip(got, want)):
                if d == self.token_dim:
                    if not 0 < g <= w:
                        return False
                    tokens.add(g)
                elif g != w:
                    return False
        return len(tokens) <= 1


@dataclass(frozen=True)
class Header:
    payload_len: int
    payload_crc: int
    created_ms: int
    namespace_digest: bytes
    key_digest: bytes
    meta: ChunkMeta


def encode_header(
    meta: ChunkMeta,
    payload: Payload,
    namespace_digest: bytes,
    key_digest: bytes,
    *,
    created_ms: int | None = None,
    payload_crc: int | None = None,
) -> bytearray:
    """Build the header for ``payload`` (which is not copied)."""
    fields = {"s": [list(s) for s in meta.shapes], "d": list(meta.dtypes), "f": int(meta.fmt), "k": ""}
    packed = msgpack.packb(fields, use_bin_type=True)
    if len(packed) > _META_MAX:
        raise ValueError(f"chunk metadata of {len(packed)} bytes does not fit the {HEADER_SIZE}-byte header")
    # The key string is informational (the key digest is what is checked): keep what fits.
    room = min(_KEY_STRING_MAX, _META_MAX - len(packed) - 2)
    if meta.key and room > 0:
        fields["k"] = meta.key.encode()[:room].decode("utf-8", "ignore")
        packed = msgpack.packb(fields, use_bin_type=True)
    parts = payload_parts(payload)
    n = parts_nbytes(parts)
    crc = crc32c_parts(parts) if payload_crc is None else payload_crc
    created = int(time.time() * 1000) if created_ms is None else created_ms
    buf = bytearray(HEADER_SIZE)
    _FIXED.pack_into(
        buf, 0, MAGIC, VERSION, HEADER_SIZE, n, crc, 0, created, namespace_digest, key_digest, len(packed)
    )
    buf[_FIXED.size : _FIXED.size + len(packed)] = packed
    struct.pack_into("<I", buf, _CRC_OFFSET, crc32c(buf))
    return buf


def value_crc(first: object, value_len: int) -> int | None:
    """The CRC32C of a whole stored value (header then payload, ``value_len`` bytes in all)
    whose first part is ``first``, computed from the header's payload CRC without reading the
    payload: what a large-object server compares with the ``CRC`` of ``BLOB.RDMA_SET`` before
    it stores anything. None when ``first`` is not a chunk header of this format describing
    ``value_len - HEADER_SIZE`` payload bytes (then there is no CRC to send)."""
    if not isinstance(first, (bytes, bytearray, memoryview)):
        return None
    view = memoryview(first)
    if view.nbytes != HEADER_SIZE:
        return None
    view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
    magic, version, hsize, plen, pcrc = _FIXED.unpack_from(view, 0)[:5]
    if magic != MAGIC or version != VERSION or hsize != HEADER_SIZE or plen != value_len - HEADER_SIZE:
        return None
    return crc32c_combine(crc32c(view), pcrc, plen)


def decode_header(buf: bytes | bytearray | memoryview) -> Header:
    """Parse and self-check a header. Raises :class:`CorruptChunk` on anything off."""
    view = memoryview(buf)
    if view.nbytes < HEADER_SIZE:
        raise CorruptChunk("truncated", f"header of {view.nbytes} bytes")
    magic, version, hsize, plen, pcrc, hcrc, created, ns, kd, mlen = _FIXED.unpack_from(view, 0)
    if magic != MAGIC:
        raise CorruptChunk("foreign", "not an lmcache-valkey chunk (bad magic)")
    if version != VERSION or hsize != HEADER_SIZE:
        # Another format version (a rolling upgrade): a miss, but not ours to delete.
        raise CorruptChunk("format", f"format version {version}/{hsize}, expected {VERSION}/{HEADER_SIZE}")
    scratch = bytearray(view[:HEADER_SIZE])
    scratch[_CRC_OFFSET : _CRC_OFFSET + 4] = b"\0\0\0\0"
    if crc32c(scratch) != hcrc:
        raise CorruptChunk("crc", "header checksum mismatch")
    if mlen > _META_MAX:
        raise CorruptChunk("crc", "metadata length out of range")
    try:
        m = msgpack.unpackb(bytes(view[_FIXED.size : _FIXED.size + mlen]), raw=False)
        meta = ChunkMeta(
            shapes=tuple(tuple(int(d) for d in s) for s in m["s"]),
            dtypes=tuple(str(d) for d in m["d"]),
            fmt=int(m["f"]),
            key=str(m.get("k", "")),
        )
    except Exception as e:  # malformed msgpack is corruption, never a crash
        raise CorruptChunk("crc", f"unreadable metadata ({e})") from None
    if not meta.shapes or len(meta.shapes) != len(meta.dtypes) or any(d < 0 for s in meta.shapes for d in s):
        raise CorruptChunk("meta", f"metadata describes no tensors ({len(meta.shapes)} shapes, "
                                   f"{len(meta.dtypes)} dtypes, or a negative dimension)")
    return Header(plen, pcrc, created, ns, kd, meta)


def check(
    header: Header,
    value_len: int,
    payload: Payload,
    namespace_digest: bytes,
    key_digest: bytes,
    *,
    verify_crc: bool = True,
) -> None:
    """Check a value read into (header, payload). Raises :class:`CorruptChunk`.

    ``value_len`` is the stored value's full length as reported by the server;
    ``payload`` is the destination that received the bytes after the header (one buffer
    or its parts). It may be larger than the payload (a partial last chunk read into a
    full-chunk buffer); only its first ``header.payload_len`` bytes are checked.
    """
    parts = payload_parts(payload)
    capacity = parts_nbytes(parts)
    if header.namespace_digest != namespace_digest or header.key_digest != key_digest:
        raise CorruptChunk("foreign", "chunk belongs to another namespace or key")
    if value_len - HEADER_SIZE != header.payload_len:
        raise CorruptChunk("truncated", f"value holds {value_len - HEADER_SIZE} payload bytes, header says {header.payload_len}")
    described = described_nbytes(header.meta)
    if header.payload_len == 0 or (described is not None and described != header.payload_len):
        # A CRC over a cut or empty payload is just as valid: the metadata must describe it.
        raise CorruptChunk("meta", f"{header.payload_len} payload bytes, metadata {header.meta.shapes} "
                                   f"{header.meta.dtypes} describes {described}")
    if header.payload_len > capacity:
        raise CorruptChunk("oversized", f"payload of {header.payload_len} bytes for a {capacity}-byte buffer")
    if verify_crc and crc32c_parts(clip_parts(parts, header.payload_len)) != header.payload_crc:
        raise CorruptChunk("crc", "payload checksum mismatch")
