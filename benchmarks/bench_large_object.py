"""Large-object transports vs RESP strings, standalone and Cluster, in one run.

For each topology (one Valkey 9.1.2 node; a 3-node Cluster), every node loading the
reference large-object module with the libfabric ``tcp;ofi_rxm`` provider:
  resp      RespClient GET/SET of Valkey strings (zero-copy receive into the buffer);
  blob-tcp  BlobTcpClient BLOB.TCP_GET/BLOB.TCP_SET of large objects (same RESP engine);
  rdma      the fabric transport: server fi_write (GET) / fi_read (SET) into a registered
            arena (one endpoint per node in the Cluster).
Each measures GET and SET of 4 and 32 MiB values, one value at a time and 8 in flight
(distinct keys, spread over the nodes in the Cluster), in interleaved rounds; medians in GB/s
and the ratio of each transport to RESP in the same round.

    .venv/bin/python benchmarks/bench_large_object.py [--sizes 4,32] [--seconds 1] [--rounds 3] [--depth 8]
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from lmcache_valkey.config import settings_from_mapping  # noqa: E402
from lmcache_valkey.transport.blob_tcp import BlobTcpClient  # noqa: E402
from lmcache_valkey.transport.fabric import open_fabric_transport  # noqa: E402
from lmcache_valkey.transport.resp import RespClient  # noqa: E402
from support.servers import ValkeyCluster, ValkeyServer, endpoint_args  # noqa: E402

MiB = 1 << 20
TRANSPORTS = ("resp", "blob-tcp", "rdma")


async def open_transport(kind: str, url: str, arena: bytearray) -> object:
    raw = {"url": url, "connections_per_node": 8, "op_timeout_s": 30, "max_chunk_bytes": 64 * MiB}
    if kind == "rdma":
        raw.update(transport="fabric", fabric_provider="tcp;ofi_rxm", fabric_bind_addr="127.0.0.1")
        t = await open_fabric_transport(settings_from_mapping(raw, env={}))
        addr = ctypes.addressof((ctypes.c_char * len(arena)).from_buffer(arena))
        t.register(addr, len(arena))  # LMCache's arena: registered once
        return t
    t = (BlobTcpClient if kind == "blob-tcp" else RespClient)(settings_from_mapping(raw, env={}))
    await t.start()
    return t


async def measure(t: object, op: str, slots: list[memoryview], keys: list[bytes], seconds: float, depth: int) -> float:
    """GB/s moving len(slots[0]) bytes per value, ``depth`` values per batch."""
    moved, t0 = 0, time.perf_counter()
    i = 0
    while time.perf_counter() - t0 < seconds:
        batch = [(keys[(i + d) % len(keys)], slots[(i + d) % len(slots)]) for d in range(depth)]
        if op == "get":
            got = await t.get_many_into([(k, [s]) for k, s in batch], timeout=30)
            bad = [g for g in got if not isinstance(g, int)]
        else:
            got = await t.set_many([(k, [s]) for k, s in batch], ttl_s=None, timeout=30)
            bad = [g for g in got if g is not None]
        if bad:
            raise RuntimeError(f"{op} failed: {bad[0]!r}")
        moved += sum(len(s) for _, s in batch)
        i += depth
    return moved / (time.perf_counter() - t0) / 1e9


async def run_topology(url: str, sizes: list[int], seconds: float, rounds: int, depth: int) -> dict:
    arena = bytearray(2 * depth * max(sizes) * MiB)
    transports = {k: await open_transport(k, url, arena) for k in TRANSPORTS}
    results: dict = {}
    try:
        for size in sizes:
            n = size * MiB
            slots = [memoryview(arena)[j * n : (j + 1) * n] for j in range(2 * depth)]
            for s in slots[:depth]:
                s[:] = os.urandom(n)
            keys = {k: [f"bench:{k}:{size}:{j}".encode() for j in range(2 * depth)] for k in TRANSPORTS}
            for k, t in transports.items():  # the values the GETs read
                errs = await t.set_many([(key, [s]) for key, s in zip(keys[k][:depth], slots[:depth])],
                                        ttl_s=None, timeout=60)
                if any(errs):
                    raise RuntimeError(f"{k}: populating failed: {errs}")
            for _ in range(rounds):
                for k, t in transports.items():
                    for op in ("get", "set"):
                        for d in (1, depth):
                            ops_slots = slots[depth:] if op == "get" else slots[:depth]
                            v = await measure(t, op, ops_slots, keys[k][:depth], seconds, d)
                            results.setdefault((size, op, d, k), []).append(v)
    finally:
        for t in transports.values():
            await t.close()
    return results


def report(name: str, results: dict, sizes: list[int], depth: int) -> None:
    print(f"\n{name}: GB/s, medians of interleaved rounds; (x) = ratio to resp")
    print(f"{'size':>6} {'op':>4} {'depth':>5} " + " ".join(f"{k:>16}" for k in TRANSPORTS))
    for size in sizes:
        for op in ("get", "set"):
            for d in (1, depth):
                base = statistics.median(results[(size, op, d, "resp")])
                cells = []
                for k in TRANSPORTS:
                    m = statistics.median(results[(size, op, d, k)])
                    cells.append(f"{m:8.2f} ({m / base:4.2f}x)")
                print(f"{size:>4}Mi {op:>4} {d:>5} " + " ".join(f"{c:>16}" for c in cells))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4,32", help="MiB, comma-separated")
    ap.add_argument("--seconds", type=float, default=1.0, help="per measurement")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--depth", type=int, default=8, help="values in flight in the batched runs")
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    arena_mb = max(256, 4 * a.depth * max(sizes) * 3)
    args = endpoint_args(arena_mb) + ["--proto-max-bulk-len", str(max(sizes) * 2 * MiB)]
    with ValkeyServer(args=args) as srv:
        report("standalone", asyncio.run(run_topology(srv.url, sizes, a.seconds, a.rounds, a.depth)), sizes, a.depth)
    cluster = ValkeyCluster(3, args=args).start()
    try:
        report("3-node cluster", asyncio.run(run_topology(cluster.url, sizes, a.seconds, a.rounds, a.depth)),
               sizes, a.depth)
    finally:
        cluster.cleanup()


if __name__ == "__main__":
    main()
