"""Per-node connection pool and the batch executor that stripes work over it.

A :class:`NodePool` owns up to ``connections_per_node`` connections to one
server. An operation checks out a connection exclusively (so aborting it on a
deadline hurts nobody else) and gives it back when its reply is complete; a
broken or aborted connection is dropped, never pooled. After a failed connect
the node is in back-off (exponential, capped): operations fail fast with
``ConnectionLost`` instead of piling up on a dead server, and the next attempt
after the back-off reconnects.

:func:`run_ops` executes a batch of :class:`Op` over several pools: each node's
share is *striped* over the connections it could get — one large value in
flight per connection (multi-MiB replies are not pipelined into one socket),
while small commands are pipelined on one connection in one write (one round
trip). Replies drive the next send from the reply callback, with no task per
item. If the batch is interrupted (deadline, cancellation) every connection
that still has a reply pending is aborted before the exception propagates.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections import deque
from typing import Any, Callable, Sequence

from ...config import Node, Settings
from ...errors import ConnectionLost, DeadlineExceeded, TransportError
from .connection import Connection, open_connection
from .parser import SMALL_REPLY_MAX

__all__ = ["NodePool", "Op", "run_ops", "PENDING"]

BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 1.0


class _Pending:
    def __repr__(self) -> str:
        return "PENDING"


PENDING: Any = _Pending()


class NodePool:
    def __init__(self, node: Node, settings: Settings, ssl_context: ssl.SSLContext | None) -> None:
        self.node = node
        self.settings = settings
        self.size = settings.connections_per_node
        self._ssl = ssl_context
        self._idle: list[Connection] = []
        self._all: set[Connection] = set()
        self._connecting = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._hungry: deque[Any] = deque()  # batch lanes that could use another connection
        self._backoff = 0.0
        self._retry_at = 0.0
        self._last_error: TransportError | None = None
        self._closed = False
        self._retiring = False  # see retire()
        self.connects = 0  # successful connects (stats / tests)
        # (family, sockaddr) of the last TCP connection made: the blocking lookup lane
        # connects there instead of resolving the host name itself (without a deadline).
        self.address: tuple[int, Any] | None = None

    # --- stats ---------------------------------------------------------------

    @property
    def round_trips(self) -> int:
        return self._round_trips_dead + sum(c.round_trips for c in self._all)

    _round_trips_dead = 0

    # --- acquire / release ------------------------------------------------------

    def _can_open(self) -> bool:
        return len(self._all) + self._connecting < self.size

    async def _open(self) -> Connection:
        now = time.monotonic()
        if now < self._retry_at and self._last_error is not None:
            self._wake()  # waiters queued behind us fail fast too, instead of at their deadline
            raise type(self._last_error)(
                f"{self._last_error} (node in back-off, next attempt in {self._retry_at - now:.2f}s)"
            )
        self._connecting += 1
        try:
            conn = await open_connection(self.node, self.settings, ssl_context=self._ssl)
        except TransportError as e:  # refused, timed out, or AUTH/SELECT rejected: back off alike
            e.unanswered = False  # (a lost AUTH/SELECT): what waits on this connect is not sent again
            self._backoff = min(BACKOFF_MAX_S, max(BACKOFF_MIN_S, self._backoff * 2))
            self._retry_at = time.monotonic() + self._backoff
            self._last_error = e
            raise
        finally:
            self._connecting -= 1
            self._wake()
        self._backoff = 0.0
        self._last_error = None
        self.connects += 1
        self._note_address(conn)
        if self._closed:
            conn.close()
            raise ConnectionLost(f"pool for {self.node.name} is closed")
        self._all.add(conn)
        return conn

    def _note_address(self, conn: Connection) -> None:
        # (asyncio read the peer's name when the transport was made: a reset since then
        # cannot raise here, as getpeername() would)
        t = conn.transport
        sock = t.get_extra_info("socket") if t is not None else None
        peer = t.get_extra_info("peername") if t is not None else None
        if sock is not None and peer and sock.family in (socket.AF_INET, socket.AF_INET6):
            self.address = (sock.family, peer)

    def _take_idle(self) -> Connection | None:
        while self._idle:
            c = self._idle.pop()
            if c.usable:
                return c
            self._forget(c)
        return None

    async def acquire(self) -> Connection:
        """A connection for exclusive use; waits for one if all are busy."""
        while True:
            if self._closed:
                raise ConnectionLost(f"pool for {self.node.name} is closed")
            c = self._take_idle()
            if c is not None:
                return c
            if self._can_open():
                return await self._open()
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            try:
                await fut
            except BaseException:
                if fut.done() and not fut.cancelled():
                    self._wake()  # we were woken but are leaving: pass the turn on
                raise
            finally:
                if not fut.done():
                    fut.cancel()
                try:
                    self._waiters.remove(fut)
                except ValueError:
                    pass

    async def acquire_extra(self) -> Connection | None:
        """An idle connection, or a new one if the pool has room; never waits for a busy one."""
        c = self._take_idle()
        if c is not None:
            return c
        if self._can_open() and not self._closed:
            try:
                return await self._open()
            except TransportError:
                return None
        return None

    def release(self, conn: Connection) -> None:
        if not conn.usable or conn.busy or self._closed:
            if conn.busy:
                conn.abort()
            elif not conn.broken:
                conn.close()
            self._forget(conn)
            self._wake()
            return
        if not self._waiters:  # nobody waits for a first connection: feed a running batch
            hungry = self._hungry
            while hungry:
                lane = hungry[0]
                if not lane.hungry:
                    hungry.popleft()
                    continue
                lane.adopt(conn)
                if not lane.hungry or len(lane.conns) >= self.size:
                    hungry.popleft()
                return
            if self._retiring:  # nobody needs it any more
                conn.close()
                self._forget(conn)
                return
        self._idle.append(conn)
        self._wake()

    def add_hungry(self, lane: Any) -> None:
        self._hungry.append(lane)

    def remove_hungry(self, lane: Any) -> None:
        try:
            self._hungry.remove(lane)
        except ValueError:
            pass

    def _forget(self, conn: Connection) -> None:
        if conn in self._all:
            self._all.discard(conn)
            self._round_trips_dead += conn.round_trips

    def _wake(self) -> None:
        while self._waiters:
            w = self._waiters.popleft()
            if not w.done():
                w.set_result(None)
                return

    async def fill(self) -> None:
        """Open connections up to the pool size (best effort)."""
        while self._can_open() and not self._closed:
            conn = await self._open()
            self._idle.append(conn)

    def retire(self) -> None:
        """Its node left the cluster's slot map: close the idle connections now, and each one
        in use once it is handed back with nobody waiting for it. Operations in flight or
        queued here still run: the node answers them (MOVED, if it no longer serves their
        keys, which the batch follows) or fails them, as it would have without the refresh."""
        self._retiring = True
        idle, self._idle = self._idle, []
        for c in idle:
            c.close()
            self._forget(c)

    @property
    def drained(self) -> bool:
        """No connection left, none being opened, nobody waiting."""
        return not self._all and not self._connecting and not self._waiters

    async def close(self) -> None:
        """Abort every connection (idle and in use); never waits on the server."""
        self._closed = True
        for c in list(self._all):
            c.abort(ConnectionLost(f"client closed; connection to {self.node.name} dropped"))
        self._all.clear()
        self._idle.clear()
        while self._waiters:
            w = self._waiters.popleft()
            if not w.done():
                w.set_result(None)


class Op:
    """One command of a batch: encoded parts, optional sink, and a result slot.

    ``bound``: the most bytes its reply (each reply, for a pipeline) may hold outside the
    sink: what the command can legitimately return (see parser.py).
    """

    __slots__ = ("index", "parts", "sink", "node", "asking", "slot", "key", "nreplies", "flags", "size", "bound",
                 "follow")

    def __init__(self, index: int, parts: Sequence[Any], sink: Sequence[memoryview] | None,
                 key: bytes | None = None, size: int = 0, bound: int = SMALL_REPLY_MAX) -> None:
        self.index = index
        self.size = size  # value bytes this op moves (sink capacity or payload); paces pipelining
        self.parts = parts
        self.sink = sink
        self.key = key
        self.bound = bound
        self.node: Node | None = None
        self.slot = 0
        self.asking = False
        self.nreplies = 0  # > 0: ``parts`` is a pipeline of that many small commands; the value is their reply list
        self.flags = False  # with nreplies: each answers :0 or :1, and the value is one parser.FlagRun
        # A small command sent right after this one on the same connection (WAIT after a SET:
        # it must follow that connection's write). Its reply is the op's value, unless the
        # op's own reply is an error, which is then the value. Large batches only.
        self.follow: bytes | None = None


_ASKING = b"*1\r\n$6\r\nASKING\r\n"
# A connection of a "large" batch gets another op only while the value bytes it
# has in flight stay within this budget: one multi-MiB value at a time, but
# small values pipelined.
PIPELINE_BUDGET = 1 << 20


def _ignore(_: Any) -> None:
    pass


class _Lane:
    """One node's share of a batch, fed to its connections from reply callbacks.

    In a large batch a connection whose work is done goes back to the pool at
    once, and a connection released by someone else may be *adopted* by a lane
    that still has queued ops (``NodePool`` hands it over), so concurrent
    batches share the pool instead of one running serially on a single socket.
    """

    def __init__(self, pool: "NodePool", ops: list[Op], batch: "_Batch", large: bool) -> None:
        self.pool = pool
        self.queue = deque(ops)
        self.batch = batch
        self.large = large
        self.conns: list[Connection] = []
        self.pending: list[Connection] = []  # acquired, not started yet
        self.inflight: dict[Connection, int] = {}

    @property
    def hungry(self) -> bool:
        return bool(self.queue) and not self.batch.stopped

    def start(self, conns: list[Connection]) -> None:
        if not conns:
            return
        if self.large:
            for c in conns:
                self.adopt(c)
            if self.hungry and len(self.conns) < self.pool.size:
                self.pool.add_hungry(self)
            return
        # small: pipeline everything on one connection: one write, one round trip
        c = conns[0]
        self.conns.append(c)
        for extra in conns[1:]:
            self.pool.release(extra)
        chunks: list[Any] = []
        ops = list(self.queue)
        self.queue.clear()
        for op in ops:
            if op.asking:
                chunks.append(_ASKING)
                c.send((), None, _ignore)
            chunks.extend(op.parts)
            if op.nreplies:
                ok = c.send_pipeline(b"", op.nreplies, self._cb(c, op), op.bound, flags=op.flags)
            else:
                ok = c.send((), op.sink, self._cb(c, op), op.bound)
            if not ok:
                self.batch.finish(op.index, ConnectionLost(f"connection to {c.node.name} is closed",
                                                           unanswered=True))  # never sent
        c.write(b"".join(chunks))

    def adopt(self, conn: Connection) -> None:
        """Take ``conn`` (exclusively) and start feeding it."""
        self.conns.append(conn)
        self.inflight[conn] = 0
        self._feed(conn)

    def _cb(self, conn: Connection, op: Op) -> Callable[[Any], None]:
        def done(value: Any) -> None:
            self.batch.finish(op.index, value)
            if self.large:
                self.inflight[conn] -= op.size
                self._feed(conn)
        return done

    def _feed(self, conn: Connection) -> None:
        q = self.queue
        if conn.broken or not q or self.batch.stopped:
            if not conn.busy:
                self._let_go(conn)
            if q and not self.batch.stopped and not self.conns:
                err = ConnectionLost(f"all connections to {conn.node.name} failed", unanswered=True)  # never sent
                while q:
                    self.batch.finish(q.popleft().index, err)
            return
        inflight = self.inflight
        while q and (inflight[conn] == 0 or inflight[conn] + q[0].size <= PIPELINE_BUDGET):
            op = q.popleft()
            if op.asking:
                conn.send((_ASKING,), None, _ignore, flush=False)
            inflight[conn] += op.size
            # Queued only: every op that fits the budget leaves in as few writes as possible.
            if not self._send(conn, op):
                inflight[conn] -= op.size
                q.appendleft(op)
                self._feed(conn)
                return
        conn.flush()

    def _send(self, conn: Connection, op: Op) -> bool:
        done = self._cb(conn, op)
        if op.follow is None:
            return conn.send(op.parts, op.sink, done, op.bound, flush=False)
        first: list[Any] = []
        if not conn.send(op.parts, op.sink, first.append, op.bound, flush=False):
            return False

        def second(value: Any) -> None:
            done(first[0] if isinstance(first[0], BaseException) else value)

        if not conn.send((op.follow,), None, second, flush=False):  # (not reached: broken is set by events)
            done(ConnectionLost(f"connection to {conn.node.name} broke between a command and its follow-up"))
        return True

    def _let_go(self, conn: Connection) -> None:
        """Give an idle (or broken) connection back to the pool before the batch ends."""
        try:
            self.conns.remove(conn)
        except ValueError:
            return
        self.inflight.pop(conn, None)
        self.pool.release(conn)

    def fail_rest(self, err: TransportError) -> None:
        q = self.queue
        while q:
            self.batch.finish(q.popleft().index, err)


class _Batch:
    def __init__(self, results: list[Any], indices: Sequence[int]) -> None:
        self.results = results
        self.left = len(indices)
        self.stopped = False
        self.fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if not self.left:
            self.fut.set_result(None)

    def finish(self, index: int, value: Any) -> None:
        if self.stopped or self.results[index] is not PENDING:
            return
        self.results[index] = value
        self.left -= 1
        if self.left == 0 and not self.fut.done():
            self.fut.set_result(None)


async def run_ops(
    groups: dict[Node, list[Op]],
    pools: Callable[[Node], NodePool],
    results: list[Any],
    *,
    large: bool,
) -> None:
    """Run each node's ops on that node's pool, in parallel; fill ``results[op.index]``.

    A reply value (or an exception object for an error reply / lost
    connection) lands in ``results``. Slots of ops not run stay ``PENDING``
    when interrupted; the caller turns them into DeadlineExceeded.
    """
    all_ops = [op for ops in groups.values() for op in ops]
    batch = _Batch(results, [op.index for op in all_ops])
    lanes = [_Lane(pools(node), ops, batch, large) for node, ops in groups.items()]

    async def get_conns(lane: _Lane) -> None:
        pool = lane.pool
        if large:
            units = max(1, sum(op.size for op in lane.queue) // PIPELINE_BUDGET)
            want = min(len(lane.queue), pool.size, units)
        else:
            want = 1
        got = lane.pending
        try:
            got.append(await pool.acquire())
        except TransportError as e:
            lane.fail_rest(e)
            return
        if want > 1:
            async def extra() -> None:
                c = await pool.acquire_extra()
                if c is not None:
                    got.append(c)
            await asyncio.gather(*(extra() for _ in range(want - 1)))
        lane.pending = []
        lane.start(got)

    try:
        if len(lanes) == 1:
            await get_conns(lanes[0])
        else:
            await asyncio.gather(*(get_conns(lane) for lane in lanes))
        if not batch.fut.done():
            await batch.fut
    except BaseException:
        batch.stopped = True  # unfinished slots stay PENDING; the caller names the cause
        for lane in lanes:
            for c in lane.conns:
                if c.busy:
                    c.abort(DeadlineExceeded("batch interrupted"))
        raise
    finally:
        batch.stopped = True
        for lane in lanes:
            lane.pool.remove_hungry(lane)
            conns = lane.conns + lane.pending
            lane.conns, lane.pending = [], []
            for c in conns:
                lane.pool.release(c)
