"""The reference module speaks Momento's DMA dialect (momentohq/vdma, design/Design.md):

    DMA.HELLO                                                   -> [server address hex, ...]
    DMA.SET <address> <rkey> <remote-address> <length> <key> [<crc>]      -> length
    DMA.GET <address> <rkey> <remote-address> <capacity> <key> [<crc-flag>] -> n | [n, crc] | nil
    DMA.INFO                                                    -> ["field: value", ...]

with values kept as plain Valkey strings, so that a RESP worker's GET reads what DMA.SET wrote
and a RESP worker's SET is served by DMA.GET. Driven here by a bare libfabric endpoint and a
raw RESP connection, the way a client written from that design would; then the secure default
(a proven session, confined to its regions) and what the weak mode leaves open.
"""

from __future__ import annotations

import os
import time
from typing import Iterator

import google_crc32c
import pytest

from lmcache_valkey.transport.fabric import FabricEndpoint
from support.rawresp import Conn, is_error

PROVIDER = "tcp;ofi_rxm"
KiB = 1 << 10


class Client:
    """One client process: a fabric endpoint with a registered buffer, RESP connections."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.ep = FabricEndpoint(PROVIDER, "127.0.0.1")
        self.buf = bytearray(1 << 20)
        self.mem = memoryview(self.buf)
        self.mr = self.ep.register_buffer(self.buf)
        self.conns: list[Conn] = []

    def conn(self) -> Conn:
        c = Conn("127.0.0.1", self.port, None)
        self.conns.append(c)
        return c

    @property
    def addr(self) -> str:
        return self.ep.name.hex()

    def at(self, offset: int) -> int:
        return self.mr.remote_addr(self.mr.addr) + offset

    def hello(self, c: Conn) -> None:
        for a in c.ok("DMA.HELLO"):  # "the client inserts all of them into its address vector"
            self.ep.add_peer(bytes.fromhex(a.decode() if isinstance(a, bytes) else a))

    def prove(self, c: Conn, regions: list[tuple[int, int, int]], nonce_at: int) -> None:
        """Our extension: a session for this address, proven (the nonce is read back from
        ``nonce_at``, inside the regions), confined to ``regions``."""
        args: list[object] = ["DMA.HELLO", self.addr, "PROOF"]
        for r in regions:
            args += ["REGION", *r]
        servers, nonce = c.ok(*args)
        for a in servers:
            self.ep.add_peer(bytes.fromhex(a.decode()))
        self.mem[nonce_at : nonce_at + len(nonce)] = nonce
        assert c.ok("DMA.PROVE", self.mr.key, self.at(nonce_at)) in (b"OK", "OK")

    def close(self) -> None:
        for c in self.conns:
            c.close()
        self.ep.close()


@pytest.fixture
def weak(start_server) -> Iterator:
    """A server in Momento's model: any client names its address with each command."""
    srv = start_server(PROVIDER, extra=("require_proof", "no"))
    client = Client(srv.port)
    yield srv, client
    client.close()


@pytest.fixture
def secure(start_server) -> Iterator:
    srv = start_server(PROVIDER)  # require_proof yes: the default
    client = Client(srv.port)
    yield srv, client
    client.close()


def test_hello_answers_the_server_addresses_and_can_be_repeated(weak):
    _, client = weak
    c = client.conn()
    first = c.ok("DMA.HELLO")
    assert isinstance(first, list) and len(first) == 1
    bytes.fromhex(first[0].decode() if isinstance(first[0], bytes) else first[0])
    assert c.ok("DMA.HELLO") == first  # stateless: no session is opened by it


def test_set_stores_a_plain_string_that_get_and_dma_get_read(weak):
    srv, client = weak
    c = client.conn()
    client.hello(c)
    value = os.urandom(300 * KiB + 3)
    client.mem[: len(value)] = value
    crc = google_crc32c.value(value)
    assert c.ok("DMA.SET", client.addr, client.mr.key, client.at(0), len(value), b"k", crc) == len(value)
    assert srv.client().get(b"k") == value  # a RESP worker's GET reads it
    assert srv.client().type(b"k") == b"string"

    out = 512 * KiB
    assert c.ok("DMA.GET", client.addr, client.mr.key, client.at(out), 400 * KiB, b"k") == len(value)
    assert client.mem[out : out + len(value)] == value
    client.mem[out : out + len(value)] = bytes(len(value))
    # With the flag (any value: its presence asks), the CRC comes back too.
    assert c.ok("DMA.GET", client.addr, client.mr.key, client.at(out), 400 * KiB, b"k", 0) == [len(value), crc]
    assert client.mem[out : out + len(value)] == value
    assert c("DMA.GET", client.addr, client.mr.key, client.at(out), 400 * KiB, b"absent") is None


