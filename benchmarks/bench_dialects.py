"""What each fabric command dialect costs, beside RESP, on one server (docs/fabric-dma-dialect.md).

One Valkey 9.1.2 with the reference module (its secure default: every session proves its
address). For each value size, one value at a time, GET and SET GB/s of:

  lo       valkey-large-object's BLOB.RDMA_* (the module's own type: no copy on the server);
  lo+hdr   the same, the value in two buffers as the store sends a chunk (a 512-byte header
           staged in scratch, the payload in place: two regions in one command);
  dma      Momento's DMA.* (plain strings: the server copies between the string and its arena);
  dma+hdr  the same in two buffers (one region per command: the client copies the value
           through its bounce area as well);
  resp     plain GET/SET with valkey-py (the anchor, and what DMA.* values are shared with).

Rounds are interleaved and medians reported, so the ratios come from the same minutes.

    .venv/bin/python benchmarks/bench_dialects.py [--sizes 4,32] [--seconds 1] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_fabric import resp_bandwidth, start_server  # noqa: E402

from lmcache_valkey.codec import HEADER_SIZE  # noqa: E402
from lmcache_valkey.transport.fabric import FabricTransport  # noqa: E402

MiB = 1 << 20
PROVIDER = "tcp;ofi_rxm"
PATHS = ("lo", "lo+hdr", "dma", "dma+hdr")


async def fabric_bandwidth(port: int, size: int, seconds: float, dialect: str, split: bool) -> tuple[float, float]:
    async with FabricTransport("127.0.0.1", port, provider=PROVIDER, connections=1, dialect=dialect,
                               bounce_bytes=2 * (size + HEADER_SIZE) if dialect == "dma" else 0) as t:
        arena = bytearray(2 * size)
        t.register_buffer(arena)
        mv = memoryview(arena)
        mv[:size] = os.urandom(size)
        header_out, header_in = bytearray(os.urandom(HEADER_SIZE)), bytearray(HEADER_SIZE)
        src = [memoryview(header_out), mv[:size]] if split else [mv[:size]]
        dst = [memoryview(header_in), mv[size:]] if split else [mv[size:]]
        await t.set_from(b"bench", src, None, 30)
        await t.get_into(b"bench", dst, 30)  # warm-up: connection, HELLO and proof
        out = []
        for op in ("get", "set"):
            moved, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                if op == "get":
                    await t.get_into(b"bench", dst, 30)
                else:
                    await t.set_from(b"bench", src, None, 30)
                moved += size
            out.append(moved / (time.perf_counter() - t0))
        assert t.stats["bulk_fallbacks"] == 0, "a transfer went over TCP: the numbers would not be the fabric's"
        await t.delete([b"bench"])
        return out[0], out[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4,32", help="MiB, comma-separated")
    ap.add_argument("--seconds", type=float, default=1.0, help="per measurement")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported")
    args = ap.parse_args()
    sizes = [int(s) * MiB for s in args.sizes.split(",")]
    proc, port = start_server(PROVIDER, arena_mb=4 * max(sizes) // MiB + 64)
    rows = []
    try:
        for size in sizes:
            samples: dict[str, list[float]] = {f"{p} {op}": [] for p in (*PATHS, "resp") for op in ("GET", "SET")}
            for _ in range(args.rounds):
                for path in PATHS:
                    g, s = asyncio.run(fabric_bandwidth(port, size, args.seconds, path.split("+")[0].replace("lo", "large-object"),
                                                        path.endswith("+hdr")))
                    samples[f"{path} GET"].append(g)
                    samples[f"{path} SET"].append(s)
                g, s = resp_bandwidth(port, size, args.seconds)
                samples["resp GET"].append(g)
                samples["resp SET"].append(s)
            rows.append((size, {k: statistics.median(v) for k, v in samples.items()}))
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait()
    gb = 1e9
    print(f"provider={PROVIDER}  medians of {args.rounds} interleaved rounds, GB/s, one value at a time;"
          " (x) = ratio to RESP")
    cols = [f"{p} {op}" for op in ("GET", "SET") for p in (*PATHS, "resp")]
    print(f"{'size':>6} " + " ".join(f"{c:>14}" for c in cols))
    for size, m in rows:
        cells = []
        for c in cols:
            anchor = m["resp " + c.split()[-1]]
            cells.append(f"{m[c] / gb:6.2f} ({m[c] / anchor:4.2f}x)" if not c.startswith("resp") else f"{m[c] / gb:14.2f}")
        print(f"{size // MiB:>4}Mi " + " ".join(f"{x:>14}" for x in cells))


if __name__ == "__main__":
    main()
