"""Rewriting a stored chunk the way a writer holding the tenant's credentials could: the new
value's header and payload CRCs are recomputed and its digests kept, so every checksum holds;
only what the metadata says, or how much payload there is, changes."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from lmcache_valkey import codec

Change = Callable[[codec.ChunkMeta, bytes], "tuple[codec.ChunkMeta, bytes]"]


def cut_short(meta: codec.ChunkMeta, body: bytes) -> tuple[codec.ChunkMeta, bytes]:
    """Half the payload; the metadata still describes all of it."""
    return meta, body[: len(body) // 2]


def relabelled(meta: codec.ChunkMeta, body: bytes) -> tuple[codec.ChunkMeta, bytes]:
    """The same bytes, consistently described as a flat run of half as many 2-byte floats."""
    return dataclasses.replace(meta, shapes=((len(body) // 2,),), dtypes=("torch.float16",)), body


def rewrite(server: Any, key: bytes, change: Change) -> None:
    """Replace the chunk at ``key`` on ``server`` (a ValkeyServer) by ``change(meta, payload)``."""
    value = server.cmd("GET", key)
    head = codec.decode_header(value[: codec.HEADER_SIZE])
    meta, body = change(head.meta, value[codec.HEADER_SIZE:])
    server.cmd("SET", key, bytes(codec.encode_header(meta, body, head.namespace_digest, head.key_digest)) + body)
