"""A hostile module server behind the whole ChunkStore on the large-object (fabric) transport.

The server (tests/support/hostile.py) is a real asyncio server on a socket that speaks the
BLOB.* dialect just far enough: on the RMA path it answers HELLO with a real fabric address
(an endpoint this test opens, so the handshake succeeds) and then lies in its replies,
without ever moving a byte. Whatever it answers, a lookup, a get and a put are counted
misses or failures within their deadline: no exception leaves the store, no lie becomes a
hit, and memory stays bounded by what was really received (docs/resp-reply-bounds.md).
"""

from __future__ import annotations

import asyncio
import os
import time
import tracemalloc

import pytest

from lmcache_valkey.codec import ChunkMeta
from lmcache_valkey.config import settings_from_mapping
from lmcache_valkey.errors import ProtocolError, TransportError
from lmcache_valkey.keys import make_namespace
from lmcache_valkey.store import ChunkRef, ChunkStore
from lmcache_valkey.transport.fabric import commands
from lmcache_valkey.transport.fabric.endpoint import FabricEndpoint
from lmcache_valkey.transport.fabric.transport import FabricTransport
from support.hostile import CLOSE, PAUSE, HostileServer, bulk

pytestmark = pytest.mark.timeout(180)

MiB = 1 << 20
NS = make_namespace("lmcv", "default", {"model": "hostile-fabric"})
META = ChunkMeta(shapes=((4096,),), dtypes=("uint8",), fmt=0)
DEADLINE_S = 0.5
# A store call answers within its deadline plus the transport's grace (2 s) and set-up slack.
WITHIN_S = DEADLINE_S + 2.0 + 3.0
DATA_COMMANDS = {b"EXISTS", b"UNLINK", b"PEXPIRE", b"BLOB.INFO", *(c.encode() for c in commands.UPSTREAM)}

# What the server answers to every data command. None of these may become a hit, a stored
# put (but for ``+OK``: a server that says it stored a value cannot be caught lying) or an
# exception.
LIES = {
    "a negative length": b"*2\r\n:-5\r\n:0\r\n",
    "a CRC past 32 bits": b"*2\r\n:4608\r\n:99999999999\r\n",
    "a length past a TiB": b"*2\r\n:99999999999999\r\n:7\r\n",
    "bulk strings for numbers": b"*2\r\n" + bulk(b"4608") + bulk(b"7"),
    "one number": b":4608\r\n",
    "three numbers": b"*3\r\n:4608\r\n:7\r\n:1\r\n",
    "a status OK": b"+OK\r\n",
    "a bulk OK": bulk(b"OK"),
    "a 1.5 GB bulk declared": b"$1500000000\r\n",
    "an array of a billion": b"*1000000000\r\n",
    "200000 nested arrays": b"*1\r\n" * 200_000 + b":1\r\n",
    "a nil of length -2": b"$-2\r\n",
    "an array nil of length -5": b"*-5\r\n",
    "a 30-digit integer": b":" + b"9" * 30 + b"\r\n",
    "an integer with a plus": b":+1\r\n",
    "exists as -1": b":-1\r\n",
    "exists as 2": b":2\r\n",
    "a RESP3 map": b"%1\r\n:1\r\n:1\r\n",
    "binary garbage": b"\x00\xffgarbage\r\n",
    "a 100 KiB line": b"+" + b"x" * (100 << 10) + b"\r\n",
    "a deadline error with a 5000-digit count": b"-TIMEOUT inflight=" + b"9" * 5000 + b"\r\n",
    "half a reply, then silence": b"$600\r\nabc",
    "silence": PAUSE,
    "a dropped connection": CLOSE,
}


class FabricLiar:
    """The lie for data commands; on the RMA path, a HELLO that works: the extended form is
    refused (as a server without our extensions does) and the plain one names ``address``."""

    def __init__(self, reply, address: bytes | None = None) -> None:
        self.reply, self.address = reply, address

    def __call__(self, name: bytes, args: list[bytes]):
        if name == commands.HELLO.encode():
            if len(args) > 1:
                return b"-ERR unknown option\r\n"
            return b"*1\r\n" + bulk(self.address.hex().encode())
        if name in DATA_COMMANDS:
            return self.reply
        return None


