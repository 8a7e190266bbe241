"""``lmcache-valkey bench``: a quick put/get throughput check through the store.

For deployment sanity ("is this link/pod as fast as it should be?"); the
side-by-side comparisons with LMCache's own connectors live in benchmarks/.
Writes under a throw-away namespace and deletes what it wrote.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

from .codec import ChunkMeta
from .config import Settings, format_size
from .keys import make_namespace
from .store import ChunkRef, open_store


async def _bench(settings: Settings, chunk_bytes: int, chunks: int, rounds: int, progress: Any) -> dict[str, Any]:
    ns = make_namespace(settings.key_prefix, settings.tenant, {"quickbench": os.getpid(), "t": time.time()})
    store = await open_store(settings, ns)
    try:
        src = [memoryview(bytearray(os.urandom(64)) * (chunk_bytes // 64)) for _ in range(min(chunks, 8))]
        dst = [memoryview(bytearray(chunk_bytes)) for _ in range(chunks)]
        meta = ChunkMeta(shapes=((chunk_bytes,),), dtypes=("uint8",), fmt=0)
        refs = [ChunkRef(f"qb{i}", f"qb{i}") for i in range(chunks)]
        put_s: list[float] = []
        get_s: list[float] = []
        for r in range(rounds):
            t = time.perf_counter()
            ok = await store.put_many([(ref, meta, src[i % len(src)]) for i, ref in enumerate(refs)])
            put_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            got = await store.get_many_into(list(zip(refs, dst)))
            get_s.append(time.perf_counter() - t)
            progress(f"round {r + 1}/{rounds}: put {sum(ok)}/{chunks}, hit {sum(g is not None for g in got)}/{chunks}")
        total = chunk_bytes * chunks
        return {
            "transport": store.transport_name,
            "chunk_bytes": chunk_bytes,
            "chunks": chunks,
            "put_GBps": round(total / min(put_s) / 1e9, 3),
            "get_GBps": round(total / min(get_s) / 1e9, 3),
            "hits": sum(g is not None for g in got),
        }
    finally:
        try:
            await store.delete([f"qb{i}" for i in range(chunks)])
        finally:
            await store.close()


def run_quickbench(settings: Settings, args: Any) -> int:
    from .errors import ConfigError

    if not 0 < args.chunks <= 100_000:
        raise ConfigError("--chunks", "an integer in 1..100000", args.chunks)
    if not 64 <= args.chunk_bytes <= settings.max_chunk_bytes:
        raise ConfigError("--chunk-bytes", f"64 B..{format_size(settings.max_chunk_bytes)} (max_chunk_bytes)",
                          format_size(args.chunk_bytes))
    if not 0 < args.rounds <= 100:
        raise ConfigError("--rounds", "an integer in 1..100", args.rounds)
    quiet = args.json
    progress = (lambda m: None) if quiet else (lambda m: print(m, file=sys.stderr))
    res = asyncio.run(_bench(settings, args.chunk_bytes, args.chunks, args.rounds, progress))
    if quiet:
        print(json.dumps(res))
    else:
        print(f"{res['transport']}: {res['chunks']} x {format_size(res['chunk_bytes'])}  "
              f"put {res['put_GBps']} GB/s  get {res['get_GBps']} GB/s  hits {res['hits']}/{res['chunks']}")
    return 0 if res["hits"] == res["chunks"] else 1
