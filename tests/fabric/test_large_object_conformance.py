"""Conformance of a large-object server to the command reference published on valkey.io
(BLOB.RDMA_HELLO, BLOB.RDMA_SET, BLOB.RDMA_GET, BLOB.TCP_SET, BLOB.TCP_GET, BLOB.INFO).

Written from that public reference alone: every assertion is a sentence of it (quoted in
the test's docstring where it helps), nothing here knows our module's internals or
extensions. It runs against our module in Valkey 9.1 standalone, a 3-node Valkey 9.1
Cluster, Valkey 8.0 over TLS and a 3-node Valkey 8.0 Cluster with TLS required (client
connections and cluster bus, as managed services run it); pointed at another server with
``LARGE_OBJECT_SERVER=host:port`` (plus ``LARGE_OBJECT_TLS_CA=<ca file>`` for TLS) it runs
unchanged against it, e.g. the upstream module (then the RDMA tests need that server to
serve the libfabric ``tcp`` provider on an address this host can reach).

The client side of RDMA is a bare libfabric endpoint (registration and addresses only); the
control connection is plain RESP, one connection per session, as the reference requires.
"""

from __future__ import annotations

import os
import shutil
import ssl
from dataclasses import dataclass
from typing import Iterator

import pytest
import google_crc32c

from lmcache_valkey.transport.fabric import FabricEndpoint
from lmcache_valkey.transport.resp.cluster import key_slot
from support.rawresp import Conn, is_error
from support.servers import DEBIAN_VALKEY, ValkeyCluster, ValkeyServer, make_tls_files

PROVIDER = "tcp;ofi_rxm"  # valkey-large-object's "Emulated" provider is libfabric over TCP
KiB = 1 << 10


@dataclass
class Deployment:
    name: str
    nodes: list[tuple[str, int]]
    tls: ssl.SSLContext | None
    cluster: bool

    def conn_for(self, key: bytes) -> Conn:
        """A connection to the node serving ``key`` (cluster: by its hash slot)."""
        if not self.cluster:
            return Conn(*self.nodes[0], self.tls)
        probe = Conn(*self.nodes[0], self.tls)
        try:
            slots = probe.ok("CLUSTER", "SLOTS")
        finally:
            probe.close()
        slot = key_slot(key)
        for lo, hi, primary, *_ in slots:
            if lo <= slot <= hi:
                host = primary[0].decode() if isinstance(primary[0], bytes) else primary[0]
                return Conn(host or self.nodes[0][0], int(primary[1]), self.tls)
        raise LookupError(slot)


# -- deployments ----------------------------------------------------------------------------

def _module_args(module_so) -> list[str]:
    # require_proof no: a client of the documented dialect cannot prove its fabric address
    # (the weak mode our module keeps for such clients; its default refuses them).
    return ["--loadmodule", str(module_so), "provider", PROVIDER, "bind", "127.0.0.1", "arena_mb", "64",
            "require_proof", "no"]


@pytest.fixture(scope="module", params=["standalone-9.1", "standalone-9.1-no-extensions", "cluster-9.1", "tls-8.0",
                                        "cluster-tls-8.0"])
def deployment(request, module_so, tmp_path_factory) -> Iterator[Deployment]:
    external = os.environ.get("LARGE_OBJECT_SERVER")
    if external:
        if request.param != "standalone-9.1":
            pytest.skip("an external server is one deployment")
        host, port = external.rsplit(":", 1)
        ca = os.environ.get("LARGE_OBJECT_TLS_CA")
        tls = ssl.create_default_context(cafile=ca) if ca else None
        probe = Conn(host, int(port), tls)
        info = probe("CLUSTER", "INFO")
        probe.close()
        clustered = not is_error(info) and b"cluster_enabled:1" in info or (
            isinstance(info, bytes) and b"cluster_state" in info)
        yield Deployment("external", [(host, int(port))], tls, clustered)
        return
    args = _module_args(module_so)
    if request.param.startswith("standalone-9.1"):
        if request.param.endswith("no-extensions"):
            args += ["extensions", "no"]  # our module speaking exactly the documented dialect
        with ValkeyServer(args=args) as s:
            yield Deployment(request.param, [(s.host, s.port)], None, False)
    elif request.param == "cluster-9.1":
        c = ValkeyCluster(3, args=args).start()
        try:
            yield Deployment(request.param, [(s.host, s.port) for s in c.servers], None, True)
        finally:
            c.cleanup()
    else:
        if not shutil.which(DEBIAN_VALKEY):
            pytest.skip(f"{DEBIAN_VALKEY} (TLS build) not installed")
        files = make_tls_files(tmp_path_factory.mktemp("tls"))
        if request.param == "tls-8.0":
            with ValkeyServer(binary=DEBIAN_VALKEY, tls=files, args=args) as s:
                yield Deployment(request.param, [(s.host, s.port)], files.client_context(), False)
        else:  # cluster mode with TLS required, the way a managed large-object service runs
            c = ValkeyCluster(3, binary=DEBIAN_VALKEY, tls=files, args=args).start()
            try:
                yield Deployment(request.param, [(s.host, s.port) for s in c.servers], files.client_context(), True)
            finally:
                c.cleanup()


