"""CRC32C speed of each implementation ``lmcache_valkey.checksum`` can use, on this CPU.

    .venv/bin/python benchmarks/bench_crc.py [--repeat 20]

Prints GB/s (best of ``--repeat``, one thread) for the crc32c package and ISA-L at sizes from
a reply's small pieces to a buffer far larger than the CPU's caches (read from memory, as a
payload arriving from the socket or leaving LMCache's buffer is), and which one this process
uses (``LMCACHE_VALKEY_CRC32C``). Each implementation runs in its own interpreter, so the
module picks it the way a worker would.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

SIZES = [4 << 10, 64 << 10, 1 << 20, 4 << 20, 256 << 20]

_CHILD = r"""
import json, os, sys, time
from lmcache_valkey import checksum
repeat = int(sys.argv[1])
out = {"implementation": checksum.IMPLEMENTATION, "gbps": {}}
for n in json.loads(sys.argv[2]):
    buf = bytearray(os.urandom(min(n, 1 << 20))) * max(1, n >> 20)
    view = memoryview(buf)[:n]
    loops = max(1, (64 << 20) // n)
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(loops):
            checksum.crc32c(view)
        best = min(best, (time.perf_counter() - t) / loops)
    out["gbps"][str(n)] = n / best / 1e9
print(json.dumps(out))
"""


def run(impl: str, repeat: int) -> dict:
    env = dict(os.environ, LMCACHE_VALKEY_CRC32C=impl)
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(repeat), json.dumps(SIZES)],
        env=env, capture_output=True, text=True,
    )
    if done.returncode:
        return {"implementation": impl, "error": done.stderr.strip().splitlines()[-1]}
    return json.loads(done.stdout)


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    from lmcache_valkey import checksum

    print(f"this process uses: {checksum.IMPLEMENTATION}"
          + (f" (ISA-L missing: {checksum.ISAL_MISSING})" if checksum.ISAL_MISSING else ""))
    print("| implementation | " + " | ".join(_size(n) for n in SIZES) + " |")
    print("|---|" + "---|" * len(SIZES))
    for impl in ("crc32c", "isal"):
        r = run(impl, args.repeat)
        if "error" in r:
            print(f"| {impl} | not available: {r['error']} |")
            continue
        cells = " | ".join(f"{r['gbps'][str(n)]:.1f} GB/s" for n in SIZES)
        print(f"| {impl} | {cells} |")


if __name__ == "__main__":
    main()
