"""Resharding a Valkey Cluster with the module loaded on every node: CLUSTER MIGRATESLOTS
(Valkey 9's atomic slot migration) moves RMA-written chunks with their slots, byte-exact and
with their expiry, writes made while the move runs included; servers that cannot (Valkey 8,
Redis 7) still load the module and say so, and `doctor` tells the user what that costs."""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
import time

import pytest

from lmcache_valkey.codec import ChunkMeta
from lmcache_valkey.config import settings_from_mapping
from lmcache_valkey.keys import make_namespace
from lmcache_valkey.store import ChunkRef, open_store
from lmcache_valkey.transport.resp.cluster import key_slot
from support.servers import DEBIAN_REDIS, DEBIAN_VALKEY, ValkeyCluster, ValkeyServer

MiB = 1 << 20
PROVIDER = "tcp;ofi_rxm"
CHUNK = 512 * 1024


def _module(module_so) -> list[str]:
    return ["--loadmodule", str(module_so), "provider", PROVIDER, "bind", "127.0.0.1", "arena_mb", "128"]


def _info(server) -> dict[str, str]:
    raw = server.cmd("INFO", "lmcvblob").decode()
    return {k.removeprefix("lmcvblob_"): v.strip() for k, v in
            (line.split(":", 1) for line in raw.splitlines() if ":" in line and not line.startswith("#"))}


def _settings(url: str, **kw):
    raw = {"url": url, "transport": "fabric", "fabric_provider": PROVIDER, "fabric_bind_addr": "127.0.0.1", **kw}
    return settings_from_mapping(raw, env={})


def _address(buf: bytearray) -> tuple[int, int]:
    import ctypes

    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf)), len(buf)


class Worker:
    """One serving worker's store over the fabric transport, with its own registered arena."""

    def __init__(self, url: str, **settings) -> None:
        self.ns = make_namespace("lmcv", "t", {"model": "m"})
        self.url, self.settings = url, settings
        self.arena = bytearray(4 * CHUNK)
        self.store = None

    async def __aenter__(self) -> "Worker":
        self.store = await open_store(_settings(self.url, **self.settings), self.ns)
        self.store.register_memory(*_address(self.arena))
        return self

    async def __aexit__(self, *exc) -> None:
        await self.store.close()

    def ref(self, name: str) -> ChunkRef:
        return ChunkRef(self.ns.chunk_id(name), name)

    def slot(self, name: str) -> int:
        return key_slot(self.ns.data_key(self.ref(name).chunk_id))

    async def put(self, name: str, payload: bytes) -> bool:
        mv = memoryview(self.arena)[:CHUNK]
        mv[:] = payload
        return await self.store.put(self.ref(name), ChunkMeta(((CHUNK,),), ("uint8",), 1, name), mv)

    async def get(self, name: str) -> bytes | None:
        out = memoryview(self.arena)[CHUNK : 2 * CHUNK]
        got = await self.store.get_into(self.ref(name), out)
        return None if got is None else bytes(out)


def _names_in(worker: Worker, first: int, last: int, n: int, prefix: str) -> list[str]:
    """n chunk names whose keys hash into slots first..last."""
    names, i = [], 0
    while len(names) < n:
        name = f"{prefix}{i}"
        i += 1
        if first <= worker.slot(name) <= last:
            names.append(name)
    return names


def _migrate_atomically(c: ValkeyCluster, first: int, last: int, dst: ValkeyServer, timeout: float = 60.0) -> list:
    """CLUSTER MIGRATESLOTS on the source; returns the source's migration records once every
    node names dst as the owner of the range."""
    src = c.owner_of(first)
    assert src.cmd("CLUSTER", "MIGRATESLOTS", "SLOTSRANGE", first, last, "NODE", c.node_id(dst)) == b"OK"
    deadline = time.monotonic() + timeout
    while True:
        jobs = src.cmd("CLUSTER", "GETSLOTMIGRATIONS")
        states = [dict(zip(j[::2], j[1::2])).get(b"state") for j in jobs]
        if b"failed" in states or b"cancelled" in states:
            raise AssertionError(f"migration ended badly: {jobs}")
        if b"success" in states and all(_owner(s, first) == dst.port for s in c.servers):
            return jobs
        if time.monotonic() > deadline:
            raise AssertionError(f"migration did not finish: {jobs}")
        time.sleep(0.05)


