"""Lookups on the caller's own thread: blocking sockets for EXISTS pipelines, no event loop.

Why: an engine's synchronous lookup (LMCache's ``batched_contains`` from its scheduler
thread, SGLang's ``batch_exists``) otherwise crosses into the private I/O loop and back.
Two thread wake-ups and the loop's own work cost ~0.3 ms on a busy 2-core machine, several
times the round trip itself (docs/throughput.md). A lookup is small (~100 bytes per key each
way) and only reads, so the waiting thread can do it itself: one ``sendall`` per node, then
``recv_into`` the reply parser's buffer until every reply is in.

Scope: the replies of an EXISTS pipeline and nothing else. The connections are this lane's
own (authenticated and ``SELECT``-ed like the pool's), a few per node, each used by one thread
at a time. A connection whose request did not finish cleanly (deadline, reset, a reply that is
not an EXISTS answer) is closed, never reused, so a late reply can never be read as the next
lookup's. The caller decides what an odd reply means (redirections, error replies): this
module only reports them.

Never call it from an event loop's thread: it blocks for up to the deadline.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
import threading
import time
from typing import Any, Callable, Iterable, Sequence

from ...config import Node, Settings
from ...timeouts import timeout as time_limit
from ...errors import AuthError, ConnectionLost, DeadlineExceeded, ProtocolError, ServerError, TransportError
from .connection import _tune
from .parser import FlagRun, ReplyParser, encode_command

__all__ = ["BlockingLookups", "CONNECTIONS_PER_NODE"]

# Concurrent blocking lookups per node; more callers than this at once take the loop's path.
CONNECTIONS_PER_NODE = 2


class _Conn:
    """One blocking connection with its own reply parser."""

    __slots__ = ("node", "sock", "parser", "replies")

    def __init__(self, node: Node) -> None:
        self.node = node
        self.sock: Any = None  # a socket.socket or ssl.SSLSocket, once connected
        self.replies: list[Any] = []
        self.parser = ReplyParser(self.replies.append)

    def send(self, data: bytes, deadline: float) -> None:
        self.sock.settimeout(_left(deadline, self.node))  # (blocking again after the loop's turn)
        self.sock.sendall(data)

    def receive(self, n: int, deadline: float) -> None:
        """Until ``n`` more replies (a flag run counts as one) have arrived."""
        replies, parser, sock = self.replies, self.parser, self.sock
        want = len(replies) + n
        while len(replies) < want:
            sock.settimeout(_left(deadline, self.node))
            got = sock.recv_into(parser.get_buffer())
            if not got:
                raise ConnectionLost(f"{self.node.name} closed the connection")
            parser.buffer_updated(got)

    def call(self, args: Sequence[Any], deadline: float) -> Any:
        self.parser.push_no_sinks(1)
        self.send(encode_command(args), deadline)
        self.receive(1, deadline)
        reply = self.replies.pop()
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def close(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass


def _lookup_error(e: BaseException, timeout: float) -> BaseException:
    """The typed error a failed lookup raises; a cancellation (or any BaseException that is not
    an Exception) stays itself."""
    if isinstance(e, TransportError) or not isinstance(e, Exception):
        return e
    if isinstance(e, (socket.timeout, TimeoutError)):
        return DeadlineExceeded(f"lookup: no answer within {timeout:g}s")
    if isinstance(e, ssl.SSLError):
        return ConnectionLost(f"lookup: TLS error: {e}")
    if isinstance(e, OSError):
        return ConnectionLost(f"lookup: {e.strerror or e}")
    return ConnectionLost(f"lookup: {type(e).__name__}: {e}")  # (e.g. a host name IDNA refuses)


def _expect(c: _Conn, n: int, flags: bool) -> None:
    """Tell the parser what ``n`` commands answer: a flag run, or ``n`` small replies."""
    if flags:
        c.parser.push_flags(n)
    else:
        c.parser.push_no_sinks(n)


class _NoAddress(Exception):
    """A host name the loop's pool has not resolved yet: that lookup takes the loop."""


def _left(deadline: float, node: Node) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise DeadlineExceeded(f"{node.name}: lookup deadline passed")
    return left


