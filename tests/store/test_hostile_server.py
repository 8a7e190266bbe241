"""A hostile or broken server behind the whole ChunkStore: garbage, lies, pauses, huge lengths.

The server (tests/support/hostile.py) is a real asyncio RESP server on a socket. Whatever it
sends, a lookup, a get and a put through the store end as counted misses or failures
within their deadlines: no exception leaves the store, and memory stays bounded by what
was really received, never by what the server declares.
"""

from __future__ import annotations

import asyncio
import os
import tracemalloc

import pytest
from prometheus_client.parser import text_string_to_metric_families

from lmcache_valkey import metrics
from lmcache_valkey.codec import ChunkMeta
from lmcache_valkey.config import settings_from_mapping
from lmcache_valkey.keys import make_namespace
from lmcache_valkey.store import ChunkRef, open_store
from support.hostile import CLOSE, PAUSE, HostileServer

pytestmark = pytest.mark.timeout(120)

MiB = 1 << 20
NS = make_namespace("lmcv", "default", {"model": "hostile-test"})
META = ChunkMeta(shapes=((4096,),), dtypes=("uint8",), fmt=0)
DATA_COMMANDS = (b"EXISTS", b"GET", b"SET", b"UNLINK")


def counter(name: str, **labels: str) -> float:
    for fam in text_string_to_metric_families(metrics.render_latest().decode()):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


def total(name: str, **labels: str) -> float:
    out = 0.0
    for fam in text_string_to_metric_families(metrics.render_latest().decode()):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                out += s.value
    return out


def ref(i: int) -> ChunkRef:
    return ChunkRef(NS.chunk_id(f"key-{i}"), f"key-{i}")


# What the server answers to every data command, and the cause a lookup is counted under.
LIES = {
    "a 1.5 GB bulk declared": (b"$1500000000\r\n", "protocol"),
    "an array holding a 1.5 GB bulk": (b"*1\r\n$1500000000\r\n", "protocol"),
    "200000 nested arrays": (b"*1\r\n" * 200_000 + b":1\r\n", "protocol"),
    "a negative integer": (b":-1\r\n", "protocol"),
    "an integer out of range": (b":2\r\n", "protocol"),
    "a nil of length -2": (b"$-2\r\n", "protocol"),
    "an array nil of length -5": (b"*-5\r\n", "protocol"),
    "a bulk OK": (b"$2\r\nOK\r\n", "protocol"),
    "a redirection to slot 99999": (b"-MOVED 99999 h:1\r\n", "protocol"),
    "binary garbage": (b"\x00\xffgarbage\r\n", "protocol"),
    "a 30-digit integer": (b":" + b"9" * 30 + b"\r\n", "protocol"),
    "half a reply, then silence": (b"$600\r\nabc", "deadline"),
    "silence": (PAUSE, "deadline"),
    "a dropped connection": (CLOSE, "connection"),
}


def _settings(server: HostileServer, **kw):
    raw = {"url": server.url, "cluster": "no", "lookup_timeout_s": 0.5, "op_timeout_s": 0.5,
           "connect_timeout_s": 2, "connections_per_node": 2, **kw}
    return settings_from_mapping(raw, env={})


@pytest.mark.parametrize("reply,cause", LIES.values(), ids=LIES.keys())
async def test_whatever_the_server_sends_the_store_answers_misses_within_bounded_memory(reply, cause) -> None:
    def lie(name: bytes, args: list[bytes]):
        return reply if name in DATA_COMMANDS else None

    with HostileServer(lie) as server:
        store = await open_store(_settings(server), NS)
        try:
            lookup_errors = counter("lmcache_valkey_errors_total", op="lookup", cause=cause)
            misses = total("lmcache_valkey_misses_total", tier="ram")
            put_errors = total("lmcache_valkey_errors_total", op="put")
            hits = total("lmcache_valkey_hits_total")
            tracemalloc.start()
            try:
                assert await store.contains_prefix([ref(i).chunk_id for i in range(4)]) == 0
                assert await store.contains_each([ref(0).chunk_id]) == [False]
                dest = bytearray(4096)
                assert await store.get_many_into([(ref(0), memoryview(dest))]) == [None]
                assert await store.put_many([(ref(1), META, memoryview(os.urandom(4096)))]) == [False]
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert peak < 64 * MiB, f"{peak / MiB:.0f} MiB held for replies the server only declared"
            assert counter("lmcache_valkey_errors_total", op="lookup", cause=cause) == lookup_errors + 2
            assert total("lmcache_valkey_misses_total", tier="ram") == misses + 1
            assert total("lmcache_valkey_errors_total", op="put") == put_errors + 1
            assert total("lmcache_valkey_hits_total") == hits
        finally:
            await store.close()