@pytest.fixture
def rdma(deployment):
    """A libfabric endpoint and buffer registered with it, plus a way to open sessions."""
    ep = FabricEndpoint(PROVIDER, "127.0.0.1")
    buf = bytearray(1 << 20)
    region = ep.register_buffer(buf)
    conns: list[Conn] = []

    class R:
        endpoint, memory, mr = ep, memoryview(buf), region

        @staticmethod
        def base() -> int:
            return region.remote_addr(region.addr)

        @staticmethod
        def session(key: bytes) -> Conn:
            c = deployment.conn_for(key)
            conns.append(c)
            reply = c.ok("BLOB.RDMA_HELLO", ep.name.hex())
            for addr in reply:  # "The client must add all the returned addresses to its own address vector"
                ep.add_peer(bytes.fromhex(addr.decode()))
            return c

    yield R
    for c in conns:
        c.close()
    ep.close()


def _key(name: str, deployment: Deployment) -> bytes:
    # A hash tag: the test's other keys (key + suffix) live on the same cluster node.
    return f"conformance:{{{deployment.name}:{name}}}".encode()


# -- BLOB.RDMA_HELLO ------------------------------------------------------------------------

def test_rdma_hello_takes_one_address_and_answers_the_server_addresses(deployment, rdma):
    c = deployment.conn_for(b"hello")
    try:
        assert is_error(c("BLOB.RDMA_HELLO")), "with no argument it returns an error"
        assert is_error(c("BLOB.RDMA_HELLO", "zz")), "the address is hexadecimal text"
        reply = c.ok("BLOB.RDMA_HELLO", rdma.endpoint.name.hex())
        assert isinstance(reply, list) and reply, "an array with one hexadecimal address per fabric service"
        for addr in reply:
            bytes.fromhex(addr.decode())
        assert is_error(c("BLOB.RDMA_HELLO", rdma.endpoint.name.hex())), "a connection can have only one session"
    finally:
        c.close()
    # "The server removes the session when the connection closes": a new connection starts anew.
    c2 = deployment.conn_for(b"hello")
    try:
        assert not is_error(c2("BLOB.RDMA_HELLO", rdma.endpoint.name.hex()))
    finally:
        c2.close()


def test_rdma_commands_need_a_session(deployment, rdma):
    key = _key("nosession", deployment)
    c = deployment.conn_for(key)
    try:
        c.ok("BLOB.TCP_SET", key, b"x" * 100)
        assert is_error(c("BLOB.RDMA_GET", key, rdma.mr.key, rdma.base(), 4096))
        assert is_error(c("BLOB.RDMA_SET", key, 100, rdma.mr.key, rdma.base(), 4096))
    finally:
        c.close()


# -- BLOB.RDMA_SET / BLOB.RDMA_GET ----------------------------------------------------------

def test_rdma_set_then_get_moves_the_bytes_through_client_memory(deployment, rdma):
    key = _key("roundtrip", deployment)
    c = rdma.session(key)
    value = os.urandom(100 * KiB + 7)
    mv = rdma.memory
    mv[: len(value)] = value
    crc = google_crc32c.value(value)
    # Two regions: "a value may be spread over the regions in the order given".
    half = 40 * KiB
    assert c.ok("BLOB.RDMA_SET", key, len(value), rdma.mr.key, rdma.base(), half,
                rdma.mr.key, rdma.base() + half, len(value) - half) in (b"OK", "OK")
    assert c.ok("BLOB.TCP_GET", key) == value
    # GET into regions larger than the object; the first is filled before the second.
    out = 512 * KiB
    mv[out:] = bytes(len(mv) - out)
    reply = c.ok("BLOB.RDMA_GET", key, rdma.mr.key, rdma.base() + out, 1000,
                 rdma.mr.key, rdma.base() + out + 1000, 256 * KiB)
    assert reply == [len(value), crc], "the reply gives the object length and its CRC32C"
    assert mv[out : out + len(value)] == value
    assert mv[out + len(value) : out + len(value) + 4096] == bytes(4096), "nothing past the object"