def ref(i: int) -> ChunkRef:
    return ChunkRef(NS.chunk_id(f"key-{i}"), f"key-{i}")


def _settings(server: HostileServer):
    return settings_from_mapping({"url": server.url, "cluster": "no", "lookup_timeout_s": DEADLINE_S,
                                  "op_timeout_s": DEADLINE_S, "connect_timeout_s": 2}, env={})


def _counted(store: ChunkStore) -> dict[str, float]:
    from prometheus_client import REGISTRY

    def total(name: str) -> float:
        return sum(s.value for m in REGISTRY.collect() for s in m.samples if s.name == name)

    return {n: total(n) for n in ("lmcache_valkey_errors_total", "lmcache_valkey_misses_total",
                                  "lmcache_valkey_hits_total")}


async def _every_call_misses(store: ChunkStore, reply) -> None:
    put_taken = reply == LIES["a status OK"]
    before = _counted(store)
    tracemalloc.start()
    try:
        calls = [
            (store.contains_prefix([ref(i).chunk_id for i in range(3)]), 0),
            (store.contains_each([ref(0).chunk_id]), [False]),
            (store.get_many_into([(ref(0), memoryview(bytearray(4096)))]), [None]),
            (store.put_many([(ref(1), META, memoryview(os.urandom(4096)))]), [put_taken]),
        ]
        for call, miss in calls:
            started = time.monotonic()
            assert await call == miss
            assert time.monotonic() - started < WITHIN_S
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * MiB, f"{peak / MiB:.0f} MiB held for replies the server only declared"
    after = _counted(store)
    assert after["lmcache_valkey_hits_total"] == before["lmcache_valkey_hits_total"]
    assert after["lmcache_valkey_errors_total"] > before["lmcache_valkey_errors_total"]


@pytest.mark.parametrize("reply", LIES.values(), ids=LIES.keys())
async def test_on_the_bulk_path_whatever_the_module_answers_is_a_counted_miss(reply) -> None:
    with HostileServer(FabricLiar(reply)) as server:
        transport = FabricTransport("127.0.0.1", server.port, data_path="bulk", connections=2)
        store = ChunkStore(_settings(server), NS, transport, transport_name="fabric")
        try:
            await _every_call_misses(store, reply)
        finally:
            await store.close()


@pytest.mark.parametrize("reply", [LIES[k] for k in (
    "a negative length", "a CRC past 32 bits", "a length past a TiB", "bulk strings for numbers", "one number",
    "three numbers", "a status OK", "a bulk OK", "a 1.5 GB bulk declared", "200000 nested arrays",
    "exists as -1", "a deadline error with a 5000-digit count", "binary garbage", "silence")],
    ids=lambda r: next(k for k, v in LIES.items() if v is r))
async def test_on_the_rma_path_whatever_the_module_answers_is_a_counted_miss(reply) -> None:
    """The server took our HELLO (a real address) and then never moves a byte: its replies
    to RDMA_GET/RDMA_SET claim what they like."""
    peer = FabricEndpoint("tcp;ofi_rxm", "127.0.0.1")
    try:
        with HostileServer(FabricLiar(reply, peer.name)) as server:
            transport = FabricTransport("127.0.0.1", server.port, provider="tcp;ofi_rxm", bind_addr="127.0.0.1",
                                        connections=2, bulk_fallback=False)
            store = ChunkStore(_settings(server), NS, transport, transport_name="fabric")
            try:
                await _every_call_misses(store, reply)
            finally:
                await store.close()
    finally:
        peer.close()


HELLO_LIES = {
    "an address that is not hex": b"*1\r\n" + bulk(b"zz"),
    "an address of one byte": b"*1\r\n" + bulk(b"ab"),
    "a thousand addresses": b"*1000\r\n" + bulk(b"ab") * 1000,
    "a number": b":1\r\n",
    "a 1.5 GB address declared": b"*1\r\n$1500000000\r\n",
    "200000 nested arrays": b"*1\r\n" * 200_000 + b":1\r\n",
    "non-ASCII bytes": b"*1\r\n" + bulk(b"\xff\xfe"),
}


