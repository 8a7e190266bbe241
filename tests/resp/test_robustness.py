"""Deadlines, cancellation, server death and restart, close() with ops in flight, ACL, TLS, Redis 7.

No wall-clock thresholds: "never hangs" is checked by the operation returning
(each test has a pytest timeout far above its deadlines).
"""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from lmcache_valkey.config import replace
from lmcache_valkey.errors import AuthError, ConnectionLost, DeadlineExceeded, TransportError
from lmcache_valkey.transport.resp import RespClient

pytestmark = pytest.mark.timeout(90)

MiB = 1 << 20


def _conns(c: RespClient):
    return [conn for p in c._pools.values() for conn in p._all]


async def _wait_until_filling(c: RespClient) -> None:
    """Until some connection is receiving a payload straight into a caller's buffer."""
    for _ in range(200_000):
        if any(conn.parser.filling for conn in _conns(c)):
            return
        await asyncio.sleep(0)
    raise AssertionError("transfer never started")


class Stopped:
    """SIGSTOP the server by PID (it keeps its sockets but answers nothing), SIGCONT on exit."""

    def __init__(self, server) -> None:
        self.pid = server.pid

    def __enter__(self) -> "Stopped":
        os.kill(self.pid, signal.SIGSTOP)
        return self

    def __exit__(self, *exc) -> None:
        os.kill(self.pid, signal.SIGCONT)


@pytest.mark.parametrize("how", ["cancel", "deadline"])
async def test_interrupted_get_never_writes_into_the_buffer_afterwards(valkey_server, how: str, monkeypatch) -> None:
    from lmcache_valkey.transport.resp import connection

    # Small kernel buffers and short read bursts, so the transfer is surely
    # half-way when we look, and the frozen server cannot have sent it all.
    monkeypatch.setattr(connection, "SOCK_BUF", 64 * 1024)
    monkeypatch.setattr(connection, "GREEDY_MAX", 256 * 1024)

    c = RespClient(valkey_server.settings(connections_per_node=1))
    await c.start()
    try:
        value = os.urandom(32 * MiB)
        await c.set(b"big", [value], ttl_s=None, timeout=30)
        buf = bytearray(32 * MiB)
        task = asyncio.ensure_future(c.get_into(b"big", [memoryview(buf)], timeout=30 if how == "cancel" else 2))
        await _wait_until_filling(c)
        (conn,) = _conns(c)
        with Stopped(valkey_server):  # freeze the transfer half-way
            if how == "cancel":
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            else:
                with pytest.raises(DeadlineExceeded):
                    await task
            # the connection was aborted before the exception reached us
            assert conn.broken and conn.transport.is_closing() and not conn.busy
            assert conn not in _conns(c)
            buf[:] = bytes(len(buf))
        # the server resumes writing; none of it may land in buf any more
        for _ in range(50):
            await asyncio.sleep(0.01)
        assert not any(buf)
        # a later get into the same buffer is byte-exact
        assert await c.get_into(b"big", [memoryview(buf)], timeout=30) == len(value)
        assert buf == value
    finally:
        await c.close()



async def test_deadline_on_a_frozen_server_and_pool_waiters(valkey_server) -> None:
    c = RespClient(valkey_server.settings(connections_per_node=1))
    await c.start()
    try:
        await c.set(b"k", [b"v" * 100], ttl_s=None, timeout=5)
        with Stopped(valkey_server):
            # one get holds the only connection; the others wait for it; all hit the deadline
            outs = await asyncio.gather(
                *(c.get_into(b"k", [memoryview(bytearray(100))], timeout=0.3) for _ in range(5)),
                return_exceptions=True,
            )
            assert all(isinstance(o, DeadlineExceeded) for o in outs), outs
            res = await c.get_many_into([(b"k", [memoryview(bytearray(100))])] * 3, timeout=0.3)
            assert all(isinstance(r, DeadlineExceeded) for r in res), res
            with pytest.raises(DeadlineExceeded):
                await c.exists_many([b"k"] * 10, timeout=0.3)
            errs = await c.set_many([(b"s%d" % i, [os.urandom(MiB)]) for i in range(4)], ttl_s=None, timeout=0.3)
            assert all(isinstance(e, DeadlineExceeded) for e in errs)
        assert await c.get_into(b"k", [memoryview(bytearray(100))], timeout=5) == 100
    finally:
        await c.close()