def _owner(server: ValkeyServer, slot: int) -> int | None:
    for r in server.cmd("CLUSTER", "SLOTS"):
        if r[0] <= slot <= r[1]:
            return int(r[2][1])
    return None


def test_atomic_slot_migration_moves_rma_written_chunks_byte_exact_with_their_expiry(module_so):
    with ValkeyCluster(3, args=_module(module_so)) as c:
        src, dst = c.servers[0], c.servers[1]
        assert all(_info(s)["atomic_slot_migration"] == "1" for s in c.servers)
        first, last = c.slots[0][0], c.slots[0][0] + 2047  # part of the source's range: it stays a primary

        async def put_then_move_then_read():
            async with Worker(c.url, ttl_s=600) as w:
                moving = _names_in(w, first, last, 12, "m")
                staying = _names_in(w, c.slots[2][0], c.slots[2][1], 4, "s")
                chunks = {name: os.urandom(CHUNK) for name in moving + staying}
                for name, payload in chunks.items():
                    assert await w.put(name, payload)
                assert int(_info(src)["rma_sets"]) == len(moving)  # written by RMA, not inline
                used_before = int(_info(src)["arena_used_bytes"])

                _migrate_atomically(c, first, last, dst)

                # none left on the source: keys and the arena's extents
                assert sum(src.cmd("CLUSTER", "COUNTKEYSINSLOT", s) for s in {w.slot(n) for n in moving}) == 0
                assert int(_info(src)["arena_used_bytes"]) <= used_before - len(moving) * CHUNK
                for name in moving:  # the expiry came along
                    ttl = dst.cmd("PTTL", w.ns.data_key(w.ref(name).chunk_id))
                    assert 0 < ttl <= 600_000, (name, ttl)
            # a fresh worker (its slot map from now) reads every chunk byte-exact from its owner
            async with Worker(c.url) as fresh:
                for name, payload in chunks.items():
                    assert await fresh.get(name) == payload, name
                assert fresh.store.transport.stats["bulk_fallbacks"] == 0

        asyncio.run(put_then_move_then_read())
        assert int(_info(dst)["rma_gets"]) >= 12


def test_writes_made_while_a_slot_range_moves_reach_its_new_owner(module_so):
    """The source sends the range's snapshot, then the writes made meanwhile: an RMA-written
    value reaches that stream only because a cluster primary always propagates. Every put the
    worker saw acknowledged, before, during or after the move, reads back byte-exact."""
    with ValkeyCluster(3, args=_module(module_so)) as c:
        src, dst = c.servers[0], c.servers[1]
        first, last = c.slots[0][0], c.slots[0][0] + 4095
        acked: dict[str, bytes] = {}
        moving = threading.Event()
        done = threading.Event()

        async def writer():
            async with Worker(c.url) as w:
                names = iter(_names_in(w, first, last, 10_000, "w"))
                ballast = _names_in(w, first, last, 48, "b")  # a snapshot that takes a while to send
                for name in ballast:
                    payload = os.urandom(CHUNK)
                    assert await w.put(name, payload)
                    acked[name] = payload
                moving.set()
                during = 0
                while not done.is_set() or during < 8:
                    name = next(names)
                    payload = os.urandom(CHUNK)
                    if await w.put(name, payload):
                        acked[name] = payload
                    during += 1
                    await asyncio.sleep(0)

        t = threading.Thread(target=lambda: asyncio.run(writer()))
        t.start()
        try:
            assert moving.wait(60)
            jobs = _migrate_atomically(c, first, last, dst)
        finally:
            done.set()
            t.join(60)
        assert not t.is_alive()

        async def read_all():
            async with Worker(c.url) as fresh:
                wrong = [n for n, p in acked.items() if await fresh.get(n) != p]
                return wrong

        assert asyncio.run(read_all()) == []
        assert len(acked) > 48, jobs
        # what the target holds came from the source's stream: its replicas would see it too
        assert int(_info(src)["propagated"]) >= len(acked) - 48