@pytest.mark.parametrize("reply", HELLO_LIES.values(), ids=HELLO_LIES.keys())
async def test_a_lying_hello_fails_the_connection_with_a_protocol_error(reply) -> None:
    def lie(name: bytes, args: list[bytes]):
        if name == commands.HELLO.encode():
            return b"-ERR unknown option\r\n" if len(args) > 1 else reply
        return None

    with HostileServer(lie) as server:
        async with FabricTransport("127.0.0.1", server.port, provider="tcp;ofi_rxm", bind_addr="127.0.0.1",
                                   connections=1) as t:
            with pytest.raises(ProtocolError):
                await asyncio.wait_for(t.connect(), WITHIN_S)


@pytest.mark.parametrize("reply,parse", [
    ([-5, 0], commands.parse_get_reply), ([5, -1], commands.parse_get_reply),
    ([5, 1 << 32], commands.parse_get_reply), ([True, 0], commands.parse_get_reply),
    ([b"5", 0], commands.parse_get_reply), ([5], commands.parse_get_reply), (5, commands.parse_get_reply),
    ([b"len", -1, b"crc", 0], commands.parse_info_reply), ([b"len", 5, b"crc", 1 << 40], commands.parse_info_reply),
    ([b"\xff", 5, b"crc", 0], commands.parse_info_reply), ([b"len"] * 1000, commands.parse_info_reply),
    ([1, 5, 2, 0], commands.parse_info_reply),
])
def test_reply_parsers_refuse_what_no_module_sends(reply, parse) -> None:
    with pytest.raises(ProtocolError):
        parse(reply)


def test_a_protocol_error_is_a_transport_error_the_store_counts() -> None:
    assert issubclass(ProtocolError, TransportError) and ProtocolError.cause == "protocol"


async def test_a_reply_nobody_asked_for_drops_the_connection() -> None:
    """One EXISTS answered twice: the spare reply would answer whoever asks next on that
    connection, so the connection is closed instead of being handed out again."""
    spares = [b":0\r\n:1\r\n"]

    def lie(name: bytes, args: list[bytes]):
        return spares.pop() if name == b"EXISTS" and spares else None

    with HostileServer(lie) as server:
        server.data[NS.data_key(ref(0).chunk_id)] = b"v"
        transport = FabricTransport("127.0.0.1", server.port, data_path="bulk", connections=1)
        store = ChunkStore(_settings(server), NS, transport, transport_name="fabric")
        try:
            assert await store.contains_each([ref(0).chunk_id]) == [False]  # the lie itself
            await asyncio.sleep(0.2)  # the spare reply is in by now
            assert await store.contains_each([ref(0).chunk_id, ref(1).chunk_id]) == [True, False]
            assert transport.stats["plain_connections"] == 2
        finally:
            await store.close()


SHM_NAME_LIES = {
    "no NUL": b"fi_shm://1:0:0",
    "a control byte": b"fi_shm://\x01:0:0\x00",
    "only NULs": b"\x00" * 19,
    "NUL, then more name": b"fi_shm://1\x00:0:0\x00",
    "300 bytes": b"fi_shm://" + b"9" * 290 + b"\x00",
    "another scheme": b"fi_sockaddr_in://127.0.0.1:1\x00",
    "a bare /dev/shm name": b"lmcv-victim\x00",
}


@pytest.mark.parametrize("name", SHM_NAME_LIES.values(), ids=SHM_NAME_LIES.keys())
def test_a_string_address_that_is_not_one_name_never_reaches_the_provider(name) -> None:
    with FabricEndpoint("shm") as ep:
        with pytest.raises(ValueError, match="fabric address"):
            ep.peer_name(name)
        assert ep.peer_name(b"fi_shm://1:0:0\x00") == b"fi_shm://1:0:0\x00"  # shorter than ours, and fine
        assert ep.peer_name(b"fi_shm://1:0:0\x00\x00\x00") == b"fi_shm://1:0:0\x00"  # one peer, one entry