async def test_server_killed_mid_batch_then_recovers(valkey_server) -> None:
    c = RespClient(valkey_server.settings(connections_per_node=4))
    await c.start()
    try:
        values = {b"v%d" % i: os.urandom(4 * MiB) for i in range(32)}
        assert await c.set_many([(k, [v]) for k, v in values.items()], ttl_s=None, timeout=30) == [None] * 32
        bufs = {k: bytearray(4 * MiB) for k in values}
        batch = asyncio.ensure_future(
            c.get_many_into([(k, [memoryview(b)]) for k, b in bufs.items()], timeout=20)
        )
        await _wait_until_filling(c)
        valkey_server.kill9()
        res = await batch  # returns (errors as values), long before its deadline
        assert all(isinstance(r, (int, TransportError)) for r in res)
        assert any(isinstance(r, ConnectionLost) for r in res)
        for (k, v), r in zip(values.items(), res):
            if isinstance(r, int):
                assert bufs[k] == v
        # while down: fail fast, typed
        with pytest.raises(ConnectionLost):
            await c.exists_many([b"v1"], timeout=5)
        res = await c.get_many_into([(b"v1", [memoryview(bytearray(8))])], timeout=5)
        assert isinstance(res[0], ConnectionLost)
        # restart on the same port (empty: no persistence); the client reconnects with back-off
        valkey_server.restart()
        for _ in range(100):
            try:
                await c.set(b"again", [b"x" * 10], ttl_s=None, timeout=2)
                break
            except ConnectionLost:
                await asyncio.sleep(0.05)
        buf = bytearray(10)
        assert await c.get_into(b"again", [memoryview(buf)], timeout=5) == 10 and buf == b"x" * 10
        assert await c.exists_many([b"again", b"v1"], timeout=5) == [True, False]
    finally:
        await c.close()



async def test_close_never_hangs_with_ops_in_flight(valkey_server) -> None:
    c = RespClient(valkey_server.settings(connections_per_node=2))
    await c.start()
    await c.set(b"k", [os.urandom(MiB)], ttl_s=None, timeout=5)
    with Stopped(valkey_server):
        tasks = [asyncio.ensure_future(c.get_into(b"k", [memoryview(bytearray(MiB))], timeout=60))
                 for _ in range(5)]
        tasks.append(asyncio.ensure_future(c.exists_many([b"k"] * 100, timeout=60)))
        tasks.append(asyncio.ensure_future(c.set(b"s", [os.urandom(8 * MiB)], ttl_s=None, timeout=60)))
        for _ in range(20):
            await asyncio.sleep(0)
        await c.close()
        outs = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(o, ConnectionLost) for o in outs), outs
        await c.close()
    with pytest.raises(ConnectionLost):
        await c.get_into(b"k", [memoryview(bytearray(8))], timeout=1)



async def test_acl_user_limited_to_key_pattern(valkey_server) -> None:
    valkey_server.cmd("ACL", "SETUSER", "tenant_a", "on", ">pw-a", "~a:*", "+@all")
    c = RespClient(valkey_server.settings(username="tenant_a", password="pw-a"))
    await c.start()
    try:
        await c.set(b"a:1", [b"mine"], ttl_s=None, timeout=2)
        valkey_server.cmd("SET", "b:1", "theirs")
        with pytest.raises(AuthError):
            await c.set(b"b:2", [b"x"], ttl_s=None, timeout=2)
        with pytest.raises(AuthError):
            await c.get_into(b"b:1", [memoryview(bytearray(8))], timeout=2)
        res = await c.get_many_into(
            [(b"a:1", [memoryview(bytearray(8))]), (b"b:1", [memoryview(bytearray(8))])], timeout=2
        )
        assert res[0] == 4 and isinstance(res[1], AuthError) and res[1].prefix == "NOPERM"
        with pytest.raises(AuthError):
            await c.exists_many([b"a:1", b"b:1"], timeout=2)
        assert await c.exists_many([b"a:1", b"a:2"], timeout=2) == [True, False]
    finally:
        await c.close()
    with pytest.raises(AuthError):
        await RespClient(valkey_server.settings(username="tenant_a", password="nope")).start()



async def test_tls(valkey_tls_server) -> None:
    tls = valkey_tls_server.tls
    s = valkey_tls_server.settings(tls_ca_file=tls.ca_file)
    c = RespClient(s)
    await c.start()
    try:
        for size in (100, 4 * MiB):
            value = os.urandom(size)
            await c.set(b"t%d" % size, [value[:512], memoryview(value)[512:]], ttl_s=None, timeout=10)
            h, p = bytearray(512), bytearray(max(0, size - 512))
            assert await c.get_into(b"t%d" % size, [memoryview(h), memoryview(p)], timeout=10) == size
            assert bytes(h[:size]) + bytes(p) == value
        values = {b"m%d" % i: os.urandom(MiB) for i in range(8)}
        assert await c.set_many([(k, [v]) for k, v in values.items()], ttl_s=None, timeout=10) == [None] * 8
        bufs = {k: bytearray(MiB) for k in values}
        assert await c.get_many_into([(k, [memoryview(b)]) for k, b in bufs.items()], timeout=10) == [MiB] * 8
        assert all(bufs[k] == v for k, v in values.items())
        assert await c.exists_many([b"m1", b"zz"], timeout=2) == [True, False]
    finally:
        await c.close()
    # a client that does not trust the server's CA is refused, clearly
    other = RespClient(replace(s, tls=replace(s.tls, ca_file=None)))
    with pytest.raises(ConnectionLost) as ei:
        await other.start()
    assert "TLS" in str(ei.value)