@pytest.mark.parametrize("binary", [DEBIAN_VALKEY, DEBIAN_REDIS], ids=["valkey8", "redis7"])
def test_a_server_without_atomic_slot_migration_still_loads_the_module_and_says_so(module_so, binary):
    if not shutil.which(binary):
        pytest.skip(f"{binary} not installed")
    with ValkeyServer(binary=binary, args=_module(module_so)) as srv:
        assert _info(srv)["atomic_slot_migration"] == "0"
        srv.cmd("BLOB.TCP_SET", "k", b"v" * 100)
        assert srv.cmd("BLOB.TCP_GET", "k") == b"v" * 100


def test_legacy_migrate_moves_rma_written_chunks_with_their_expiry(module_so):
    """The other kind (Valkey 8 and 7, or 9 by choice): SETSLOT IMPORTING/MIGRATING, MIGRATE
    (DUMP/RESTORE of our type), SETSLOT NODE."""
    binary = DEBIAN_VALKEY if shutil.which(DEBIAN_VALKEY) else None
    with ValkeyCluster(3, binary=binary, args=_module(module_so)) as c:
        async def body():
            async with Worker(c.url, ttl_s=600) as w:
                names = _names_in(w, c.slots[0][0], c.slots[0][1], 6, "l")
                chunks = {n: os.urandom(CHUNK) for n in names}
                for n, p in chunks.items():
                    assert await w.put(n, p)
                dst = c.servers[2]
                for slot in {w.slot(n) for n in names}:
                    c.migrate_slot(slot, dst)
                for n in names:
                    assert 0 < dst.cmd("PTTL", w.ns.data_key(w.ref(n).chunk_id)) <= 600_000
                for n, p in chunks.items():  # this worker's old map: MOVED, then the new owner
                    assert await w.get(n) == p, n

        asyncio.run(body())


@pytest.mark.parametrize("config", [("--appendonly", "yes"), ()], ids=["aof", "no-aof"])
def test_an_rma_set_that_completes_while_writes_are_paused_is_refused_not_stored(start_server, config):
    """A manual failover or the cut-over of a slot migration pauses writes: a command
    waits, but an RMA SET already running finishes meanwhile. Storing it would change what
    the replica or the slot's new owner takes over as final (and propagating it to the AOF
    or a replica during the pause aborted the server): it is refused with TRYAGAIN."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    size = 64 * MiB
    srv = start_server("tcp;ofi_rxm", arena_mb=256, config=config, extra=("max_timeout_ms", "60000"))
    c = srv.client()
    c.execute_command("BLOB.TCP_SET", b"small", b"s" * 4096)
    helper = subprocess.Popen([sys.executable, str(Path(__file__).with_name("stall_client.py")), str(srv.port),
                               str(size), "30000", "warm", "small", "set"], stdout=subprocess.PIPE, text=True)
    try:
        assert helper.stdout.readline().strip() == "sent"
        deadline = time.monotonic() + 10
        while int(srv.info()["ops_posted"]) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert c.execute_command("CLIENT", "PAUSE", 10_000, "WRITE")
        os.kill(helper.pid, signal.SIGCONT)
        reply = helper.stdout.readline().strip()
        assert reply.startswith("TRYAGAIN writes are paused"), reply
        c.execute_command("CLIENT", "UNPAUSE")
        assert c.exists(b"big") == 0 and c.ping()
        assert int(srv.info()["refused"]) == 1
    finally:
        os.kill(helper.pid, signal.SIGKILL)
        helper.wait()