async def test_a_reply_nobody_asked_for_drops_the_connection() -> None:
    """One EXISTS answered twice: the spare reply would answer whoever asks next on that
    connection, so the connection is closed instead of going back to the pool."""
    spares = [b":0\r\n:1\r\n"]

    def lie(name: bytes, args: list[bytes]):
        return spares.pop() if name == b"EXISTS" and spares else None

    with HostileServer(lie) as server:
        server.data[NS.data_key(ref(0).chunk_id)] = b"v"
        store = await open_store(_settings(server, connections_per_node=1), NS)
        try:
            (pool,) = store.transport._pools.values()
            first = set(pool._all)
            assert await store.contains_each([ref(0).chunk_id]) == [False]  # the lie itself
            for _ in range(500):  # the spare reply arrives with the answer or just after it
                if all(c.broken for c in first):
                    break
                await asyncio.sleep(0.01)
            assert all(c.broken for c in first)
            assert await store.contains_each([ref(0).chunk_id, ref(1).chunk_id]) == [True, False]
            assert not first & pool._all
        finally:
            await store.close()



async def test_cluster_slots_with_huge_ranges_fail_start_up_with_a_protocol_error_not_gigabytes() -> None:
    from lmcache_valkey.errors import ProtocolError

    def lie(name: bytes, args: list[bytes]):
        if name == b"CLUSTER":
            return b"*1\r\n*3\r\n:0\r\n:999999999999\r\n*2\r\n$9\r\n127.0.0.1\r\n:6379\r\n"
        return None

    with HostileServer(lie, cluster=True) as server:
        tracemalloc.start()
        try:
            with pytest.raises(ProtocolError, match="CLUSTER SLOTS"):
                await open_store(_settings(server, cluster="auto"), NS)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 64 * MiB



async def test_a_cluster_node_redirecting_to_slot_99999_is_a_counted_miss() -> None:
    def lie(name: bytes, args: list[bytes]):
        return b"-MOVED 99999 127.0.0.1:1\r\n" if name in DATA_COMMANDS else None

    with HostileServer(lie, cluster=True) as server:
        store = await open_store(_settings(server, cluster="auto"), NS)
        try:
            assert store.transport.is_cluster
            before = counter("lmcache_valkey_errors_total", op="lookup", cause="protocol")
            assert await store.contains_prefix([ref(0).chunk_id]) == 0
            assert await store.get_many_into([(ref(0), memoryview(bytearray(4096)))]) == [None]
            assert await store.put_many([(ref(0), META, memoryview(bytes(4096)))]) == [False]
            assert counter("lmcache_valkey_errors_total", op="lookup", cause="protocol") == before + 1
        finally:
            await store.close()



async def test_redirections_to_ever_new_nodes_stop_at_a_bounded_number_of_pools(monkeypatch) -> None:
    from lmcache_valkey.transport.resp import client as client_mod

    monkeypatch.setattr(client_mod, "MAX_NODES", 4, raising=False)
    hosts = iter(range(2, 250))
    server_port = []

    def lie(name: bytes, args: list[bytes]):
        # 127.0.0.x for x >= 2 at the server's own port: surely refused (the server holds 127.0.0.1 only)
        return b"-MOVED 5 127.0.0.%d:%d\r\n" % (next(hosts), server_port[0]) if name == b"EXISTS" else None

    with HostileServer(lie, cluster=True) as server:
        server_port.append(server.port)
        store = await open_store(_settings(server, cluster="auto", connect_timeout_s=0.2), NS)
        try:
            for _ in range(10):
                assert await store.contains_prefix([ref(0).chunk_id]) == 0
            assert len(store.transport._pools) <= 4
        finally:
            await store.close()

