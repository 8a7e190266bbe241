"""~1000 mixed concurrent operations; every value read is self-consistent and the
server's references balance (arena empty once every key is deleted)."""

from __future__ import annotations

import asyncio
import random
import struct

import pytest

from lmcache_valkey.transport.fabric import FabricTransport

KiB = 1 << 10
SLOT = 512 * KiB
HDR = struct.Struct("<IIQ")  # key id, version, payload length
WORKERS = 24
OPS = 1000
KEYS = 40


def payload(key_id: int, version: int, n: int) -> bytes:
    return random.Random(key_id * 1_000_003 + version).randbytes(n)


@pytest.mark.parametrize("provider", ["tcp;ofi_rxm", "shm"])
async def test_mixed_concurrent_ops(start_server, provider):
    srv = start_server(provider, arena_mb=128)
    stats = {"set": 0, "get": 0, "hit": 0, "del": 0}

    async with FabricTransport("127.0.0.1", srv.port, provider=provider, connections=8) as t:
        arena = bytearray(WORKERS * 2 * SLOT)
        t.register_buffer(arena)
        mv = memoryview(arena)
        versions = [0] * KEYS
        rng = random.Random(7)
        plan = [(rng.choice("ssggggd"), rng.randrange(KEYS), rng.randrange(1, SLOT - HDR.size)) for _ in range(OPS)]
        queue = asyncio.Queue()
        for item in plan:
            queue.put_nowait(item)

        async def worker(w: int):
            hdr = mv[w * 2 * SLOT : w * 2 * SLOT + HDR.size]
            body_ = mv[w * 2 * SLOT + HDR.size : (w + 1) * 2 * SLOT]
            while not queue.empty():
                op, k, n = queue.get_nowait()
                key = b"key-%d" % k
                if op == "s":
                    versions[k] += 1
                    v = versions[k]
                    hdr[:] = HDR.pack(k, v, n)
                    body_[:n] = payload(k, v, n)
                    await t.set_from(key, [hdr, body_[:n]], None, 30)
                    stats["set"] += 1
                elif op == "g":
                    got = await t.get_into(key, [hdr, body_], 30)
                    stats["get"] += 1
                    if got is not None:
                        kid, v, ln = HDR.unpack(hdr)
                        assert kid == k and got == HDR.size + ln
                        assert bytes(body_[:ln]) == payload(k, v, ln)
                        stats["hit"] += 1
                else:
                    await t.delete([key])
                    stats["del"] += 1

        await asyncio.gather(*(worker(w) for w in range(WORKERS)))
        assert t.pending_ops == 0
        await t.delete([b"key-%d" % k for k in range(KEYS)])

    assert stats["set"] + stats["get"] + stats["del"] == OPS and stats["hit"] > 0
    info = srv.info()
    assert info["xfers_failed"] == 0 and info["xfers_timedout"] == 0
    assert info["objects"] == 0 and info["arena_used_bytes"] == 0