def test_a_resp_workers_set_is_served_by_dma_get(weak):
    srv, client = weak
    value = os.urandom(64 * KiB)
    srv.client().set(b"from-resp", value)
    c = client.conn()
    client.hello(c)
    assert c.ok("DMA.GET", client.addr, client.mr.key, client.at(0), len(value), b"from-resp", 1) == [
        len(value), google_crc32c.value(value)]
    assert client.mem[: len(value)] == value
    # Each copy between a string and the arena is counted.
    assert srv.info()["dma_copied_bytes"] == len(value) and srv.info()["dma_gets"] == 1


def test_refusals_read_as_the_design_words_them(weak):
    srv, client = weak
    c = client.conn()
    client.hello(c)
    value = os.urandom(8 * KiB)
    client.mem[: len(value)] = value
    k, a, addr = client.mr.key, client.at(0), client.addr
    wrong = (google_crc32c.value(value) + 1) % (1 << 32)
    reply = c("DMA.SET", addr, k, a, len(value), b"k", wrong)
    assert is_error(reply, "ERR checksum mismatch: client 0x") and "(value not stored)" in reply.message
    assert srv.client().exists(b"k") == 0
    assert c.ok("DMA.SET", addr, k, a, len(value), b"k") == len(value)
    assert is_error(c("DMA.GET", addr, k, a, 100, b"k"),
                    f"ERR value of {len(value)} bytes exceeds the client buffer of 100 bytes")
    assert is_error(c("DMA.SET", "zz", k, a, 10, b"x"), "ERR invalid hex in address")
    assert is_error(c("DMA.SET", addr, "x", a, 10, b"x"), "ERR invalid integer in advertisement")
    assert is_error(c("DMA.SET", addr, k, a, "ten", b"x"), "ERR length is not an integer or out of range")
    assert is_error(c("DMA.SET", addr, k, a, 10, b"x", "crc"), "ERR crc is not an integer or out of range")
    assert is_error(c("DMA.SET", addr, k, a, 10), "ERR wrong number of arguments")
    srv.client().lpush(b"list", b"x")
    assert is_error(c("DMA.GET", addr, k, a, 10, b"list"), "WRONGTYPE")


def test_set_replaces_any_value_and_its_ttl_as_set_does(weak):
    srv, client = weak
    c = client.conn()
    client.hello(c)
    srv.client().set(b"k", b"old", px=600_000)
    client.mem[:5] = b"fresh"
    assert c.ok("DMA.SET", client.addr, client.mr.key, client.at(0), 5, b"k") == 5
    assert srv.client().get(b"k") == b"fresh" and srv.client().pttl(b"k") == -1


def test_info_describes_the_provider(weak):
    _, client = weak
    lines = [x.decode() if isinstance(x, bytes) else x for x in client.conn().ok("DMA.INFO")]
    fields = dict(line.split(": ", 1) for line in lines)
    assert list(fields) == ["provider", "addr_format", "mr_mode", "caps", "requires_local_mr",
                            "uses_virtual_addressing"]
    assert "tcp" in fields["provider"] and "RMA" in fields["caps"]
    assert fields["requires_local_mr"] in ("true", "false")


