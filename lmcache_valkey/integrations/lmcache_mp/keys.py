"""LMCache MP ``ObjectKey`` <-> our chunk names, and a ``MemoryObj``'s layout.

The key string is LMCache's own wire form of an ``ObjectKey`` (model, kv rank, object group,
chunk hash, and the ``cache_salt`` when set): every field takes part in the chunk id, so two
salts, ranks or groups never share a chunk, and the header's key digest proves a stored
value belongs to exactly this key. ``@`` cannot occur in a model name or a salt (LMCache
refuses them), so the string parses back (``list_l2_keys`` reads it from chunk headers).
Layout (shapes, dtypes, format) is checked at load against the chunk header instead of
being hashed into the key: LMCache's lookups carry the group's layout, but a serde wrapper
stores and loads another one, so only the header and the destination buffer agree
(docs/lmcache-mp.md).
"""

from __future__ import annotations

from typing import Any

from lmcache.v1.distributed.api import ObjectKey

from ...codec import ChunkMeta
from ...keys import Namespace
from ...store import ChunkRef

SEP = "@"


def key_string(key: ObjectKey) -> str:
    base = f"{key.model_name}{SEP}{key.kv_rank:08x}{SEP}{key.object_group_id:x}{SEP}{key.chunk_hash.hex()}"
    return f"{base}{SEP}{key.cache_salt}" if key.cache_salt else base


def object_key(s: str) -> ObjectKey | None:
    """The ``ObjectKey`` a key string names; None for anything else (another adapter's chunk)."""
    parts = s.split(SEP)
    if len(parts) not in (4, 5):
        return None
    try:
        return ObjectKey(
            chunk_hash=bytes.fromhex(parts[3]),
            model_name=parts[0],
            kv_rank=int(parts[1], 16),
            object_group_id=int(parts[2], 16),
            cache_salt=parts[4] if len(parts) == 5 else "",
        )
    except ValueError:
        return None


def ref(namespace: Namespace, key: ObjectKey) -> ChunkRef:
    s = key_string(key)
    return ChunkRef(namespace.chunk_id(s), s)


def layout(obj: Any) -> tuple[tuple[tuple[int, ...], ...], tuple[str, ...], int]:
    """(shapes, dtypes, format) of a ``MemoryObj``: what its bytes mean."""
    meta = obj.meta if hasattr(obj, "meta") else obj.metadata
    shapes = meta.shapes if meta.shapes is not None else [meta.shape]
    dtypes = meta.dtypes if meta.dtypes is not None else [meta.dtype]
    return (
        tuple(tuple(int(d) for d in s) for s in shapes),
        tuple(str(d) for d in dtypes),
        int(meta.fmt.value),
    )


def chunk_meta(obj: Any, key_str: str) -> ChunkMeta:
    shapes, dtypes, fmt = layout(obj)
    return ChunkMeta(shapes=shapes, dtypes=dtypes, fmt=fmt, key=key_str)


def fits(meta: ChunkMeta, want: tuple[tuple[tuple[int, ...], ...], tuple[str, ...], int]) -> bool:
    """A stored chunk's layout equals the destination's."""
    return (tuple(tuple(s) for s in meta.shapes), tuple(meta.dtypes), meta.fmt) == want
