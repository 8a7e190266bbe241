"""Time to first token, cache hit vs recompute, as the shared prefix grows: the demo's model at
1K, 2K, 4K and 8K-token prefixes.

    .venv/bin/python benchmarks/bench_ttft.py [--prefixes 1024,2048,4096,8192] [--repeats 2]
                                              [--out ttft_curve]

For each prefix length it runs the demo (``lmcache_valkey.demo``: worker A prefills and
stores the prefix's KV chunks through LMCache's RemoteBackend and this plugin; worker B, a
separate process, measures a full recompute and the cache path, best of ``--repeats``, and
checks that the logits match) against one Valkey 9.1.2 started here, each length under its own
tenant. Prints a table of both TTFTs and their ratio, and writes it as ``<out>.txt`` with a
plot, ``<out>.png``, beside it (and ``<out>.json``, every number the demo reported).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from support.servers import ValkeyServer  # noqa: E402


def run_demo(url: str, prefix: int, repeats: int, workdir: str) -> dict:
    path = os.path.join(workdir, f"demo-{prefix}.json")
    cmd = [sys.executable, "-m", "lmcache_valkey.demo", "--url", url, "--prefix-tokens", str(prefix),
           "--tenant", f"ttft-{prefix}", "--repeats", str(repeats), "--json", path, "--worker-timeout", "1200"]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0 or not os.path.exists(path):
        tail = "\n".join(proc.stdout.splitlines()[-15:])
        return {"error": f"demo exited with {proc.returncode}:\n{tail}"}
    with open(path) as f:
        return json.load(f)["b"]


def table(rows: list[dict]) -> str:
    lines = [f"{'prefix tokens':>13} {'hit tokens':>10} {'KV MiB':>7} {'TTFT hit ms':>12} "
             f"{'TTFT recompute ms':>18} {'speed-up':>9} {'load ms':>8} {'logits':>7}"]
    for r in rows:
        b = r["b"]
        if "error" in b:
            lines.append(f"{r['prefix']:>13} failed: {b['error'].splitlines()[-1] if b['error'] else ''}")
            continue
        t = b.get("timing", {})
        lines.append(f"{r['prefix']:>13,} {b['hit_tokens']:>10,} {b['bytes'] / 2**20:7.1f} "
                     f"{b['ttft_hit_s'] * 1000:12.0f} {b['ttft_recompute_s'] * 1000:18.0f} "
                     f"{b['speedup']:8.1f}x {t.get('load', 0) * 1000:8.0f} "
                     f"{'match' if b.get('logits_match') else 'DIFFER':>7}")
    return "\n".join(lines)


def plot(rows: list[dict], path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib is not installed: no plot; pip install 'lmcache-valkey[bench]')", file=sys.stderr)
        return False
    ok = [r for r in rows if "error" not in r["b"]]
    xs = [r["prefix"] for r in ok]
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    ax.plot(xs, [r["b"]["ttft_recompute_s"] * 1000 for r in ok], "o-", label="recompute (prefill all)")
    ax.plot(xs, [r["b"]["ttft_hit_s"] * 1000 for r in ok], "s-", label="hit (lookup + load + suffix)")
    for r in ok:
        ax.annotate(f"{r['b']['speedup']:.1f}x", (r["prefix"], r["b"]["ttft_hit_s"] * 1000),
                    textcoords="offset points", xytext=(0, 8), ha="center", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [f"{x // 1024}K" for x in xs])
    ax.set_xlabel("shared prefix (tokens)")
    ax.set_ylabel("time to first token (ms)")
    ax.set_title("lmcache-valkey demo model: TTFT, hit vs recompute")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefixes", default="1024,2048,4096,8192")
    ap.add_argument("--repeats", type=int, default=2, help="worker B reports the best of N runs of each path")
    ap.add_argument("--out", default="ttft_curve", help="writes <out>.txt, <out>.png and <out>.json")
    args = ap.parse_args()
    prefixes = [int(p) for p in args.prefixes.split(",")]
    rows = []
    with ValkeyServer() as server, tempfile.TemporaryDirectory(prefix="bench-ttft-") as workdir:
        for prefix in prefixes:
            print(f"prefix {prefix:,} tokens ...", flush=True)
            rows.append({"prefix": prefix, "b": run_demo(server.url, prefix, args.repeats, workdir)})
    text = table(rows)
    print(text)
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    with open(args.out + ".txt", "w") as f:
        f.write(text + "\n")
    with open(args.out + ".json", "w") as f:
        json.dump(rows, f, indent=1)
    if plot(rows, args.out + ".png"):
        print(f"wrote {args.out}.txt, {args.out}.png, {args.out}.json")
    return 0 if all("error" not in r["b"] and r["b"].get("logits_match") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