def test_rdma_set_with_crc_stores_only_a_matching_payload(deployment, rdma):
    key = _key("crc", deployment)
    c = rdma.session(key)
    value = os.urandom(8 * KiB)
    rdma.memory[: len(value)] = value
    crc = google_crc32c.value(value)
    triple = (rdma.mr.key, rdma.base(), len(value))
    assert is_error(c("BLOB.RDMA_SET", key, len(value), "CRC", (crc + 1) % (1 << 32), *triple))
    assert c("BLOB.TCP_GET", key) is None, "a mismatch does not store the object"
    assert c.ok("BLOB.RDMA_SET", key, len(value), "CRC", crc, *triple) in (b"OK", "OK")
    assert c.ok("BLOB.INFO", key, "CRC") == crc


def test_rdma_arguments_are_checked(deployment, rdma):
    key = _key("args", deployment)
    c = rdma.session(key)
    k, a = rdma.mr.key, rdma.base()
    c.ok("BLOB.TCP_SET", key, b"y" * (8 * KiB))
    refused = [
        ("BLOB.RDMA_SET", key, 0, k, a, 4096),  # "The object must contain at least 1 byte"
        ("BLOB.RDMA_SET", key, 8192, k, a, 4096),  # regions smaller than the object
        ("BLOB.RDMA_SET", key, "x", k, a, 4096),
        ("BLOB.RDMA_SET", key, 4096, k, a, 0),  # "len ... must be more than 0"
        ("BLOB.RDMA_SET", key, 4096, k, a),  # not a triple
        ("BLOB.RDMA_SET", key, 4096, "key", a, 4096),
        ("BLOB.RDMA_SET", key, 4096, k, "addr", 4096),
        ("BLOB.RDMA_GET", key, k, a, 4096),  # smaller than the 8 KiB object
        ("BLOB.RDMA_GET", key, k, a, 0),
        ("BLOB.RDMA_GET", key, k, a),
        ("BLOB.RDMA_GET", key, *([k, a, 16] * 257)),  # "up to 256 regions"
    ]
    for args in refused:
        assert is_error(c(*args)), args
    assert c.ok("BLOB.TCP_GET", key) == b"y" * (8 * KiB), "a refused SET leaves the object"
    assert c.ok("BLOB.RDMA_GET", key, *([k, a, 32] * 256)) == [8 * KiB, google_crc32c.value(b"y" * (8 * KiB))]


def test_rdma_get_of_a_missing_key_is_nil(deployment, rdma):
    key = _key("missing", deployment)
    c = rdma.session(key)
    assert c("BLOB.RDMA_GET", key, rdma.mr.key, rdma.base(), 4096) is None


# -- BLOB.TCP_SET / BLOB.TCP_GET --------------------------------------------------------------

def test_tcp_set_and_get(deployment):
    key = _key("tcp", deployment)
    c = deployment.conn_for(key)
    try:
        assert c("BLOB.TCP_GET", key) is None, "If key does not exist, the command returns nil"
        assert is_error(c("BLOB.TCP_SET", key, b"")), "The object must contain at least 1 byte"
        assert c.ok("BLOB.TCP_SET", key, b"first") in (b"OK", "OK")
        assert c.ok("BLOB.TCP_SET", key, b"second value") in (b"OK", "OK"), "it replaces a large object"
        assert c.ok("BLOB.TCP_GET", key) == b"second value"
        assert is_error(c("BLOB.TCP_GET")) and is_error(c("BLOB.TCP_SET", key))
    finally:
        c.close()


def test_other_types_are_wrongtype_and_left_alone(deployment, rdma):
    key = _key("string", deployment)
    c = rdma.session(key)
    c.ok("SET", key, b"a plain string")
    assert is_error(c("BLOB.TCP_SET", key, b"v"), "WRONGTYPE")
    assert is_error(c("BLOB.TCP_GET", key), "WRONGTYPE")
    assert is_error(c("BLOB.INFO", key), "WRONGTYPE")
    assert is_error(c("BLOB.RDMA_GET", key, rdma.mr.key, rdma.base(), 4096), "WRONGTYPE")
    assert c.ok("GET", key) == b"a plain string"


# -- BLOB.INFO ------------------------------------------------------------------------------------