def test_tls_client_certificate(tmp_path) -> None:
    from support.servers import DEBIAN_VALKEY, ValkeyServer, make_tls_files

    tls = make_tls_files(tmp_path)

    async def main(server) -> None:
        s = server.settings(tls_ca_file=tls.ca_file, tls_cert_file=tls.client_cert_file,
                            tls_key_file=tls.client_key_file)
        c = RespClient(s)
        await c.start()
        await c.ping(timeout=2)
        await c.close()
        with pytest.raises(TransportError):  # no client certificate: handshake refused
            await RespClient(server.settings(tls_ca_file=tls.ca_file)).start()

    with ValkeyServer(binary=DEBIAN_VALKEY, tls=tls, tls_auth_clients="yes") as server:
        asyncio.run(main(server))


def test_redis_7_compatibility() -> None:
    from support.servers import DEBIAN_REDIS, ValkeyServer

    if not os.path.exists(DEBIAN_REDIS):
        pytest.skip("redis-server not installed (compatibility check only)")

    async def main(server) -> None:
        c = RespClient(server.settings())
        await c.start()
        try:
            assert not c.is_cluster
            value = os.urandom(4 * MiB)
            await c.set(b"r", [value], ttl_s=10, timeout=10)
            buf = bytearray(4 * MiB)
            assert await c.get_into(b"r", [memoryview(buf)], timeout=10) == len(value) and buf == value
            assert await c.exists_many([b"r", b"x"], timeout=2) == [True, False]
        finally:
            await c.close()

    with ValkeyServer(binary=DEBIAN_REDIS) as server:
        asyncio.run(main(server))


def _received_connections(server) -> int:
    info = server.cmd("INFO", "stats").decode()
    return int(next(line.split(":")[1] for line in info.splitlines() if line.startswith("total_connections_received")))


def test_wrong_password_backs_off_instead_of_reconnecting_per_operation(valkey_server):
    valkey_server.cmd("ACL", "SETUSER", "worker", "on", ">right", "~*", "+@all")

    async def run() -> int:
        c = RespClient(valkey_server.settings(username="worker", password="right"))
        await c.start()
        try:
            valkey_server.cmd("ACL", "SETUSER", "worker", "resetpass", ">rotated")  # rotated under us
            valkey_server.cmd("CLIENT", "KILL", "USER", "worker")
            before = _received_connections(valkey_server)
            for _ in range(50):
                with pytest.raises(TransportError):
                    await c.get_into(b"k", [memoryview(bytearray(8))], timeout=0.5)
            return _received_connections(valkey_server) - before
        finally:
            await c.close()

    assert asyncio.run(run()) < 10  # not one AUTH attempt per operation


def test_callers_queued_behind_a_node_in_back_off_fail_fast():
    from support.servers import free_port

    from lmcache_valkey.config import settings_from_mapping

    async def run() -> list:
        s = settings_from_mapping({"url": f"valkey://127.0.0.1:{free_port()}", "connections_per_node": 1}, env={})
        c = RespClient(s)
        try:
            return await asyncio.gather(
                *(c.get_into(b"k", [memoryview(bytearray(8))], timeout=5.0) for _ in range(4)), return_exceptions=True
            )
        finally:
            await c.close()

    results = asyncio.run(run())
    assert all(isinstance(r, TransportError) for r in results), results
    # Refused at once, or by the back-off: none of them sat waiting for its deadline.
    assert not any(isinstance(r, DeadlineExceeded) for r in results), results


