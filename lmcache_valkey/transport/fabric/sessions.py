"""Control connections to the endpoint, each carrying one fabric session (HELLO sent once
when it opens). valkey-py is imported here and nowhere else in this package; its errors
are mapped here.

Valkey serves one blocked command per connection at a time, so the pool hands each
operation a connection of its own. A connection that saw an error or cancellation in the
middle of a reply is dropped, never pooled; one the server closed while idle (restart) is
discarded on the way out of the pool. Knows nothing of buffers or RMA.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import valkey._parsers.base as vparsers
import valkey.asyncio.connection as vconn
import valkey.exceptions as vexc

from lmcache_valkey.errors import ConnectionLost, DeadlineExceeded, FabricUnavailable, TransportError

from . import commands


# valkey-py strips the code from error replies it maps to its own classes (NOPERM ->
# NoPermissionError, "No permissions to access a key"); put the code back so our table
# (lmcache_valkey.errors) classifies the reply as the server sent it.
_CODES: dict[type, str] = {
    cls: code for code, cls in vparsers.BaseParser.EXCEPTION_CLASSES.items() if isinstance(cls, type)
}


def _reply_text(exc: vexc.ResponseError) -> str:
    code = _CODES.get(type(exc))
    text = str(exc)
    return f"{code} {text}" if code and not text.startswith(code) else text


class ErrorReply(Exception):
    """The server answered with an error reply; the connection is clean (reply read whole)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Session:
    def __init__(self, raw: vconn.Connection) -> None:
        self.raw = raw


class SessionPool:
    def __init__(self, conn_kwargs: dict[str, Any], max_conns: int, hello_name: bytes | None,
                 add_peer: Callable[[bytes], Any] | None) -> None:
        self._kwargs = conn_kwargs
        self._max = max_conns
        self._hello_name = hello_name
        self._add_peer = add_peer
        self._idle: list[Session] = []
        self._sem: asyncio.Semaphore | None = None
        self._closed = False
        self.opened = 0

    @property
    def where(self) -> str:
        return f"{self._kwargs['host']}:{self._kwargs['port']}"

    async def _open(self) -> Session:
        raw = vconn.Connection(**self._kwargs)
        try:
            await raw.connect()
            if self._hello_name is not None:
                await raw.send_command(*commands.hello(self._hello_name))
                reply = await raw.read_response()
                for name in reply or []:
                    # Lets the provider reach the server too (EFA, shm); harmless for tcp.
                    assert self._add_peer is not None
                    self._add_peer(bytes.fromhex(name.decode() if isinstance(name, bytes) else name))
        except vexc.ResponseError as exc:
            await raw.disconnect()
            msg = _reply_text(exc)
            if "unknown command" in msg.lower():
                raise FabricUnavailable(f"{self.where} has no {commands.HELLO} (load endpoint/build/lmcv_blob.so): {msg}") from exc
            raise commands.map_error(msg) from exc
        except (vexc.ConnectionError, vexc.TimeoutError, OSError) as exc:
            await raw.disconnect()
            raise ConnectionLost(f"cannot connect to {self.where}: {exc}") from exc
        except BaseException:
            await raw.disconnect()
            raise
        self.opened += 1
        return Session(raw)

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
            if reader is not None and reader.at_eof():
                await _close_raw(s)  # closed by the server while idle
                continue
            return s
        try:
            return await asyncio.wait_for(self._open(), max(0.001, deadline - loop.time()))
        except asyncio.TimeoutError:
            self._sem.release()
            raise DeadlineExceeded("connecting took past the deadline") from None
        except BaseException:
            self._sem.release()
            raise

    def release(self, s: Session) -> None:
        assert self._sem is not None
        self._sem.release()
        if self._closed:  # released after close(): close it rather than pool it
            asyncio.ensure_future(_close_raw(s))
            return
        self._idle.append(s)

    async def drop(self, s: Session) -> None:
        assert self._sem is not None
        self._sem.release()
        await _close_raw(s)

    async def exchange(self, s: Session, args: Sequence[Any], wait_s: float) -> Any:
        """Sends one command and reads its reply (at most ``wait_s``). Raises ErrorReply for
        an error reply; ConnectionLost / DeadlineExceeded / TransportError otherwise."""
        async def send_and_read() -> Any:
            await s.raw.send_command(*args)
            return await s.raw.read_response()

        try:
            # The send is under the deadline too: a stalled peer must not hold the slot forever.
            return await asyncio.wait_for(send_and_read(), wait_s)
        except vexc.ResponseError as exc:
            raise ErrorReply(_reply_text(exc)) from None
        except asyncio.TimeoutError:
            raise DeadlineExceeded(f"no reply to {args[0]} from {self.where} in {wait_s:.3f}s") from None
        except (vexc.ConnectionError, vexc.TimeoutError, OSError) as exc:
            raise ConnectionLost(f"connection to {self.where} lost during {args[0]}: {exc}") from exc
        except vexc.ValkeyError as exc:
            raise TransportError(str(exc)) from exc

    async def pipeline(self, s: Session, cmds: Sequence[Sequence[Any]], wait_s: float) -> list[Any]:
        """Several plain commands in one round trip; error replies become ErrorReply values."""
        async def read_all() -> list[Any]:
            out = []
            for _ in cmds:
                try:
                    out.append(await s.raw.read_response())
                except vexc.ResponseError as exc:
                    out.append(ErrorReply(_reply_text(exc)))
            return out

        async def send_and_read() -> list[Any]:
            await s.raw.send_packed_command(s.raw.pack_commands(cmds))
            return await read_all()

        try:
            return await asyncio.wait_for(send_and_read(), wait_s)
        except asyncio.TimeoutError:
            raise DeadlineExceeded(f"no reply from {self.where} in {wait_s:.3f}s") from None
        except (vexc.ConnectionError, vexc.TimeoutError, OSError) as exc:
            raise ConnectionLost(f"connection to {self.where} lost: {exc}") from exc
        except vexc.ValkeyError as exc:
            raise TransportError(str(exc)) from exc

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for s in idle:
            await _close_raw(s)


async def _close_raw(s: Session) -> None:
    try:
        await s.raw.disconnect(nowait=True)
    except Exception:
        pass