def test_info_fields(deployment):
    key = _key("info", deployment)
    c = deployment.conn_for(key)
    try:
        value = os.urandom(3000)
        c.ok("BLOB.TCP_SET", key, value)
        flat = c.ok("BLOB.INFO", key)
        fields = {(f.decode() if isinstance(f, bytes) else f).upper(): v for f, v in zip(flat[0::2], flat[1::2])}
        assert fields["LEN"] == len(value) and fields["CRC"] == google_crc32c.value(value)
        assert fields["TIER"] in (b"dram", b"disk")
        assert c.ok("BLOB.INFO", key, "len") == len(value), "The field name is not case-sensitive"
        assert c.ok("BLOB.INFO", key, "Crc") == google_crc32c.value(value)
        assert is_error(c("BLOB.INFO", key, "SIZE"))
        assert c("BLOB.INFO", key + b":absent") is None
    finally:
        c.close()


# -- core commands and cluster routing ---------------------------------------------------------

def test_core_key_commands_work_on_large_object_keys(deployment):
    key = _key("core", deployment)
    c = deployment.conn_for(key)
    try:
        c.ok("BLOB.TCP_SET", key, b"v" * 100)
        assert c.ok("EXISTS", key) == 1
        assert c.ok("PEXPIRE", key, 60000) == 1 and 0 < c.ok("PTTL", key) <= 60000
        assert c.ok("UNLINK", key) == 1 and c.ok("EXISTS", key) == 0
        c.ok("BLOB.TCP_SET", key, b"v")
        assert c.ok("DEL", key) == 1
    finally:
        c.close()


def test_a_cluster_node_redirects_a_key_it_does_not_serve(deployment):
    if not deployment.cluster:
        pytest.skip("standalone")
    key = _key("routed", deployment)
    owner = deployment.conn_for(key)
    owner_port = owner.sock.getpeername()[1]
    owner.close()
    other = next(n for n in deployment.nodes if n[1] != owner_port)
    c = Conn(*other, deployment.tls)
    try:
        for args in (("BLOB.TCP_SET", key, b"v"), ("BLOB.TCP_GET", key), ("BLOB.INFO", key)):
            assert is_error(c(*args), "MOVED"), args
    finally:
        c.close()


# "ACL Categories" of each command page, 0.1.0.
PAGE_CATEGORIES = {
    "BLOB.RDMA_HELLO": {"@connection", "@fast", "@largeobj"},
    "BLOB.RDMA_SET": {"@write", "@fast", "@largeobj"},
    "BLOB.RDMA_GET": {"@read", "@fast", "@largeobj"},
    "BLOB.TCP_SET": {"@write", "@fast", "@largeobj"},
    "BLOB.TCP_GET": {"@read", "@fast", "@largeobj"},
    "BLOB.INFO": {"@read", "@fast", "@largeobj"},
}


def test_commands_are_in_the_largeobj_acl_category(deployment):
    c = Conn(*deployment.nodes[0], deployment.tls)
    try:
        listed = c("ACL", "CAT", "largeobj")
        if is_error(listed) or not listed:
            pytest.skip("this server does not apply module ACL categories")
        names = {n.decode().upper() for n in listed}
        assert set(PAGE_CATEGORIES) <= names
    finally:
        c.close()


def test_each_command_has_the_acl_categories_its_page_gives(deployment):
    """So that one ACL rule written by category (``+@read``, ``-@write``, ``+@fast``) grants
    or denies the same commands of either module."""
    c = Conn(*deployment.nodes[0], deployment.tls)
    try:
        if is_error(c("ACL", "CAT", "largeobj")):
            pytest.skip("this server does not apply module ACL categories")
        for name, categories in PAGE_CATEGORIES.items():
            (info,) = c("COMMAND", "INFO", name)
            assert {x.decode() for x in info[6]} == categories, name
    finally:
        c.close()
    # And the server applies them: a user granted by category gets exactly those commands.
    key = _key("by-category", deployment)
    admin = deployment.conn_for(key)
    node = admin.sock.getpeername()[:2]
    reader = None
    try:
        admin.ok("BLOB.TCP_SET", key, b"v" * 10)
        admin.ok("ACL", "SETUSER", "lo-reader", "reset", "on", ">lo-reader-pw", "~*", "+@all", "-@write")
        reader = Conn(*node, deployment.tls)
        reader.ok("AUTH", "lo-reader", "lo-reader-pw")
        assert reader.ok("BLOB.TCP_GET", key) == b"v" * 10
        assert reader.ok("BLOB.INFO", key, "LEN") == 10
        assert is_error(reader("BLOB.TCP_SET", key, b"w"), "NOPERM")
        assert is_error(reader("BLOB.RDMA_SET", key, 1, 0, 0, 1), "NOPERM")
        assert admin.ok("BLOB.TCP_GET", key) == b"v" * 10
    finally:
        if reader is not None:
            reader.close()
        admin("ACL", "DELUSER", "lo-reader")
        admin.close()
