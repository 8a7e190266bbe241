"""An engine's synchronous lookup (LMCache's ``batched_contains``, SGLang's ``batch_exists``)
runs on the engine's own waiting thread, without a hop to the store's loop: it answers exactly
what the loop would, authenticates and selects like the pool, and a paused, lying or dead
server makes it a counted miss within its deadline, never a wrong hit."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
import time
from typing import Any

import pytest
from support.acl_lines import setuser
from support import sessions
from support.hostile import HostileServer

from lmcache_valkey import metrics
from lmcache_valkey.acl import worker_line
from lmcache_valkey.codec import ChunkMeta
from lmcache_valkey.config import Node, Settings, settings_from_mapping
from lmcache_valkey.errors import DeadlineExceeded
from lmcache_valkey.keys import make_namespace
from lmcache_valkey.session import StoreSession
from lmcache_valkey.transport.resp.blocking import BlockingLookups
from lmcache_valkey.transport.resp.connection import make_ssl_context

pytestmark = pytest.mark.timeout(120)

NS = make_namespace("lmcv", "team-a", {"model": "blocking-lookups"})
META = ChunkMeta(shapes=((64,),), dtypes=("uint8",), fmt=0)


def ids(prefix: str, n: int) -> list[str]:
    return [NS.chunk_id(f"{prefix}-{i}") for i in range(n)]


def opened(settings: Any):
    """A store session as an engine adapter holds one, closed after the test."""
    return sessions.opened(settings, NS)


def put(session: StoreSession, chunk_ids: list[str]) -> None:
    sessions.put_small(session, chunk_ids, META)


def lookup_errors(cause: str | None = None) -> float:
    """Failed lookups counted (``lmcache_valkey_errors_total{op="lookup"}``), of one cause or all."""
    causes = metrics.ERROR_CAUSES if cause is None else (cause,)
    return sum(metrics.ERRORS.labels("lookup", c)._value.get() for c in causes)


def test_a_lookup_is_answered_on_the_waiting_thread_even_while_the_store_loop_is_wedged(valkey_server) -> None:
    with opened(valkey_server.settings(transport="tcp")) as session:
        stored = ids("chunk", 8)
        put(session, stored[:3] + stored[4:])
        release = threading.Event()

        async def wedge() -> None:
            release.wait(30)  # blocks the store's loop thread itself

        wedged = session.io.submit(wedge())
        try:
            assert session.store.contains_prefix_blocking(stored) == 3
            assert session.store.contains_each_blocking(stored) == [True] * 3 + [False] + [True] * 4
            assert session.contains_prefix(stored, 5) == 3
            assert session.store.contains_prefix_blocking([]) == 0
        finally:
            release.set()
            wedged.result(10)
        # the loop's own path agrees
        assert session.run_sync(session.store.contains_each(stored), 5) == [True] * 3 + [False] + [True] * 4


def test_on_the_store_loop_itself_a_lookup_never_blocks_but_takes_the_loops_path(valkey_server) -> None:
    with opened(valkey_server.settings(transport="tcp")) as session:
        stored = ids("chunk", 2)
        put(session, stored)

        async def on_the_loop() -> tuple[int | None, int]:
            return session.store.contains_prefix_blocking(stored), await session.store.contains_prefix(stored)

        assert session.run_sync(on_the_loop(), 10) == (None, 2)


def test_an_acl_worker_over_tls_in_another_database_finds_its_chunks(valkey_tls_server) -> None:
    setuser(valkey_tls_server, worker_line("worker-a", "team-a", db=1), "s3cret")
    settings = valkey_tls_server.settings(url=valkey_tls_server.url + "/1", transport="tcp",
                                          username="worker-a", password="s3cret")
    with opened(settings) as session:
        stored = ids("tls", 4)
        put(session, stored[:2])
        assert session.store.contains_prefix_blocking(stored) == 2
        # db 0 holds nothing of it: the lane's connections did select database 1
        assert valkey_tls_server.cmd("DBSIZE") == 0


def test_a_paused_server_costs_one_deadline_and_its_late_replies_never_answer_a_later_lookup(valkey_server) -> None:
    with opened(valkey_server.settings(transport="tcp", lookup_timeout_s=1.0)) as session:
        present, absent = ids("here", 16), ids("gone", 16)
        put(session, present)
        assert session.store.contains_prefix_blocking(present) == 16  # the lane's connection is open
        before, errors = lookup_errors("deadline"), lookup_errors()
        os.kill(valkey_server.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            assert session.store.contains_prefix_blocking(present) == 0  # a miss, not a hang
            assert time.monotonic() - started < 10
        finally:
            os.kill(valkey_server.pid, signal.SIGCONT)
        assert lookup_errors("deadline") == before + 1
        # "all 16 present" is on its way on the timed-out connection: it must not answer these
        mixed = present[:5] + absent[5:]
        assert session.store.contains_prefix_blocking(mixed) == 5
        assert session.store.contains_prefix_blocking(absent) == 0
        assert session.store.contains_prefix_blocking(present) == 16
        assert lookup_errors() == errors + 1


@pytest.mark.parametrize("reply", [b":7\r\n", b"!garbage\r\n", b"$999999999\r\n", b"-NOPERM no\r\n"],
                         ids=["not-a-flag", "garbage", "huge-bulk", "error-reply"])
def test_a_lying_server_makes_a_lookup_a_counted_miss_never_a_hit(reply: bytes) -> None:
    def lie(name: bytes, args: list[bytes]) -> bytes | None:
        return reply if name == b"EXISTS" else None

    with HostileServer(lie) as srv:
        with opened(srv_settings(srv)) as session:
            stored = ids("lie", 4)
            put(session, stored)
            errors = lookup_errors()
            assert session.contains_prefix(stored, 5) == 0
            assert session.store.contains_each_blocking(stored) in (None, [False] * 4)
            assert lookup_errors() > errors


def srv_settings(srv: HostileServer) -> Settings:
    return settings_from_mapping({"url": srv.url, "transport": "tcp", "lookup_timeout_s": 0.5,
                                  "cluster": "no"}, env={})


def test_a_dead_server_is_a_counted_miss(valkey_server) -> None:
    with opened(valkey_server.settings(transport="tcp", lookup_timeout_s=0.3, connect_timeout_s=0.3)) as session:
        stored = ids("dead", 3)
        put(session, stored)
        valkey_server.kill9()
        before = lookup_errors()
        assert session.contains_prefix(stored, 5) == 0
        assert lookup_errors() == before + 1


def test_many_threads_looking_up_at_once_each_get_their_own_answer(valkey_server) -> None:
    with opened(valkey_server.settings(transport="tcp")) as session:
        sets = [ids(f"t{t}", 32) for t in range(8)]
        for t, s in enumerate(sets):
            put(session, s[:t * 4])  # thread t's prefix is 4 * t long
        wrong: list[tuple[int, int]] = []

        def worker(t: int) -> None:
            for _ in range(50):
                got = session.contains_prefix(sets[t], 10)  # more threads than lane connections
                if got != t * 4:
                    wrong.append((t, got))

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        assert not any(th.is_alive() for th in threads)
        assert not wrong


def test_after_close_a_lookup_takes_no_connection(valkey_server) -> None:
    session = StoreSession(valkey_server.settings(transport="tcp"), NS)
    stored = ids("closed", 2)
    put(session, stored)
    assert session.store.contains_prefix_blocking(stored) == 2
    store = session.store
    session.close()
    assert store.contains_prefix_blocking(stored) is None


def test_on_a_cluster_keys_spread_over_shards_and_a_moved_slot_still_answer_right(valkey_cluster) -> None:
    with opened(valkey_cluster.settings(transport="tcp")) as session:
        stored = ids("cluster", 60)
        put(session, stored[:40])
        assert session.store.contains_prefix_blocking(stored) == 40
        # move the first chunk's slot to another primary: the client's map is stale now
        from lmcache_valkey.transport.resp.cluster import key_slot

        slot = key_slot(NS.data_key(stored[0]))
        owner = valkey_cluster.owner_of(slot)
        valkey_cluster.migrate_slot(slot, next(s for s in valkey_cluster.servers if s is not owner))
        assert session.contains_prefix(stored, 5) == 40  # (MOVED: answered on the loop's path)
        assert session.store.contains_prefix_blocking(stored) == 40  # the map is right again


# --- awaited on the engine's own loop (LMCache's batched_async_contains) -----------------------

def wedge_store_loop(session: StoreSession) -> tuple[threading.Event, object]:
    release = threading.Event()

    async def wedge() -> None:
        release.wait(30)

    return release, session.io.submit(wedge())


async def test_a_lookup_awaited_on_the_engines_loop_needs_neither_the_store_loop_nor_a_thread(valkey_server) -> None:
    with opened(valkey_server.settings(transport="tcp")) as session:
        stored = ids("async", 10)
        put(session, stored[:6])
        release, wedged = wedge_store_loop(session)
        try:
            # the first one opens the lane's connection on a lookup thread; later ones run here
            assert await session.contains_prefix_async(stored, 5) == 6
            assert await session.store.contains_prefix_on_caller_loop(stored) == 6
            assert await session.store.contains_prefix_on_caller_loop(stored[6:]) == 0
            assert await session.contains_prefix_async([], 5) == 0
        finally:
            release.set()
            wedged.result(10)


async def test_on_the_engines_loop_a_paused_server_or_a_cancelled_lookup_leaves_no_late_reply_behind(valkey_server) -> None:
    import asyncio

    with opened(valkey_server.settings(transport="tcp", lookup_timeout_s=1.0)) as session:
        present, absent = ids("here", 16), ids("gone", 16)
        put(session, present)
        assert session.store.contains_prefix_blocking(present) == 16  # the lane's connection is open
        os.kill(valkey_server.pid, signal.SIGSTOP)
        try:
            task = asyncio.ensure_future(session.store.contains_prefix_on_caller_loop(present))
            await asyncio.sleep(0.05)  # (its EXISTS sent on the lane's idle connection)
            task.cancel()  # the engine gives up
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await session.contains_prefix_async(present, 5) == 0  # on a thread, past its deadline
        finally:
            os.kill(valkey_server.pid, signal.SIGCONT)
        mixed = present[:5] + absent[5:]
        assert await session.contains_prefix_async(mixed, 5) == 5
        assert await session.store.contains_prefix_on_caller_loop(mixed) == 5
        assert session.store.contains_prefix_blocking(absent) == 0


async def test_over_tls_a_lookup_awaited_on_the_engines_loop_is_answered_by_a_lookup_thread(valkey_tls_server) -> None:
    with opened(valkey_tls_server.settings(transport="tcp")) as session:
        stored = ids("tls-async", 3)
        put(session, stored[:2])
        assert await session.store.contains_prefix_on_caller_loop(stored) is None  # (no loop.sock_* on TLS)
        assert await session.contains_prefix_async(stored, 5) == 2


def test_an_idle_lookup_connection_the_server_closed_is_not_a_miss(valkey_server) -> None:
    with opened(valkey_server.settings(transport="tcp")) as session:
        stored = ids("killed", 6)
        put(session, stored)
        assert session.store.contains_prefix_blocking(stored) == 6  # the lane's connection is idle now
        errors = lookup_errors()
        valkey_server.cmd("CLIENT", "KILL", "TYPE", "normal")  # (a restart, `timeout`, a failover)
        time.sleep(0.5)  # "meanwhile": the pool's connections have seen the close by now
        assert session.contains_prefix(stored, 5) == 6
        assert session.store.contains_prefix_blocking(stored) == 6  # on a fresh connection
        assert lookup_errors() == errors


def test_a_cluster_lookup_that_finds_one_node_busy_keeps_no_other_nodes_connection(valkey_cluster) -> None:
    with opened(valkey_cluster.settings(transport="tcp")) as session:
        stored = ids("busy", 60)
        put(session, stored)
        assert session.store.contains_prefix_blocking(stored) == 60
        lane = session.store.transport._blocking
        busy_node = valkey_cluster.servers[1].node
        held = [lane._take(busy_node) for _ in range(4)]
        held = [c for c in held if c is not None]  # every lane connection to that node, in use
        for _ in range(5):
            assert session.store.contains_prefix_blocking(stored) is None  # the loop's path instead
            assert session.contains_prefix(stored, 5) == 60
        for c in held:
            lane._give_back(c) if c.sock is not None else lane._drop(c)
        assert session.store.contains_prefix_blocking(stored) == 60  # the other nodes' are still free


def test_a_server_named_by_host_name_is_reached_where_the_pool_resolved_it(valkey_server, monkeypatch) -> None:
    """The lane never resolves a name itself (``getaddrinfo`` keeps no deadline): it connects
    where the loop's pool reached the server."""
    url = f"valkey://localhost:{valkey_server.port}"
    with opened(valkey_server.settings(url=url, transport="tcp")) as session:
        stored = ids("named", 4)
        put(session, stored[:3])

        def no_resolving(*args: Any, **kw: Any) -> Any:
            raise AssertionError(f"getaddrinfo{args} on a lookup")

        monkeypatch.setattr("socket.getaddrinfo", no_resolving)
        release = threading.Event()

        async def wedge() -> None:
            release.wait(30)

        wedged = session.io.submit(wedge())  # only the lane can answer now
        try:
            assert session.store.contains_prefix_blocking(stored) == 3
        finally:
            release.set()
            wedged.result(10)