def test_the_secure_default_serves_only_a_proven_session_for_its_own_address(secure):
    srv, client = secure
    c = client.conn()
    value = os.urandom(4 * KiB)
    client.mem[: len(value)] = value
    k, a = client.mr.key, client.at(0)
    # Momento's form alone: any client could name any address, so it is refused.
    client.hello(c)
    assert is_error(c("DMA.SET", client.addr, k, a, len(value), b"k"), "NOPROOF")
    # Proven and confined to the first half of the buffer.
    client.prove(c, [(k, a, 512 * KiB)], nonce_at=256 * KiB)
    assert c.ok("DMA.SET", client.addr, k, a, len(value), b"k") == len(value)
    assert srv.client().get(b"k") == value
    assert is_error(c("DMA.GET", client.addr, k, client.at(600 * KiB), 8 * KiB, b"k"), "BADREGION")
    # Another client's address, named on this connection: refused, nothing moves.
    other = Client(srv.port)
    try:
        assert is_error(c("DMA.GET", other.addr, other.mr.key, other.at(0), 8 * KiB, b"k"), "NOPROOF")
        assert other.mem[: len(value)] != value
    finally:
        other.close()
    assert srv.info()["outside_regions"] == 1


def test_dma_set_reaches_a_replica(start_server):
    primary = start_server(PROVIDER, extra=("require_proof", "no"))
    replica = start_server(PROVIDER, config=("--replicaof", "127.0.0.1", str(primary.port)))
    for _ in range(400):
        if replica.client().info("replication").get("master_link_status") == "up":
            break
        time.sleep(0.05)
    client = Client(primary.port)
    try:
        c = client.conn()
        client.hello(c)
        value = os.urandom(200 * KiB)
        client.mem[: len(value)] = value
        assert c.ok("DMA.SET", client.addr, client.mr.key, client.at(0), len(value), b"k") == len(value)
        for _ in range(200):
            if replica.client().get(b"k") == value:
                break
            time.sleep(0.05)
        assert replica.client().get(b"k") == value
    finally:
        client.close()


def test_the_worker_acl_line_confines_dma_commands_to_the_tenants_keys(start_server):
    # DMA.SET/DMA.GET name their key fifth: the module declares it there, so the line's key
    # pattern applies to it exactly as to GET/SET.
    from lmcache_valkey import acl

    srv = start_server(PROVIDER, extra=("require_proof", "no"))
    admin = srv.client()
    line = acl.worker_line("w1", "t1", password="pw1", fabric=True, fabric_dialect="dma")
    admin.execute_command("ACL", "SETUSER", *line.split()[1:])
    admin.set(b"lmcv:t2:chunk", b"theirs")
    client = Client(srv.port)
    try:
        c = client.conn()
        c.ok("AUTH", "w1", "pw1")
        client.hello(c)
        k, a = client.mr.key, client.at(0)
        client.mem[:4] = b"mine"
        assert c.ok("DMA.SET", client.addr, k, a, 4, b"lmcv:t1:chunk") == 4
        assert c.ok("GET", b"lmcv:t1:chunk") == b"mine"
        assert is_error(c("DMA.SET", client.addr, k, a, 4, b"lmcv:t2:chunk"), "NOPERM")
        assert is_error(c("DMA.GET", client.addr, k, client.at(64), 64, b"lmcv:t2:chunk"), "NOPERM")
        assert client.mem[64:70] != b"theirs" and admin.get(b"lmcv:t2:chunk") == b"theirs"
        assert is_error(c("DMA.INFO"), "NOPERM")  # not on the worker's line
    finally:
        client.close()


async def test_a_read_never_evicts_stored_values_for_its_copy(start_server):
    # DMA.GET copies a string into the arena: with no room it says so (OOM) and deletes
    # nothing -- not the values of a tenant whose keys the reader may not even write, and not
    # on a replica, which must hold what its primary holds. The client then reads over TCP.
    from lmcache_valkey.transport.fabric import FabricTransport

    srv = start_server(PROVIDER, arena_mb=16)
    admin = srv.client()
    for i in range(3):
        admin.execute_command("BLOB.TCP_SET", f"lmcv:t2:{i}".encode(), os.urandom(4 << 20))
    big = os.urandom(8 << 20)
    admin.set(b"lmcv:t1:big", big)
    async with FabricTransport("127.0.0.1", srv.port, dialect="dma", bounce_bytes=0) as t:
        arena = bytearray(8 << 20)
        t.register_buffer(arena)
        assert await t.get_into(b"lmcv:t1:big", [memoryview(arena)], 10) == len(big)
        assert arena == big
        assert t.stats["bulk_fallbacks"] == 1
    info = srv.info()
    assert info["evicted"] == 0 and admin.dbsize() == 4 and info["refused"] >= 1
