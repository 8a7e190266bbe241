"""Fabric-written chunks survive the loss of their primary.

An RMA SET's bytes come from the client's memory, which no replica or AOF loader can reach:
the module propagates each stored value as the inline ``BLOB.SET key <bytes>`` (with an
absolute expiry), and each arena eviction as a ``DEL``, but only where replication or the AOF
is on. These tests put chunks over the fabric, then read every one of them back from a
promoted replica and from a server restarted on its AOF, over the fabric again; and check that
a server with neither pays nothing.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time

import google_crc32c
import pytest

from lmcache_valkey.transport.fabric import FabricTransport

KiB, MiB = 1 << 10, 1 << 20
PROVIDER = "tcp;ofi_rxm"
SERVERS = {"valkey-9.1.2": None, "valkey-8.0": "/usr/bin/valkey-server", "redis-7.0": "/usr/bin/redis-server"}


def _binary(name: str) -> str | None:
    path = SERVERS[name]
    if path is not None and not shutil.which(path):
        pytest.skip(f"{path} not installed (scripts/setup.sh installs it)")
    return path


def _sizes(n: int) -> list[int]:
    rng = __import__("random").Random(29)
    return [rng.randrange(64 * KiB, 2 * MiB) for _ in range(n)]


async def _put_all(port: int, chunks: dict[bytes, bytes], ttl: dict[bytes, float]) -> None:
    async with FabricTransport("127.0.0.1", port, provider=PROVIDER) as t:
        arena = bytearray(sum(len(v) for v in chunks.values()))
        t.register_buffer(arena)
        mv, off = memoryview(arena), 0
        for key, value in chunks.items():
            src = mv[off : off + len(value)]
            src[:] = value
            await t.set_from(key, [src], ttl.get(key), 10)
            off += len(value)


async def _read_all(port: int, keys: list[bytes], cap: int) -> dict[bytes, bytes | None]:
    out: dict[bytes, bytes | None] = {}
    async with FabricTransport("127.0.0.1", port, provider=PROVIDER) as t:
        arena = bytearray(cap)
        t.register_buffer(arena)
        for key in keys:
            n = await t.get_into(key, [memoryview(arena)], 10)
            out[key] = None if n is None else bytes(arena[:n])
    return out


def _wait_link_up(replica) -> None:
    for _ in range(400):
        if replica.client().info("replication").get("master_link_status") == "up":
            return
        time.sleep(0.05)
    raise AssertionError(f"replica never linked: {replica.client().info('replication')}")


def _caught_up(primary, replica) -> None:
    """The replica applied everything the primary propagated so far. (WAIT would not do: it
    waits for the calling connection's own writes, and the puts came over another one.)"""
    want = primary.client().info("replication")["master_repl_offset"]
    for _ in range(600):
        if replica.client().info("replication").get("slave_repl_offset", -1) >= want:
            return
        time.sleep(0.05)
    raise AssertionError(f"replica behind: {replica.client().info('replication')}, primary at {want}")


def _chunks(n: int) -> dict[bytes, bytes]:
    return {f"chunk:{i}".encode(): os.urandom(size) for i, size in enumerate(_sizes(n))}


@pytest.mark.parametrize("name", list(SERVERS))
def test_fabric_puts_are_read_from_a_promoted_replica(start_server, name):
    binary = _binary(name)
    primary = start_server(PROVIDER, binary=binary)
    replica = start_server(PROVIDER, binary=binary, config=("--replicaof", "127.0.0.1", str(primary.port)))
    _wait_link_up(replica)
    chunks = _chunks(16)
    ttl = {b"chunk:3": 600.0}
    asyncio.run(_put_all(primary.port, chunks, ttl))
    # The inline form and a delete travel too (the delete through Valkey's own DEL).
    primary.client().execute_command("BLOB.TCP_SET", b"inline", b"x" * 1000)
    primary.client().delete(b"chunk:5")
    del chunks[b"chunk:5"]
    chunks[b"inline"] = b"x" * 1000
    _caught_up(primary, replica)
    # Each value was propagated once: sixteen RMA sets and one inline set.
    assert primary.info()["propagated"] == 17

    replica.client().execute_command("REPLICAOF", "NO", "ONE")
    primary.kill()
    got = asyncio.run(_read_all(replica.port, [*chunks, b"chunk:5"], 2 * MiB))
    assert got.pop(b"chunk:5") is None
    assert got == chunks
    for key, value in chunks.items():
        assert replica.client().execute_command("BLOB.INFO", key, "CRC") == google_crc32c.value(value)
    # The expiry is the primary's deadline, not restarted by the replica.
    assert 590_000 < replica.client().pttl(b"chunk:3") <= 600_000
    assert replica.client().pttl(b"chunk:0") == -1


def test_arena_evictions_reach_the_replica_as_deletes(start_server):
    # 8 MiB arenas, twelve 960 KiB chunks: the primary evicts the oldest; the replica must
    # drop the same ones, not keep values the primary no longer has. (Eight fit with room to
    # spare for a reader's proof nonce, so that reading the replica evicts nothing there.)
    primary = start_server(PROVIDER, arena_mb=8)
    replica = start_server(PROVIDER, arena_mb=8, config=("--replicaof", "127.0.0.1", str(primary.port)))
    _wait_link_up(replica)
    chunks = {f"e:{i}".encode(): os.urandom(960 * KiB) for i in range(12)}
    asyncio.run(_put_all(primary.port, chunks, {}))
    _caught_up(primary, replica)
    assert primary.info()["evicted"] > 0
    kept = sorted(primary.client().keys("e:*"))
    assert sorted(replica.client().keys("e:*")) == kept
    got = asyncio.run(_read_all(replica.port, kept, MiB))
    assert got == {k: chunks[k] for k in kept}
    assert replica.info()["evicted"] == 0  # it followed the primary's DELs


@pytest.mark.parametrize("name", list(SERVERS))
def test_fabric_puts_are_read_after_an_aof_restart(start_server, tmp_path, name):
    binary = _binary(name)
    data = tmp_path / "data"
    data.mkdir()
    aof = ("--dir", str(data), "--appendonly", "yes", "--appendfsync", "always")
    first = start_server(PROVIDER, binary=binary, config=aof)
    chunks = _chunks(8)
    asyncio.run(_put_all(first.port, chunks, {b"chunk:1": 600.0}))
    first.stop()
    # No RDB (--save ""), and the AOF's base was written empty at start: the values can only
    # come from the incremental AOF our propagation appended to.
    incr = [p for p in (data / "appendonlydir").iterdir() if ".incr." in p.name]
    assert incr and b"BLOB.SET" in b"".join(p.read_bytes() for p in incr)

    second = start_server(PROVIDER, binary=binary, config=aof)
    assert second.client().dbsize() == len(chunks)
    got = asyncio.run(_read_all(second.port, list(chunks), 2 * MiB))
    assert got == chunks
    assert 0 < second.client().pttl(b"chunk:1") <= 600_000


def test_nothing_is_propagated_without_a_replica_backlog_or_aof(start_server):
    srv = start_server(PROVIDER)
    asyncio.run(_put_all(srv.port, _chunks(4), {}))
    srv.client().execute_command("BLOB.TCP_SET", b"inline", b"y")
    repl = srv.client().info("replication")
    assert repl["repl_backlog_active"] == 0 and repl["master_repl_offset"] == 0
    assert srv.info()["propagated"] == 0


def test_propagate_no_keeps_fabric_writes_off_the_replica(start_server):
    # The explicit opt-out (a pure cache that accepts losing fabric-written chunks on failover,
    # to skip the copy into the stream): the replica links, and gets none of them.
    primary = start_server(PROVIDER, extra=("propagate", "no"))
    replica = start_server(PROVIDER, config=("--replicaof", "127.0.0.1", str(primary.port)))
    _wait_link_up(replica)
    chunks = _chunks(4)
    asyncio.run(_put_all(primary.port, chunks, {}))
    primary.client().set(b"marker", b"1")  # plain commands still replicate: it tells us the stream moved
    _caught_up(primary, replica)
    assert replica.client().get(b"marker") == b"1"
    assert primary.info()["propagate"] == 0 and primary.info()["propagated"] == 0
    assert primary.client().dbsize() == len(chunks) + 1
    assert replica.client().dbsize() == 1


def test_a_bad_propagate_value_refuses_to_load(start_server):
    with pytest.raises(RuntimeError, match="bad module argument propagate=maybe"):
        start_server(PROVIDER, extra=("propagate", "maybe"))
