"""LMCache's own token → chunk keys, for callers outside this package (the demo).

A serving engine never hashes tokens itself: LMCache's ``ChunkedTokenDatabase``
turns a prompt into ``(start, end, CacheEngineKey)`` per chunk, with its prefix
hash chain. Code that must not import ``lmcache`` (``demo.py``; see
docs/layers.md) gets the same keys through this one function.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

try:  # LMCache <= 0.5.6
    from lmcache.v1.token_database import ChunkedTokenDatabase
except ImportError:  # LMCache 0.5.7 moved the in-process modules under lmcache.inprocess
    from lmcache.inprocess.v1.token_database import ChunkedTokenDatabase


def chunk_keys(config: Any, metadata: Any, tokens: Sequence[int], *, full_only: bool = True) -> list[tuple[int, int, Any]]:
    """``(start, end, CacheEngineKey)`` for each chunk of ``tokens``, as LMCache computes them.

    ``full_only`` keeps only whole chunks (what LMCache stores with ``save_unfull_chunk=False``).
    LMCache's default ``builtin`` hash is Python's ``hash`` of int tuples: stable across
    processes; workers should still run with ``PYTHONHASHSEED`` set, as LMCache asks.
    """
    db = ChunkedTokenDatabase(config, metadata)
    out = []
    for start, end, key in db.process_tokens(torch.tensor(list(tokens), dtype=torch.long)):
        if full_only and end - start != db.chunk_size:
            continue
        out.append((start, end, key))
    return out