class BlockingLookups:
    """A few blocking connections per node for EXISTS pipelines on the caller's thread."""

    def __init__(self, settings: Settings, ssl_context: ssl.SSLContext | None,
                 per_node: int = CONNECTIONS_PER_NODE,
                 address_of: Callable[[Node], tuple[int, Any] | None] = lambda node: None) -> None:
        self.settings = settings
        self._ssl = ssl_context
        self._address_of = address_of
        self._per_node = per_node
        self._lock = threading.Lock()
        self._idle: dict[Node, list[_Conn]] = {}
        self._open: dict[Node, int] = {}  # connections per node, idle or in use
        self._busy: set[_Conn] = set()
        self._closed = False
        self._retired: set[Node] = set()  # nodes left behind, with connections still in use

    def exists(self, parts: Sequence[tuple[Node, bytes, int]], timeout: float, *,
               flags: bool = True) -> list[Any] | None:
        """Send each node its pipeline (``(node, commands, how many)``), then read every
        node's replies: one :class:`FlagRun` per part, in order (``flags=False``: EXISTS of
        several keys each, one list of integer replies per part). ``None`` when a connection
        is not to be had at once (all in use, or this lane closed): the caller takes the
        loop's path. Raises :class:`TransportError` (``DeadlineExceeded`` past ``timeout``)."""
        deadline = time.monotonic() + timeout
        conns = self._take_all(parts)
        if conns is None:
            return None
        reused = any(c.sock is not None for c in conns)
        try:
            for c in conns:  # a new connection is opened here, within the deadline
                if c.sock is None:
                    self._connect(c, deadline)
            for c, (_, data, n) in zip(conns, parts):
                _expect(c, n, flags)
                c.send(data, deadline)
            for c, (_, _, n) in zip(conns, parts):
                c.receive(1 if flags else n, deadline)
        except _NoAddress:  # (raised before anything was sent: the connected ones are clean)
            for c in conns:
                if c.sock is None:
                    self._drop(c)
                else:
                    self._give_back(c)
            return None
        except BaseException as e:
            for c in conns:
                self._drop(c)
            err = _lookup_error(e, timeout)
            if isinstance(err, ConnectionLost) and reused:
                # An idle connection the server (or its timeout, a restart, a failover) closed
                # meanwhile: not a failed lookup. The loop's path answers it; the next one here
                # opens a fresh connection.
                return None
            raise err from None
        return self._finish(conns, parts, flags)

    def _finish(self, conns: list[_Conn], parts: Sequence[tuple[Node, bytes, int]], flags: bool = True) -> list[Any]:
        """Each connection's replies (its one flag run, or its list of replies), the
        connections handed back (or dropped, if any is not exactly one complete flag run: a
        FlagRun holds odd replies too; anything else is not an EXISTS pipeline's answer)."""
        runs: list[Any] = []
        for c, (_, _, n) in zip(conns, parts):
            if flags:
                run: Any = c.replies.pop()
                ok = type(run) is FlagRun
            else:
                run, c.replies[:] = list(c.replies), []
                ok = len(run) == n
            runs.append(run)
            if not ok or not c.parser.idle or c.replies:
                for c2 in conns:
                    self._drop(c2)
                raise ProtocolError(f"{c.node.name}: unexpected replies to a lookup")
        for c in conns:
            self._give_back(c)
        return runs

    async def exists_on_caller_loop(self, parts: Sequence[tuple[Node, bytes, int]],
                                    timeout: float, *, flags: bool = True) -> list[Any] | None:
        """:meth:`exists` awaited on the calling event loop (an engine's own), the sockets
        switched to non-blocking for it: no thread is woken. Only over idle plain-TCP
        connections this lane already has; otherwise ``None`` (the caller takes a thread,
        which opens one). Cancelled or past ``timeout``, the connections are closed before
        the exception propagates."""
        if self._ssl is not None:
            return None  # (an SSLSocket cannot be driven by loop.sock_*)
        conns = self._take_all(parts, idle_only=True)
        if conns is None:
            return None
        loop = asyncio.get_running_loop()
        try:
            async with time_limit(timeout):
                for c, (_, data, n) in zip(conns, parts):
                    _expect(c, n, flags)
                    c.sock.setblocking(False)
                    await loop.sock_sendall(c.sock, data)
                for c, (_, _, n) in zip(conns, parts):
                    replies, parser, sock = c.replies, c.parser, c.sock
                    while len(replies) < (1 if flags else n):
                        got = await loop.sock_recv_into(sock, parser.get_buffer())
                        if not got:
                            raise ConnectionLost(f"{c.node.name} closed the connection")
                        parser.buffer_updated(got)
        except BaseException as e:
            for c in conns:
                self._drop(c)
            err = _lookup_error(e, timeout)
            if isinstance(err, ConnectionLost):
                return None  # (an idle connection closed meanwhile: see exists)
            raise err from None
        return self._finish(conns, parts, flags)

    def close(self) -> None:
        """Close every idle connection now; one in use is shut down (its caller sees the
        connection end) and closed when handed back."""
        with self._lock:
            self._closed = True
            idle = [c for cs in self._idle.values() for c in cs]
            self._idle.clear()
            busy = list(self._busy)
        for c in idle:
            c.close()
        for c in busy:
            sock = c.sock  # (read once: its thread may be handing it back right now)
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except (OSError, ValueError):
                    pass

    def retire_all_but(self, nodes: Iterable[Node]) -> None:
        """The cluster now consists of ``nodes``: close the idle connections to any other
        node now, and each one in use when it is handed back, unless a lookup is routed to
        that node again meanwhile."""
        keep = set(nodes)
        with self._lock:
            gone = [c for node in list(self._idle) if node not in keep for c in self._idle.pop(node)]
            for c in gone:
                self._count_closed(c.node)
            self._retired = {node for node in self._open if node not in keep}
        for c in gone:
            c.close()

    # --- connections ---------------------------------------------------------------

    def _take_all(self, parts: Sequence[tuple[Node, bytes, int]], idle_only: bool = False) -> list[_Conn] | None:
        """A connection for each part, or none at all (those taken are handed back)."""
        conns: list[_Conn] = []
        for node, _, _ in parts:
            c = self._take(node, idle_only)
            if c is None:
                for c2 in conns:
                    if c2.sock is None:
                        self._drop(c2)  # (never connected: its place is freed)
                    else:
                        self._give_back(c2)
                return None
            conns.append(c)
        return conns

    def _take(self, node: Node, idle_only: bool = False) -> _Conn | None:
        with self._lock:
            if self._closed:
                return None
            self._retired.discard(node)  # (routed here again: a node of the cluster)
            idle = self._idle.get(node)
            if idle:
                c = idle.pop()
            elif not idle_only and self._open.get(node, 0) < self._per_node:
                self._open[node] = self._open.get(node, 0) + 1
                c = _Conn(node)  # connected by the caller, outside the lock
            else:
                return None
            self._busy.add(c)
            return c

    def _give_back(self, c: _Conn) -> None:
        with self._lock:
            self._busy.discard(c)
            if not self._closed and c.node not in self._retired:
                self._idle.setdefault(c.node, []).append(c)
                return
            self._count_closed(c.node)
        c.close()

    def _drop(self, c: _Conn) -> None:
        with self._lock:
            self._busy.discard(c)
            self._count_closed(c.node)
        c.close()

    def _count_closed(self, node: Node) -> None:
        """(under the lock) one connection to ``node`` fewer; a node with none is forgotten."""
        left = self._open[node] - 1
        if left:
            self._open[node] = left
        else:
            del self._open[node]
            self._retired.discard(node)

    def _address(self, node: Node) -> tuple[int, Any]:
        """Where to connect: an IP literal as it is; a host name where the loop's pool last
        reached it. Never a name resolution here: ``getaddrinfo`` keeps no deadline."""
        try:
            ip = ipaddress.ip_address(node.host)
        except ValueError:
            known = self._address_of(node)
            if known is None:
                raise _NoAddress() from None
            return known
        return (socket.AF_INET6 if ip.version == 6 else socket.AF_INET), (str(ip), node.port)

    def _connect(self, c: _Conn, deadline: float) -> None:
        """Connect, authenticate and select the database, like the pool's connections."""
        s, node = self.settings, c.node
        what = f"valkey{'s' if self._ssl else ''}://{node.name}"
        sock: Any = None
        try:
            if node.path:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(_left(deadline, node))
                sock.connect(node.path)
            else:
                family, addr = self._address(node)
                sock = socket.socket(family, socket.SOCK_STREAM)
                sock.settimeout(_left(deadline, node))
                sock.connect(addr)
            _tune(sock)
            if self._ssl is not None:
                name = (s.tls.server_name if s.tls and s.tls.server_name else node.host) or None
                # The handshake keeps the socket's timeout as one deadline for all of it: what
                # is left now, not what was left before the connect.
                sock.settimeout(_left(deadline, node))
                sock = self._ssl.wrap_socket(sock, server_hostname=name)
            c.sock = sock
            if s.password is not None:
                c.call(("AUTH", s.username, s.password) if s.username else ("AUTH", s.password), deadline)
            if s.db:
                c.call(("SELECT", s.db), deadline)
        except BaseException as e:
            if c.sock is None and sock is not None:
                try:
                    sock.close()
                except OSError:
                    pass
            if isinstance(e, AuthError):
                raise AuthError(f"authentication to {what} refused: {e.message}") from None
            if isinstance(e, ServerError):
                raise type(e)(f"{what}: {e.message}") from None
            raise
