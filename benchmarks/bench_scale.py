"""Scale-out: a 3-shard Valkey Cluster vs one node, and 1, 2, 4 worker processes against one node.

    .venv/bin/python benchmarks/bench_scale.py [--quick] [--json out.json]

Part 1, routing. The same client work against one standalone Valkey 9.1.2 and against a
3-primary Cluster on this machine (keys spread over every shard by their hash tags): batched
put and get of 4 MiB chunks (GB/s, client CPU-seconds per GB, servers' CPU per GB) and a
512-key prefix lookup (median ms, client CPU per 1,000 keys), both awaited on the store's loop
and as an engine's synchronous call makes it (``StoreSession.contains_prefix``, the lookup
lane on the calling thread). What routing costs the client is
the Cluster's CPU per GB (and per key) over the standalone one's: slot hashing, grouping per
node, one pipeline per node. (Aggregate GB/s here cannot grow with shards: three servers and
the client share two cores. docs/throughput.md has the arithmetic for real nodes.)

Part 2, processes. N worker processes (N = 1, 2, 4), each with its own store and
connections, against one node: every worker first puts its own chunks, then all start
together (a barrier) and each runs batched puts, then batched gets, for a fixed time.
Prints the aggregate GB/s of each phase, errors (misses, failed puts) and CPU per GB.

Each measurement goes through ``ChunkStore`` (the core every adapter calls): CRC on every
chunk both ways, headers checked, deadlines, exactly as in production.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from support.servers import ValkeyCluster, ValkeyServer  # noqa: E402

from lmcache_valkey.codec import ChunkMeta  # noqa: E402
from lmcache_valkey.config import settings_from_mapping  # noqa: E402
from lmcache_valkey.keys import make_namespace  # noqa: E402
from lmcache_valkey.session import StoreSession  # noqa: E402
from lmcache_valkey.store import ChunkRef, open_store  # noqa: E402

CHUNK = 4 << 20
GB = 1e9


def server_cpu(pids: list[int]) -> float:
    """CPU seconds the given server processes have run so far (all threads, ns resolution)."""
    total = 0
    for pid in pids:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                    total += int(f.read().split()[0])
            except (OSError, ValueError):
                pass
    return total / 1e9


def namespace() -> Any:
    return make_namespace("lmcv", "bench", {"bench": "scale"})


async def open_for(url: str) -> Any:
    settings = settings_from_mapping({"url": url, "op_timeout_s": 30, "connections_per_node": 4}, env={})
    ns = namespace()
    return await open_store(settings, ns), ns


def refs_of(ns: Any, strings: list[str]) -> list[ChunkRef]:
    return [ChunkRef(ns.chunk_id(s), s) for s in strings]


# --------------------------------------------------------------------------- part 1: routing


async def routing_case(url: str, pids: list[int], n: int, repeat: int, lookups: int) -> dict[str, Any]:
    store, ns = await open_for(url)
    try:
        strings = [f"route-{i}" for i in range(n)]
        refs = refs_of(ns, strings)
        payloads = [bytearray(os.urandom(64)) * (CHUNK // 64) for _ in range(n)]
        meta = ChunkMeta(shapes=((CHUNK,),), dtypes=("uint8",), fmt=0)
        items = [(r, meta, p) for r, p in zip(refs, payloads)]
        dests = [bytearray(CHUNK) for _ in range(n)]
        out: dict[str, Any] = {}
        assert all(await store.put_many(items))

        async def put() -> None:
            if not all(await store.put_many(items)):
                raise AssertionError("a put failed")

        async def get() -> None:
            got = await store.get_many_into(list(zip(refs, dests)))
            if not all(g is not None for g in got):
                raise AssertionError("a get missed")

        for name, fn in (("put", put), ("get", get)):
            times = []
            c0, s0 = time.process_time(), server_cpu(pids)
            for _ in range(repeat):
                t = time.perf_counter()
                await fn()
                times.append(time.perf_counter() - t)
            gb = n * CHUNK * repeat / GB
            out[f"{name}_GBps"] = n * CHUNK / GB / min(times)
            out[f"{name}_cpu_s_per_GB"] = (time.process_time() - c0) / gb
            out[f"{name}_server_cpu_s_per_GB"] = (server_cpu(pids) - s0) / gb
        # lookup: 512 tiny chunks spread over every shard
        small = refs_of(ns, [f"lookup-{i}" for i in range(512)])
        tiny = ChunkMeta(shapes=((64,),), dtypes=("uint8",), fmt=0)
        assert all(await store.put_many([(r, tiny, bytes(64)) for r in small]))
        ids = [r.chunk_id for r in small]
        times = []
        await store.contains_prefix(ids)
        c0 = time.process_time()
        for _ in range(lookups):
            t = time.perf_counter()
            if await store.contains_prefix(ids) != 512:
                raise AssertionError("lookup missed")
            times.append(time.perf_counter() - t)
        out["lookup_512_ms"] = statistics.median(times) * 1000
        out["lookup_512_cpu_us_per_1k_keys"] = (time.process_time() - c0) / lookups * 1e6 * 1000 / 512
        return out
    finally:
        await store.close()


def engine_lookup_case(url: str, lookups: int) -> dict[str, Any]:
    """The 512-key lookup as an engine's synchronous call makes it (``StoreSession.contains_prefix``:
    on this thread, over the lookup lane), the chunks :func:`routing_case` stored."""
    ns = namespace()
    settings = settings_from_mapping({"url": url, "op_timeout_s": 30}, env={})
    session = StoreSession(settings, ns)
    try:
        ids = [r.chunk_id for r in refs_of(ns, [f"lookup-{i}" for i in range(512)])]
        session.contains_prefix(ids, 5)
        times = []
        c0 = time.process_time()
        for _ in range(lookups):
            t = time.perf_counter()
            if session.contains_prefix(ids, 5) != 512:
                raise AssertionError("engine lookup missed")
            times.append(time.perf_counter() - t)
        return {"engine_lookup_512_ms": statistics.median(times) * 1000,
                "engine_lookup_512_cpu_us_per_1k_keys": (time.process_time() - c0) / lookups * 1e6 * 1000 / 512}
    finally:
        session.close()


def bench_routing(quick: bool) -> dict[str, Any]:
    n, repeat, lookups = (8, 2, 21) if quick else (32, 4, 101)
    res: dict[str, Any] = {}
    with ValkeyServer(args=["--io-threads", "1"]) as one:
        res["one node"] = asyncio.run(routing_case(one.url, [one.pid], n, repeat, lookups))
        res["one node"].update(engine_lookup_case(one.url, lookups))
    with ValkeyCluster(3, args=["--io-threads", "1"]) as cluster:
        res["3-shard cluster"] = asyncio.run(
            routing_case(cluster.url, [s.pid for s in cluster.servers], n, repeat, lookups))
        res["3-shard cluster"].update(engine_lookup_case(cluster.url, lookups))
    return res


# --------------------------------------------------------------------------- part 2: processes


def _worker(url: str, wid: int, n: int, seconds: float, barrier: Any, results: Any) -> None:
    async def main() -> dict[str, Any]:
        store, ns = await open_for(url)
        try:
            strings = [f"w{wid}-{i}" for i in range(n)]
            refs = refs_of(ns, strings)
            payloads = [bytearray(os.urandom(64)) * (CHUNK // 64) for _ in range(n)]
            meta = ChunkMeta(shapes=((CHUNK,),), dtypes=("uint8",), fmt=0)
            items = [(r, meta, p) for r, p in zip(refs, payloads)]
            dests = [bytearray(CHUNK) for _ in range(n)]
            ok = await store.put_many(items)
            out: dict[str, Any] = {"setup_failed_puts": ok.count(False)}
            for phase in ("put", "get"):
                barrier.wait()
                moved = errors = 0
                c0 = time.process_time()
                t0 = time.perf_counter()
                while time.perf_counter() - t0 < seconds:
                    if phase == "put":
                        r = await store.put_many(items)
                        errors += r.count(False)
                    else:
                        got = await store.get_many_into(list(zip(refs, dests)))
                        errors += sum(g is None for g in got)
                    moved += n * CHUNK
                elapsed = time.perf_counter() - t0
                out[phase] = {"bytes": moved, "seconds": elapsed, "errors": errors,
                              "cpu_s": time.process_time() - c0}
                barrier.wait()
            return out
        finally:
            await store.close()

    try:
        results.put((wid, asyncio.run(main())))
    except BaseException as e:  # report, never hang the barrier's other parties
        barrier.abort()
        results.put((wid, {"error": f"{type(e).__name__}: {e}"}))


def bench_processes(quick: bool) -> dict[str, Any]:
    n, seconds = (4, 1.5) if quick else (8, 4.0)
    ctx = mp.get_context("spawn")
    res: dict[str, Any] = {}
    with ValkeyServer(args=["--io-threads", "1"]) as server:
        for workers in (1, 2, 4):
            server.cmd("FLUSHALL")
            barrier = ctx.Barrier(workers + 1)
            results = ctx.Queue()
            procs = [ctx.Process(target=_worker, args=(server.url, w, n, seconds, barrier, results))
                     for w in range(workers)]
            for p in procs:
                p.start()
            row: dict[str, Any] = {}
            try:
                for phase in ("put", "get"):
                    barrier.wait(timeout=300)
                    s0 = server_cpu([server.pid])
                    barrier.wait(timeout=300)
                    row[f"{phase}_server_cpu_s"] = server_cpu([server.pid]) - s0
                got = dict(results.get(timeout=120) for _ in procs)
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {e}"
                got = {}
            finally:
                for p in procs:
                    p.join(30)
                    if p.is_alive():
                        p.kill()
            for phase in ("put", "get"):
                parts = [g[phase] for g in got.values() if phase in g]
                if len(parts) != workers:
                    row.setdefault("error", "; ".join(str(g.get("error")) for g in got.values() if "error" in g))
                    continue
                gbytes = sum(p["bytes"] for p in parts) / GB
                row[f"{phase}_GBps"] = sum(p["bytes"] / p["seconds"] for p in parts) / GB
                row[f"{phase}_errors"] = sum(p["errors"] for p in parts)
                row[f"{phase}_cpu_s_per_GB"] = sum(p["cpu_s"] for p in parts) / gbytes
                row[f"{phase}_server_cpu_s_per_GB"] = row.pop(f"{phase}_server_cpu_s") / gbytes
            row["setup_failed_puts"] = sum(g.get("setup_failed_puts", 0) for g in got.values())
            res[f"{workers} worker{'s' if workers > 1 else ''}"] = row
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer chunks, shorter phases")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    print("== routing: one node vs a 3-shard cluster (4 MiB chunks; 512-key lookup) ==", flush=True)
    routing = bench_routing(args.quick)
    print(f"  {'':<18}{'put GB/s':>9}{'CPU-s/GB':>9}{'server':>8}{'get GB/s':>10}{'CPU-s/GB':>9}{'server':>8}"
          f"{'lookup ms':>11}{'CPU us/1k keys':>16}{'engine ms':>11}{'CPU us/1k keys':>16}")
    for name, r in routing.items():
        print(f"  {name:<18}{r['put_GBps']:9.2f}{r['put_cpu_s_per_GB']:9.3f}{r['put_server_cpu_s_per_GB']:8.3f}"
              f"{r['get_GBps']:10.2f}{r['get_cpu_s_per_GB']:9.3f}{r['get_server_cpu_s_per_GB']:8.3f}"
              f"{r['lookup_512_ms']:11.3f}{r['lookup_512_cpu_us_per_1k_keys']:16.0f}"
              f"{r['engine_lookup_512_ms']:11.3f}{r['engine_lookup_512_cpu_us_per_1k_keys']:16.0f}")
    one, cl = routing["one node"], routing["3-shard cluster"]
    print("  routing cost (cluster client CPU over one node's, -1): "
          f"put {cl['put_cpu_s_per_GB'] / one['put_cpu_s_per_GB'] - 1:+.1%}, "
          f"get {cl['get_cpu_s_per_GB'] / one['get_cpu_s_per_GB'] - 1:+.1%}, "
          f"lookup {cl['lookup_512_cpu_us_per_1k_keys'] / one['lookup_512_cpu_us_per_1k_keys'] - 1:+.1%} per key "
          f"(engine's: {cl['engine_lookup_512_cpu_us_per_1k_keys'] / one['engine_lookup_512_cpu_us_per_1k_keys'] - 1:+.1%}); "
          "latency: lookup "
          f"{cl['lookup_512_ms'] / one['lookup_512_ms'] - 1:+.1%}, engine's "
          f"{cl['engine_lookup_512_ms'] / one['engine_lookup_512_ms'] - 1:+.1%}",
          flush=True)
    print("== worker processes against one node (4 MiB chunks) ==", flush=True)
    procs = bench_processes(args.quick)
    print(f"  {'':<12}{'put GB/s':>9}{'errors':>7}{'CPU-s/GB':>9}{'server':>8}{'get GB/s':>10}{'errors':>7}"
          f"{'CPU-s/GB':>9}{'server':>8}")
    for name, r in procs.items():
        if "put_GBps" not in r or "get_GBps" not in r:
            print(f"  {name:<12} failed: {r.get('error')}")
            continue
        print(f"  {name:<12}{r['put_GBps']:9.2f}{r['put_errors']:7d}{r['put_cpu_s_per_GB']:9.3f}"
              f"{r['put_server_cpu_s_per_GB']:8.3f}{r['get_GBps']:10.2f}{r['get_errors']:7d}"
              f"{r['get_cpu_s_per_GB']:9.3f}{r['get_server_cpu_s_per_GB']:8.3f}"
              f"{'' if not r.get('setup_failed_puts') else '  setup puts failed: %d' % r['setup_failed_puts']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"routing": routing, "processes": procs}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