async def test_a_server_that_resets_every_connection_at_once_is_a_typed_error() -> None:
    """Accept, then reset (SO_LINGER 0): whatever moment the reset lands in connecting, the
    pool raises a TransportError (the store counts it), never a raw OSError."""
    import socket
    import struct

    from lmcache_valkey.config import Node, settings_from_mapping
    from lmcache_valkey.transport.resp.pool import NodePool

    async def reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    server = await asyncio.start_server(reset, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    settings = settings_from_mapping({"url": f"valkey://127.0.0.1:{port}", "cluster": "no",
                                      "connect_timeout_s": 2}, env={})
    seen: dict[str, int] = {}
    try:
        for _ in range(100):
            pool = NodePool(Node("127.0.0.1", port), settings, None)
            try:
                conn = await pool.acquire()
                pool.release(conn)
                seen["connected"] = seen.get("connected", 0) + 1
            except TransportError as e:
                seen[type(e).__name__] = seen.get(type(e).__name__, 0) + 1
            finally:
                await pool.close()
    finally:
        server.close()
        await server.wait_closed()
    assert set(seen) <= {"connected", "ConnectionLost", "DeadlineExceeded"}, seen


def _drop_our_connections(server) -> int:
    """CLIENT KILL every other client, as a server's ``timeout``, a proxy or a NAT dropping
    idle connections would; the client's loop has not run since, so its pool still holds
    them as idle. (The killing connection itself is skipped: SKIPME defaults to yes.)"""
    return server.cmd("CLIENT", "KILL", "TYPE", "normal")


async def test_data_ops_on_connections_dropped_while_idle_are_sent_again(valkey_server) -> None:
    """Each data op whose idle connection the server dropped before answering anything
    succeeds (sent once more on a new connection) instead of failing as a lost connection."""
    c = RespClient(valkey_server.settings(connections_per_node=2))
    await c.start()
    try:
        value = os.urandom(MiB)
        await c.set(b"k", [value], ttl_s=None, timeout=5)
        ops = {
            "get_into": lambda: c.get_into(b"k", [memoryview(bytearray(MiB))], timeout=5),
            "get_many_into": lambda: c.get_many_into([(b"k", [memoryview(bytearray(MiB))])] * 3, timeout=5),
            "set": lambda: c.set(b"k", [value], ttl_s=60, timeout=5),
            "set_many": lambda: c.set_many([(b"k", [value]), (b"j", [value])], ttl_s=None, timeout=5),
            "exists_many": lambda: c.exists_many([b"k", b"nope"] * 8, timeout=5),
        }
        for name, op in ops.items():
            for _ in range(5):
                await c.exists_many([b"k"], timeout=5)  # the pool holds a served, idle connection
                assert _drop_our_connections(valkey_server) >= 1
                try:
                    out = await op()
                except ConnectionLost as e:
                    pytest.fail(f"{name}: {e!r} (unanswered: {e.unanswered})")
                flat = out if isinstance(out, list) else [out]
                assert not any(isinstance(r, BaseException) for r in flat), (name, out)
        assert c.retried >= len(ops) * 5
        buf = bytearray(MiB)
        assert await c.get_into(b"k", [memoryview(buf)], timeout=5) == MiB and buf == value
    finally:
        await c.close()


async def test_a_control_command_is_not_sent_twice_after_a_dropped_connection(valkey_server) -> None:
    """INCR is not idempotent: its lost connection is the caller's error, never a second INCR."""
    c = RespClient(valkey_server.settings(connections_per_node=1))
    await c.start()
    try:
        assert await c.command("INCR", "counter", key=b"counter", timeout=5) == 1
        _drop_our_connections(valkey_server)
        with pytest.raises(ConnectionLost) as lost:
            await c.command("INCR", "counter", key=b"counter", timeout=5)
        assert lost.value.unanswered
        assert await c.command("GET", "counter", key=b"counter", timeout=5) == b"1"
        assert c.retried == 0
    finally:
        await c.close()


class _ReplyEater:
    """A TCP proxy in front of a real server that forwards the next request, lets the server
    run it, then drops the connection without forwarding the reply (as a path that fails at
    that instant would)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.armed = False

    async def __aenter__(self) -> int:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def __aexit__(self, *exc) -> None:
        self.server.close()

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        sr, sw = await asyncio.open_connection("127.0.0.1", self.port)
        eat = False

        async def replies() -> None:
            while (d := await sr.read(1 << 16)) and not eat:
                cw.write(d)
                await cw.drain()

        back = asyncio.ensure_future(replies())
        try:
            while d := await cr.read(1 << 16):
                eat = eat or self.armed
                sw.write(d)
                await sw.drain()
                if eat:
                    self.armed = False
                    await asyncio.sleep(0.05)  # the server runs it and answers; nobody forwards that
                    cw.transport.abort()
                    return
        finally:
            back.cancel()
            sw.close()


async def test_an_unlink_whose_reply_was_lost_is_an_error_never_a_count_of_zero(valkey_server) -> None:
    """UNLINK ran, its reply was lost: sent again it would answer 0 and the caller would
    believe the key never existed; so it is not sent again, and the caller sees the loss."""
    from lmcache_valkey.config import settings_from_mapping

    eater = _ReplyEater(valkey_server.port)
    async with eater as port:
        c = RespClient(settings_from_mapping({"url": f"valkey://127.0.0.1:{port}", "cluster": "no",
                                              "connections_per_node": 1}, env={}))
        await c.start()
        try:
            await c.set(b"k", [b"v"], ttl_s=None, timeout=5)
            eater.armed = True
            with pytest.raises(ConnectionLost):
                await c.delete([b"k"], timeout=5)
            assert c.retried == 0
            assert await c.exists_many([b"k"], timeout=5) == [False]  # it did run
        finally:
            await c.close()
