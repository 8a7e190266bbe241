"""A long put loop through LMCache's RemoteBackend, for steering by CPU per byte.

    .venv/bin/python benchmarks/bench_put_loop.py [--connector NAME] [--rounds 40] [--chunk-tokens 32]

One connector (``lmcache-valkey`` by default; any name ``bench_lmcache.py`` lists) puts the
same batch (32 x 4 MiB, or 8 x 32 MiB with ``--chunk-tokens 256``) ``--rounds`` times into a
fresh Valkey 9.1.2 (``--io-threads 1``), and prints the best and the median round's GB/s and the client's and
the server's CPU seconds per GB over all rounds. More rounds than ``bench_lmcache.py`` runs, of
one operation: the figure to compare before and after a change to the put path (interleave the
runs; profile it with ``py-spy record -p PID`` or ``perf record -g -p PID`` once it prints
``ready``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import bench_lmcache as bench  # noqa: E402
from support.servers import ValkeyServer  # noqa: E402

from lmcache_valkey.integrations.lmcache.stack import Layout, build_stack  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--connector", default=bench.OURS)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--chunk-tokens", type=int, default=32, choices=(32, 256))
    args = ap.parse_args()
    n = 32 if args.chunk_tokens == 32 else 8
    layout = Layout(model="put-loop", num_layers=32, num_kv_heads=8, head_dim=128, chunk_size=args.chunk_tokens,
                    dtype=torch.bfloat16)
    with ValkeyServer(args=["--io-threads", "1"]) as server:
        spec = bench.connectors(server.port)[args.connector]
        stack = build_stack(layout, cpu_gb=max(0.25, 3 * layout.chunk_bytes * n / 1e9), blocking_timeout_secs=60, **spec)
        keys = [layout.key(10_000 + i) for i in range(n)]
        objs = [bench.fill(stack, i) for i in range(n)]
        stack.put_and_wait(keys, objs)  # the server's first writes fault pages in: not measured
        print(f"ready (pid {os.getpid()})", flush=True)
        c0, s0, times = time.process_time(), bench.server_cpu(server.pid), []
        for _ in range(args.rounds):
            t = time.perf_counter()
            stack.put_and_wait(keys, objs)
            times.append(time.perf_counter() - t)
        gb = layout.chunk_bytes * n / 1e9
        print(f"{args.connector}: {n} x {layout.chunk_bytes >> 20} MiB, best {gb / min(times):.2f} GB/s, median "
              f"{gb / statistics.median(times):.2f} GB/s, client "
              f"{(time.process_time() - c0) / (gb * args.rounds):.3f} CPU-s/GB, server "
              f"{(bench.server_cpu(server.pid) - s0) / (gb * args.rounds):.3f} CPU-s/GB", flush=True)
        # LMCache's connectors do not always return from close(): the figures are out, stop
        # the server by its PID and leave.
        server.stop()
        os._exit(0)


if __name__ == "__main__":
    main()