def test_a_host_name_the_pool_has_not_resolved_yet_takes_the_loops_path() -> None:

    lane = BlockingLookups(settings_from_mapping({"url": "valkey://valkey.invalid:6379", "cluster": "no"}, env={}), None)
    node = Node("valkey.invalid", 6379)
    assert lane.exists([(node, b"*2\r\n$6\r\nEXISTS\r\n$1\r\nk\r\n", 1)], 5.0) is None
    assert lane._open.get(node, 0) == 0  # its place is free again


class DribblingProxy:
    """Forwards to ``port``, the server's bytes a few at a time: a TLS handshake through it
    takes many seconds although no single read waits long."""

    def __init__(self, port: int, piece: int = 64, pause_s: float = 0.2) -> None:
        self.target, self.piece, self.pause_s = port, piece, pause_s
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.socks: list[Any] = [self.listener]
        self.stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            self.socks += [client, server]
            threading.Thread(target=self._pump, args=(client, server, 1 << 16, 0.0), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, self.piece, self.pause_s), daemon=True).start()

    def _pump(self, src: Any, dst: Any, piece: int, pause_s: float) -> None:
        try:
            while not self.stop.is_set():
                data = src.recv(piece)
                if not data:
                    return
                dst.sendall(data)
                time.sleep(pause_s)
        except OSError:
            return

    def close(self) -> None:
        self.stop.set()
        for s in self.socks:
            s.close()


