"""One RESP connection: an :class:`asyncio.BufferedProtocol` over TCP, a Unix socket or TLS.

Receive path: :meth:`Connection.get_buffer` hands the event loop a slice of the
*current destination* — the caller's buffer while a GET's payload is arriving,
the parser's scratch buffer otherwise — so the kernel (or the TLS layer) copies
straight into it. On plain sockets, once a payload is arriving we keep calling
``recv_into`` until the socket would block (up to ``GREEDY_MAX`` bytes per
callback), and set ``SO_RCVLOWAT`` to min(payload still due, ``RCVLOWAT_MAX``)
so the loop wakes for big pieces, not for every segment.

Send path: commands are queued as a list of buffers (a small RESP header, then
the caller's payload memoryviews, then a trailer); the payload is never
concatenated. Runs of our own small byte strings (a batch's commands, one SET's
trailer and the next one's header) are joined into one write. On plain sockets
large buffers go out with ``sock.send`` straight from the caller's memory
whenever the transport has nothing queued; when the socket is full, only a
small probe slice is handed to the transport (which copies it and pauses us
until the socket drains). TLS writes go through the
transport slice by slice (encryption copies anyway).

Buffer ownership rule (the one place it is written down)
---------------------------------------------------------
A caller's destination buffers (GET sinks) and source buffers (SET parts) are
referenced by a connection only while the request that carries them is pending.
A request stops being pending when its reply has been fully parsed, or when the
connection is *aborted*. Any error, deadline or cancellation that hits a request
whose reply has not fully arrived aborts the connection **synchronously, before
the exception propagates to the caller**: ``transport.abort()`` unregisters the
socket from the event loop at once, the parser forgets every sink
(:meth:`ReplyParser.abandon`) and the send queue is cleared. So when a timed-out
or cancelled ``get_into`` returns, nothing can write into the caller's buffer
any more and nothing will read its SET payload; the buffer may be reused or
freed. An aborted connection is never returned to a pool.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections import deque
from itertools import repeat
from typing import Any, Callable, Sequence

from ...timeouts import timeout as deadline
from ...config import Node, Settings, TLSSettings
from ...errors import (
    AuthError,
    ConnectionLost,
    DeadlineExceeded,
    ProtocolError,
    ServerError,
    TransportError,
)
from .parser import SMALL_REPLY_MAX, ReplyParser, encode_command

__all__ = ["Connection", "open_connection", "make_ssl_context"]

# Socket buffers: large enough that one read/write moves a big piece of a
# multi-MiB value. The kernel caps them at net.core.[rw]mem_max.
SOCK_BUF = 4 << 20
# Largest slice handed to transport.write() at once (see the send path above).
WRITE_SLICE = 1 << 20
# Most bytes read in one event-loop callback before yielding to other work.
GREEDY_MAX = 8 << 20
# While a payload arrives on a plain socket, ask the kernel to wake us only when
# this much (or the rest of the payload) is readable: fewer, bigger reads.
RCVLOWAT_MAX = 1 << 20
# Plain sockets: buffers of at least DIRECT_MIN bytes are sent with sock.send()
# straight from the caller's memory while the transport has nothing queued; when
# the socket is full only PROBE_SLICE bytes are handed to (and copied by) the
# transport, to be told when it drains.
DIRECT_SEND = True
DIRECT_MIN = 64 << 10
PROBE_SLICE = 16 << 10
# Payloads smaller than this are joined with their header (one send() call).
SMALL_JOIN = 8 << 10
# Consecutive small byte strings waiting to go out (a batch's GET commands, one SET's trailer
# and the next one's header) are joined into one write of at most this many bytes: one
# system call, and one read on the server, instead of one per command. Only our own
# ``bytes`` are joined, never a caller's buffer: payloads go out in place.
COALESCE_MAX = 64 << 10

Callback = Callable[[Any], None]


def _joinable(out: "deque[Any]") -> bool:
    """The head of ``out`` and the buffer after it are both small byte strings of ours."""
    return (len(out) > 1 and type(out[0]) is bytes and type(out[1]) is bytes
            and len(out[0]) + len(out[1]) <= COALESCE_MAX)


def _coalesce(out: "deque[Any]") -> bytes:
    """Join the run of ``bytes`` at the head of ``out`` (at most ``COALESCE_MAX`` bytes in
    all) into one, which replaces them at the head."""
    run = [out.popleft()]
    size = len(run[0])
    while out and type(out[0]) is bytes and size + len(out[0]) <= COALESCE_MAX:
        d = out.popleft()
        run.append(d)
        size += len(d)
    joined = b"".join(run)
    out.appendleft(joined)
    return joined


def make_ssl_context(tls: TLSSettings) -> ssl.SSLContext:
    if tls.verify:
        ctx = ssl.create_default_context(cafile=tls.ca_file)
    else:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if tls.cert_file:
        ctx.load_cert_chain(tls.cert_file, tls.key_file)
    return ctx


class _Gather:
    """One entry in the reply queue standing for the ``n`` replies of a pipeline.

    Collects them, then calls back once with the list.
    """

    __slots__ = ("n", "values", "cb")

    def __init__(self, n: int, cb: Callback) -> None:
        self.n = n
        self.values: list[Any] = []
        self.cb = cb

    def fail(self, exc: BaseException) -> None:
        values = self.values
        values.extend(repeat(exc, self.n - len(values)))
        self.cb(values)


class Connection(asyncio.BufferedProtocol):
    """A single RESP2 connection. Not safe to share between concurrent users:
    pools hand it to one operation (or one batch) at a time."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.transport: asyncio.Transport | None = None
        self.parser = ReplyParser(self._on_reply)
        self._cbs: deque[Callback] = deque()
        self._out: deque[Any] = deque()
        self._paused = False
        self._sock: socket.socket | None = None  # raw socket (plain TCP/Unix only)
        self._lowat = 1
        self.broken = False
        self.closed: asyncio.Future[None] | None = None
        self.round_trips = 0  # requests sent while no reply was pending
        self.requests = 0
        self.received = 0  # bytes read from the socket, ever
        self._received_at_round = 0  # ... when the current round trip began

    # --- asyncio.BufferedProtocol -------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if transport.get_extra_info("sslcontext") is None:
            # Plain socket: pause as soon as anything is left unsent, so the
            # transport never holds (copies) more than one slice's tail.
            transport.set_write_buffer_limits(high=0)  # type: ignore[attr-defined]
        else:
            # TLS encrypts into its own buffers anyway. (sslproto pauses when
            # size >= high, so high=0 would never resume.)
            transport.set_write_buffer_limits(high=WRITE_SLICE, low=WRITE_SLICE // 4)  # type: ignore[attr-defined]
        self.closed = asyncio.get_running_loop().create_future()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.parser.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        parser = self.parser
        self.received += nbytes
        try:
            parser.buffer_updated(nbytes)
            sock = self._sock
            if sock is None:
                return
            if parser.filling:
                # Greedy: drain the socket straight into the destination.
                recv_into = sock.recv_into
                budget = GREEDY_MAX
                while parser.filling and budget > 0:
                    buf = parser.get_buffer(-1)
                    try:
                        n = recv_into(buf)
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError:
                        return  # the transport meets the error on its next read
                    if not n:
                        return  # EOF: the transport sees it on its next read
                    budget -= n
                    self.received += n
                    parser.buffer_updated(n)
            # Wake us only when a big piece of the payload is there — never more
            # than the payload still due, or the socket would never turn readable.
            want = min(parser.fill_left, RCVLOWAT_MAX) if parser.filling and RCVLOWAT_MAX else 1
            if want != self._lowat:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, max(1, want))
                    self._lowat = want
                except OSError:
                    pass  # socket already failing; the transport reports it
        except TransportError as e:  # ProtocolError
            self.abort(e)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        why = f": {exc}" if exc else " (closed by the server)"
        self._fail_all(ConnectionLost(f"connection to {self.node.name} lost{why}",
                                      unanswered=self.received == self._received_at_round))
        if self.closed is not None and not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._pump()

    # --- requests ---------------------------------------------------------------

    @property
    def usable(self) -> bool:
        """Not broken, and not closing either: the transport closes at once on reading the
        server's EOF, while ``connection_lost`` (which marks us broken) runs a loop turn later."""
        t = self.transport
        return not self.broken and t is not None and not t.is_closing()

    @property
    def busy(self) -> bool:
        return bool(self._cbs)

    def send(self, parts: Sequence[Any], sink: Sequence[memoryview] | None, cb: Callback,
             bound: int = SMALL_REPLY_MAX, *, flush: bool = True) -> bool:
        """Queue one command (already encoded as ``parts``) and its reply callback.

        ``cb(value)`` runs synchronously when the reply is parsed; ``value`` is
        an exception object for an error reply or a lost connection. ``bound``:
        the most bytes the reply may hold outside ``sink`` (what the command can
        legitimately return; more is a ProtocolError). Returns False (and does
        not call ``cb``) when the connection is already broken. ``flush=False``
        only queues the bytes: a caller sending several commands in a row calls
        :meth:`flush` after the last, so they leave in as few writes as possible.
        """
        if self.broken:
            return False
        if not self._cbs:
            self.round_trips += 1
            self._received_at_round = self.received
        self.requests += 1
        self.parser.push_sink(sink, bound)
        self._cbs.append(cb)
        if parts:
            self._out.extend(parts)
            if flush and not self._paused:
                self._pump()
        return True

    def flush(self) -> None:
        """Start sending what :meth:`send` queued with ``flush=False``."""
        if not self.broken and self._out and not self._paused:
            self._pump()

    def send_pipeline(self, data: bytes, n: int, cb: Callback, bound: int = SMALL_REPLY_MAX, *,
                      flags: bool = False) -> bool:
        """Queue ``n`` small commands already encoded back to back in ``data``.

        ``cb(values)`` runs once with the list of the ``n`` replies (error
        replies and, if the connection breaks, ConnectionLost as elements);
        each reply is held to ``bound`` bytes. ``flags``: each command answers ``:0`` or
        ``:1`` (EXISTS of one key), and ``cb`` gets one :class:`~.parser.FlagRun` instead
        (or the exception object if the connection breaks).
        """
        if self.broken:
            return False
        if not self._cbs:
            self.round_trips += 1
            self._received_at_round = self.received
        self.requests += n
        if flags:
            self.parser.push_flags(n)
            self._cbs.append(cb)
        else:
            self.parser.push_no_sinks(n, bound)
            self._cbs.append(_Gather(n, cb))
        if data:
            self._out.append(data)
            if not self._paused:
                self._pump()
        return True

    def write(self, data: bytes) -> None:
        """Queue bytes whose replies were registered with ``send(())``/``send_pipeline(b"")``."""
        if not self.broken and data:
            self._out.append(data)
            if not self._paused:
                self._pump()

    def request(self, args: Sequence[Any], sink: Sequence[memoryview] | None = None,
                bound: int = SMALL_REPLY_MAX) -> asyncio.Future[Any]:
        """Send a small command; the future resolves to its reply (errors as exceptions)."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def done(v: Any, fut: asyncio.Future[Any] = fut) -> None:
            if fut.done():
                return
            if isinstance(v, BaseException):
                fut.set_exception(v)
            else:
                fut.set_result(v)

        if not self.send((encode_command(args),), sink, done, bound):
            fut.set_exception(ConnectionLost(f"connection to {self.node.name} is closed"))
        return fut

    async def call(self, *args: Any, sink: Sequence[memoryview] | None = None, bound: int = SMALL_REPLY_MAX) -> Any:
        """Send one command and wait for its reply; aborts the connection if interrupted."""
        fut = self.request(args, sink, bound)
        try:
            return await fut
        except BaseException:
            if not fut.done():
                self.abort(ConnectionLost("request interrupted"))
            raise

    def abort(self, exc: BaseException | None = None) -> None:
        """Drop the connection now (see the ownership rule in the module docstring)."""
        if not self.broken:
            self.broken = True
            self.parser.abandon()
            self._out.clear()
            if self.transport is not None:
                self.transport.abort()
        self._fail_all(exc or ConnectionLost(f"connection to {self.node.name} aborted"))

    def close(self) -> None:
        """Close politely when idle (pending requests fail)."""
        if self.busy:
            self.abort()
            return
        self.broken = True
        self.parser.abandon()
        if self.transport is not None:
            self.transport.close()

    # --- internals --------------------------------------------------------------

    def _pump(self) -> None:
        out = self._out
        transport = self.transport
        write = transport.write  # type: ignore[union-attr]
        sock = self._sock if DIRECT_SEND else None
        while out and not self._paused:
            if transport.is_closing():  # type: ignore[union-attr]
                out.clear()  # connection_lost() follows and fails the pending requests
                return
            d = out[0]
            if _joinable(out):
                d = _coalesce(out)
            if sock is not None and len(d) >= DIRECT_MIN and not transport.get_write_buffer_size():  # type: ignore[union-attr]
                # Plain socket, nothing queued in the transport (so order is
                # kept): the kernel copies straight from the caller's buffer.
                try:
                    n = sock.send(d)
                except (BlockingIOError, InterruptedError):
                    n = 0
                except OSError:
                    n = 0  # the transport's own write below meets the error and reports it
                if n == len(d):
                    out.popleft()
                    continue
                if n:
                    d = d[n:]
                # Socket full: hand the transport a small piece; it copies it,
                # waits for the socket to drain and pauses us until then.
                write(d[:PROBE_SLICE])
                if len(d) > PROBE_SLICE:
                    out[0] = d[PROBE_SLICE:]
                else:
                    out.popleft()
                continue
            if len(d) > WRITE_SLICE:
                write(d[:WRITE_SLICE])
                out[0] = d[WRITE_SLICE:]
            else:
                write(d)
                out.popleft()

    def _on_reply(self, value: Any) -> None:
        cbs = self._cbs
        if not cbs:  # a reply nobody asked for: the stream is out of step with our requests
            raise ProtocolError(f"{self.node.name} sent a reply with no request pending")
        cb = cbs[0]
        if type(cb) is _Gather:
            values = cb.values
            values.append(value)
            if len(values) == cb.n:
                cbs.popleft()  # before the callback, which may queue more
                cb.cb(values)
        else:
            cbs.popleft()
            cb(value)

    def _fail_all(self, exc: BaseException) -> None:
        self.broken = True
        self.parser.abandon()
        self._out.clear()
        cbs = self._cbs
        while cbs:
            cb = cbs.popleft()
            if type(cb) is _Gather:
                cb.fail(exc)
            else:
                cb(exc)


def _tune(sock: socket.socket) -> None:
    for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCK_BUF)
        except OSError:
            pass
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Notice a silently vanished peer (no FIN: host gone, NAT timeout) on idle pooled connections.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
            opt = getattr(socket, name, None)
            if opt is not None:
                try:
                    sock.setsockopt(socket.IPPROTO_TCP, opt, value)
                except OSError:
                    pass


async def _raw_connect(node: Node) -> socket.socket:
    loop = asyncio.get_running_loop()
    if node.path:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        _tune(sock)
        try:
            await loop.sock_connect(sock, node.path)
        except BaseException:
            sock.close()
            raise
        return sock
    infos = await loop.getaddrinfo(node.host, node.port, type=socket.SOCK_STREAM)
    last: BaseException | None = None
    for family, type_, proto, _, addr in infos:
        sock = socket.socket(family, type_, proto)
        sock.setblocking(False)
        _tune(sock)
        try:
            await loop.sock_connect(sock, addr)
            return sock
        except OSError as e:
            sock.close()
            last = e
        except BaseException:
            sock.close()
            raise
    raise last or OSError(f"no address for {node.host}")


async def open_connection(
    node: Node, settings: Settings, *, ssl_context: ssl.SSLContext | None = None, timeout: float | None = None
) -> Connection:
    """Connect, authenticate and select the database.

    Raises ConnectionLost (unreachable), AuthError (credentials refused) or
    DeadlineExceeded (no answer within ``timeout``, default connect_timeout_s).
    """
    loop = asyncio.get_running_loop()
    timeout = settings.connect_timeout_s if timeout is None else timeout
    conn = Connection(node)
    what = f"valkey{'s' if ssl_context else ''}://{node.name}"
    try:
        async with deadline(timeout):
            sock = await _raw_connect(node)
            try:
                kw: dict[str, Any] = {}
                if ssl_context is not None:
                    kw["ssl"] = ssl_context
                    tls = settings.tls
                    kw["server_hostname"] = (tls.server_name if tls and tls.server_name else node.host) or None
                    kw["ssl_handshake_timeout"] = max(timeout, 0.1)
                await loop.create_connection(lambda: conn, sock=sock, **kw)
            except BaseException:
                sock.close()
                raise
            if ssl_context is None:
                conn._sock = sock
            if settings.password is not None:
                if settings.username:
                    await conn.call("AUTH", settings.username, settings.password)
                else:
                    await conn.call("AUTH", settings.password)
            if settings.db:
                await conn.call("SELECT", settings.db)
        return conn
    except TimeoutError:
        conn.abort()
        raise DeadlineExceeded(f"connecting to {what} took longer than {timeout:g}s") from None
    except AuthError as e:
        conn.abort()
        raise AuthError(f"authentication to {what} refused: {e.message}") from None
    except ServerError as e:
        conn.abort()
        raise type(e)(f"{what}: {e.message}") from None
    except ssl.SSLError as e:
        conn.abort()
        raise ConnectionLost(f"TLS handshake with {what} failed: {e}") from None
    except OSError as e:
        conn.abort()
        raise ConnectionLost(f"cannot connect to {what}: {e.strerror or e}") from None
    except TransportError:
        conn.abort()
        raise
    except BaseException:
        conn.abort()
        raise
