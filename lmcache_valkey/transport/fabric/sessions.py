"""Control connections to the endpoint, each carrying one fabric session (the handshake it
is given -- HELLO and, where the server takes it, the address proof -- runs once when it
opens). valkey-py is imported here and nowhere else in this package; its errors are mapped
here.

Valkey serves one blocked command per connection at a time, so the pool hands each
operation a connection of its own. A connection that saw an error or cancellation in the
middle of a reply is dropped, never pooled; one the server closed while idle (restart) is
discarded on the way out of the pool. Knows nothing of buffers or RMA.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import valkey.asyncio.connection as vconn
import valkey.exceptions as vexc
from valkey._parsers.resp2 import _AsyncRESP2Parser

from lmcache_valkey.errors import ConnectionLost, DeadlineExceeded, FabricUnavailable, ProtocolError, TransportError

from ..resp.parser import ITEM_COST, MAX_DEPTH, MAX_LINE, SMALL_REPLY_MAX, SimpleString, parse_number
from . import commands


class _BoundedParser(_AsyncRESP2Parser):
    """valkey-py's pure-Python RESP2 parser held to the RESP client's rules
    (docs/resp-reply-bounds.md): a reply may hold at most ``bound`` bytes (``ITEM_COST`` per
    value on top), so a declared length is refused before anything is read or allocated;
    numbers are plain decimal; ``$-2``/``*-5``, nesting deeper than ``MAX_DEPTH``, lines
    longer than ``MAX_LINE`` and unknown type bytes are a :class:`ProtocolError`. A status
    reply is a :class:`SimpleString`, never taken for a bulk with the same bytes. Error
    replies keep the server's text whole (valkey-py strips the codes our tables classify by).
    """

    def __init__(self, socket_read_size: int, bound: int = SMALL_REPLY_MAX) -> None:
        super().__init__(socket_read_size)
        self.bound = bound
        self._budget = 0

    @classmethod
    def parse_error(cls, response: str) -> vexc.ResponseError:
        exc = super().parse_error(response)
        exc.args = (response,)
        return exc

    async def read_response(self, disable_decoding: bool = False) -> Any:
        self._budget = self.bound
        try:
            return await super().read_response(disable_decoding=True)
        except ProtocolError:
            raise
        except (ValueError, IndexError, TypeError, UnicodeError, RecursionError) as exc:
            # e.g. the stream reader's own line limit
            raise ProtocolError(f"malformed reply: {type(exc).__name__}: {str(exc)[:80]}") from None

    def _charge(self, n: int, what: str) -> None:
        self._budget -= n
        if self._budget < 0:
            raise ProtocolError(f"{what} past the reply's bound of {self.bound} bytes")

    async def _read_response(self, disable_decoding: bool = False, depth: int = 0) -> Any:
        raw = await self._readline()
        if len(raw) > MAX_LINE:
            raise ProtocolError(f"a reply line of {len(raw)} bytes")
        self._charge(len(raw) + ITEM_COST, "a reply")
        byte, rest = raw[:1], raw[1:]
        if byte == b"-":
            error = self.parse_error(rest.decode("utf-8", errors="replace"))
            if isinstance(error, vexc.ConnectionError):
                self._clear()
                raise error
            return error
        if byte == b"+":
            return SimpleString(rest)
        if byte == b":":
            return parse_number(rest, "integer")
        if byte not in (b"$", b"*"):
            raise ProtocolError(f"unexpected reply type {bytes(raw[:16])!r}")
        n = parse_number(rest, "length")
        if n == -1:
            return None
        if n < 0:
            raise ProtocolError(f"length {n}")
        if byte == b"$":
            self._charge(n, f"a bulk of {n} bytes")
            return await self._read(n)
        if depth >= MAX_DEPTH:
            raise ProtocolError(f"arrays nested deeper than {MAX_DEPTH}")
        self._charge(n * ITEM_COST, f"an array of {n}")
        return [await self._read_response(depth=depth + 1) for _ in range(n)]




class _TLSConnection(vconn.Connection):
    """A control connection over TLS with the transport's own context (CA, client
    certificate, verification) and server name, the same ones the RESP transport uses."""

    def __init__(self, *, ssl_context: ssl.SSLContext, server_name: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._ssl_context = ssl_context
        self._server_name = server_name

    def _connection_arguments(self) -> Any:
        kwargs = dict(super()._connection_arguments())
        kwargs["ssl"] = self._ssl_context
        kwargs["server_hostname"] = self._server_name or self.host
        return kwargs


def connection_class(conn_kwargs: dict[str, Any]) -> type[vconn.Connection]:
    return _TLSConnection if "ssl_context" in conn_kwargs else vconn.Connection


class ErrorReply(Exception):
    """The server answered with an error reply; the connection is clean (reply read whole)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Pipelined(list):
    """The replies of a pipelined batch, one per command: never mistaken for one command's
    array reply."""


class Session:
    def __init__(self, raw: vconn.Connection, epoch: int) -> None:
        self.raw = raw
        self.epoch = epoch


# Sends one command on a connection being set up and returns its reply (ErrorReply raised).
Send = Callable[[Sequence[Any]], Awaitable[Any]]
Handshake = Callable[[Send], Awaitable[None]]


