"""Chunk ids of LMCache ``CacheEngineKey`` lists, for a lookup's hot path.

A 512-key prefix lookup otherwise spends ~0.4-0.8 us per key in ``CacheEngineKey.to_string``
(five f-string fields and a hex of the chunk hash) before a single byte is sent: about as much
as the rest of the lookup together. The keys of one lookup share everything but the chunk
hash (one model, rank, dtype; one request's tags), so the ids are remembered per such context
by chunk hash: a lookup checks, in C-level passes, that all its keys are plain
``CacheEngineKey`` holding the very same context objects, then maps their hashes through one
dictionary.

Only where that is exact: ``to_string`` must be a function of the fields checked here and the
chunk hash, so the path turns itself off if LMCache's key class has other fields than the ones
it was written against, and it skips keys with tags (tag values of different types can compare
equal yet print differently). Everything else goes through ``to_string`` as before.
"""

from __future__ import annotations

import dataclasses
from itertools import repeat
from operator import attrgetter, is_
from typing import Any, Sequence

from lmcache.utils import CacheEngineKey

from ...keys import ChunkIds

# The fields of LMCache 0.5.x's CacheEngineKey; to_string reads model_name, world_size,
# worker_id, chunk_hash, _dtype_str (from dtype) and tags (from request_configs).
_KNOWN_FIELDS = frozenset({"model_name", "world_size", "worker_id", "chunk_hash", "dtype", "request_configs",
                           "tags", "_dtype_str"})
_CONTEXT_FIELDS = tuple(attrgetter(f) for f in ("model_name", "world_size", "worker_id", "dtype", "tags"))
_HASH = attrgetter("chunk_hash")
_HASH_TYPES = ({int}, {bytes})  # (to_string prints either as hex; True or 2.0 would pass as equal ints)
_FAST_MIN = 8  # fewer keys: the checks cost about what they save


def _fast_path_exact() -> bool:
    try:
        return frozenset(f.name for f in dataclasses.fields(CacheEngineKey)) == _KNOWN_FIELDS
    except TypeError:  # no longer a dataclass
        return False


class EngineKeyIds:
    """``CacheEngineKey`` → chunk id, through :class:`ChunkIds` (one namespace), with the
    lookup shortcut described above. Holds at most ``max_entries`` shortcuts, then forgets
    them all at once."""

    def __init__(self, ids: ChunkIds, max_entries: int = 1 << 16) -> None:
        self.ids = ids
        self._fast = _fast_path_exact()
        self._by_context: dict[tuple[Any, ...], dict[Any, str]] = {}
        self._entries = 0
        self._max = max_entries

    def many(self, keys: Sequence[CacheEngineKey]) -> list[str]:
        context = self._context(keys) if self._fast and len(keys) >= _FAST_MIN else None
        hashes = list(map(_HASH, keys)) if context is not None else None
        if hashes is None or set(map(type, hashes)) not in _HASH_TYPES:
            return self.ids.many([k.to_string() for k in keys])
        table = self._by_context.setdefault(context, {})
        ids: list[Any] = list(map(table.get, hashes))
        if None in ids:
            if self._entries + len(keys) > self._max:
                self._by_context.clear()
                self._entries = 0
                table = self._by_context[context] = {}
            for i, c in enumerate(ids):
                if c is None:
                    ids[i] = table[hashes[i]] = self.ids.of(keys[i].to_string())
                    self._entries += 1
        return ids

    def _context(self, keys: Sequence[CacheEngineKey]) -> tuple[Any, ...] | None:
        """The one context all ``keys`` share, or None where they do not (or any key is a
        subclass, or has tags).

        "Share" is identity, not equality: ``1``, ``True`` and ``1.0`` are equal but print
        differently, while one request's keys hold the very same objects (LMCache builds them
        from one metadata). The context holds the fields' types as well as their values."""
        if set(map(type, keys)) != {CacheEngineKey}:
            return None
        first = keys[0]
        for get in _CONTEXT_FIELDS:
            if not all(map(is_, map(get, keys), repeat(get(first)))):
                return None
        if first.tags is not None or type(first.model_name) is not str:
            return None
        ws, wid = first.world_size, first.worker_id
        return (first.model_name, type(ws), ws, type(wid), wid, first.dtype)