def test_a_tls_handshake_that_dribbles_costs_one_deadline(valkey_tls_server) -> None:

    proxy = DribblingProxy(valkey_tls_server.port)
    try:
        settings = valkey_tls_server.settings(url=f"valkeys://127.0.0.1:{proxy.port}", tls_server_name="localhost")
        lane = BlockingLookups(settings, make_ssl_context(settings.tls))
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            lane.exists([(Node("127.0.0.1", proxy.port), b"*2\r\n$6\r\nEXISTS\r\n$1\r\nk\r\n", 1)], 0.5)
        # (no single read waits long, but the handshake takes seconds through the proxy)
        assert time.monotonic() - started < 5
    finally:
        proxy.close()


async def test_over_tls_lookups_queued_behind_a_paused_server_each_cost_one_deadline(valkey_tls_server) -> None:
    """With no lane on the engine's loop (TLS), lookups wait for a lookup thread; sixteen at
    once against a paused server must not wait for each other's deadlines (eight rounds of
    two threads), and each is counted as one failed lookup, once."""
    with opened(valkey_tls_server.settings(transport="tcp", lookup_timeout_s=0.5)) as session:
        stored = ids("queued", 2)
        put(session, stored)
        before = lookup_errors("deadline")
        os.kill(valkey_tls_server.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            found = await asyncio.gather(*(session.contains_prefix_async(stored, 0.6) for _ in range(16)))
            took = time.monotonic() - started
            # lookups already on a thread count their own deadline, a moment later
            while lookup_errors("deadline") < before + 16 and time.monotonic() - started < 10:
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)  # past every lookup deadline: nothing more to count
            counted = lookup_errors("deadline") - before
        finally:
            os.kill(valkey_tls_server.pid, signal.SIGCONT)
        assert found == [0] * 16
        assert took < 2.5, f"{took:.1f}s: queued lookups waited for the ones before them"
        assert counted == 16
        assert await session.contains_prefix_async(stored, 5) == 2  # and afterwards, answers again