class SessionPool:
    def __init__(self, conn_kwargs: dict[str, Any], max_conns: int, handshake: Handshake | None,
                 reply_bound: int = SMALL_REPLY_MAX) -> None:
        """``reply_bound``: the most bytes one reply may hold (a whole value, for the bulk
        path's ``TCP_GET``)."""
        self._kwargs = {**conn_kwargs, "parser_class": functools.partial(_BoundedParser, bound=reply_bound)}
        self._max = max_conns
        self._handshake = handshake
        self._idle: list[Session] = []
        self._busy: set[Session] = set()
        self._sem: asyncio.Semaphore | None = None
        self._closed = False
        self._epoch = 0  # sessions opened before invalidate() are not reused
        self.opened = 0

    @property
    def where(self) -> str:
        return f"{self._kwargs['host']}:{self._kwargs['port']}"

    async def _open(self) -> Session:
        raw = connection_class(self._kwargs)(**self._kwargs)
        epoch = self._epoch

        async def send(args: Sequence[Any]) -> Any:
            await raw.send_command(*args)
            try:
                return await raw.read_response()
            except vexc.ResponseError as exc:
                raise ErrorReply(str(exc)) from None

        try:
            await raw.connect()
            if self._handshake is not None:
                await self._handshake(send)
        except vexc.AuthenticationError as exc:  # WRONGPASS, NOAUTH at connect
            await raw.disconnect()
            raise commands.map_error(str(exc)) from None
        except ErrorReply as exc:
            await raw.disconnect()
            if "unknown command" in exc.message.lower():
                raise FabricUnavailable(f"{self.where} has no {commands.HELLO} (build the module with `lmcache-valkey endpoint build --out DIR` and load DIR/lmcv_blob.so): {exc.message}") from None
            raise commands.map_error(exc.message) from None
        except (vexc.ConnectionError, vexc.TimeoutError, OSError) as exc:
            await raw.disconnect()
            raise ConnectionLost(f"cannot connect to {self.where}: {exc}") from exc
        except BaseException:
            await raw.disconnect()
            raise
        self.opened += 1
        return Session(raw, epoch)

    async def acquire(self, deadline: float) -> Session:
        if self._closed:
            raise TransportError("transport is closed")
        if self._sem is None:
            self._sem = asyncio.Semaphore(self._max)
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(self._sem.acquire(), max(0.0, deadline - loop.time()))
        except asyncio.TimeoutError:
            raise DeadlineExceeded("no connection became free before the deadline") from None
        while self._idle:
            s = self._idle.pop()
            reader = getattr(s.raw, "_reader", None)
            if (reader is not None and (reader.at_eof() or not s.raw._socket_is_empty())) or s.epoch != self._epoch:
                # closed by the server while idle; bytes nobody asked for (the stream is out of
                # step with the requests: they would answer the next one); set up for old registrations
                await _close_raw(s)
                continue
            self._busy.add(s)
            return s
        try:
            s = await asyncio.wait_for(self._open(), max(0.001, deadline - loop.time()))
            self._busy.add(s)
            return s
        except asyncio.TimeoutError:
            self._sem.release()
            raise DeadlineExceeded("connecting took past the deadline") from None
        except BaseException:
            self._sem.release()
            raise

    def release(self, s: Session) -> None:
        assert self._sem is not None
        self._sem.release()
        self._busy.discard(s)
        if self._closed or s.epoch != self._epoch:  # close it rather than pool it
            asyncio.ensure_future(_close_raw(s))
            return
        self._idle.append(s)

    async def drop(self, s: Session) -> None:
        assert self._sem is not None
        self._sem.release()
        self._busy.discard(s)
        await _close_raw(s)

    def invalidate(self) -> None:
        """Sessions opened so far are not handed out again (new ones run the handshake
        anew, e.g. to declare memory registered since)."""
        self._epoch += 1

    async def exchange(self, s: Session, args: Sequence[Any], wait_s: float) -> Any:
        """Sends one command and reads its reply (at most ``wait_s``). Raises ErrorReply for
        an error reply; ConnectionLost / DeadlineExceeded / TransportError otherwise."""
        async def send_and_read() -> Any:
            await s.raw.send_command(*args)
            try:
                return await s.raw.read_response()
            except vexc.ResponseError as exc:
                raise ErrorReply(str(exc)) from None

        return await self._bounded(send_and_read(), wait_s, f" during {args[0]}")

    async def pipeline(self, s: Session, cmds: Sequence[Sequence[Any]], wait_s: float) -> Pipelined:
        """Several plain commands in one round trip; error replies become ErrorReply values."""
        async def send_and_read() -> Pipelined:
            await s.raw.send_packed_command(s.raw.pack_commands(cmds))
            out = Pipelined()
            for _ in cmds:
                try:
                    out.append(await s.raw.read_response())
                except vexc.ResponseError as exc:
                    out.append(ErrorReply(str(exc)))
            return out

        return await self._bounded(send_and_read(), wait_s, "")

    async def _bounded(self, io: Awaitable[Any], wait_s: float, during: str) -> Any:
        """``io`` within ``wait_s`` (the send too: a stalled peer must not hold the slot
        forever), valkey-py's errors mapped to ours."""
        try:
            return await asyncio.wait_for(io, wait_s)
        except asyncio.TimeoutError:
            raise DeadlineExceeded(f"no reply{during} from {self.where} in {wait_s:.3f}s") from None
        except (vexc.ConnectionError, vexc.TimeoutError, OSError) as exc:
            raise ConnectionLost(f"connection to {self.where} lost{during}: {exc}") from exc
        except vexc.ValkeyError as exc:
            raise TransportError(str(exc)) from exc

    async def close(self, *, abort: bool = False) -> None:
        """Closes idle connections; ``abort`` closes those in use too, so that commands
        waiting on them end at once (with ConnectionLost)."""
        self._closed = True
        idle, self._idle = self._idle, []
        if abort:
            idle += list(self._busy)
        for s in idle:
            await _close_raw(s)


async def _close_raw(s: Session) -> None:
    try:
        await s.raw.disconnect(nowait=True)
    except Exception:
        pass
