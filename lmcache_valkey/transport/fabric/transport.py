"""FabricTransport: GET/SET of values between Valkey (the BLOB.* endpoint) and buffers
registered with libfabric, with the server doing the RMA.

Ownership rule (docs/fabric-buffer-ownership.md): a buffer handed to ``get_into`` or
``set_from`` stays referenced by this transport until the server's transfer is known to be
over -- its reply arrived, or its deadline plus a grace period passed after the connection
broke -- even when the caller's await was cancelled or timed out. If the server reports
that operations were still in flight at its deadline, the buffers are quarantined
(referenced until ``close()``, which deregisters the memory first) and counted.

Control traffic uses valkey-py's asyncio ``Connection``; valkey-py is imported here and in
no other module of this package, and its errors are mapped here.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
from collections.abc import Iterable, Sequence
from typing import Any

import valkey.asyncio.connection as vconn
import valkey.exceptions as vexc

from lmcache_valkey.errors import (
    ConnectionLost,
    CorruptChunk,
    DeadlineExceeded,
    FabricUnavailable,
    LmcacheValkeyError,
    ServerError,
    TransportError,
)

from . import commands
from .endpoint import FabricEndpoint, MemoryRegion
from .errors import ServerDeadline, TransferFailed, UnregisteredBuffer, WindowTooSmall

log = logging.getLogger(__name__)

DATA_PATHS = ("rma", "bulk")


class _Conn:
    """One control connection; in RMA mode it carries a fabric session (HELLO done)."""

    def __init__(self, raw: vconn.Connection) -> None:
        self.raw = raw


class FabricTransport:
    """Async GET/SET of values into/out of registered buffers through a BLOB.* endpoint.

    ``data_path="rma"``: the server moves the bytes with fi_write/fi_read into/out of the
    buffers (which must lie inside regions registered with ``register``).
    ``data_path="bulk"``: the same calls over the module's bulk (TCP) mode; no libfabric
    is needed. Valkey serves one blocked command per connection at a time, so concurrency
    comes from ``connections`` parallel connections, each with its own HELLO.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 6379,
        *,
        data_path: str = "rma",
        provider: str = "tcp;ofi_rxm",
        bind_addr: str | None = "127.0.0.1",
        connections: int = 4,
        username: str | None = None,
        password: str | None = None,
        db: int = 0,
        connect_timeout: float = 5.0,
        verify_crc: bool = False,
        drain_grace_s: float = 2.0,
        hmem: bool = False,
        endpoint: FabricEndpoint | None = None,
    ) -> None:
        if data_path not in DATA_PATHS:
            raise ValueError(f"data_path must be one of {DATA_PATHS}, got {data_path!r}")
        if connections < 1:
            raise ValueError("connections must be >= 1")
        self.data_path = data_path
        self._conn_kwargs = dict(
            host=host, port=port, db=db, username=username, password=password,
            socket_connect_timeout=connect_timeout, socket_timeout=None, lib_name=None, lib_version=None,
        )
        self._max_conns = connections
        self._verify_crc = verify_crc
        self._grace = drain_grace_s
        self._owns_endpoint = endpoint is None
        self.endpoint: FabricEndpoint | None = None
        if data_path == "rma":
            self.endpoint = endpoint or FabricEndpoint(provider, bind_addr, hmem=hmem)
        self._idle: list[_Conn] = []
        self._sem: asyncio.Semaphore | None = None
        self._tasks: set[asyncio.Task] = set()
        self._held: dict[int, Any] = {}
        self._held_ids = itertools.count()
        self._quarantine: list[Any] = []
        self._closed = False
        self.stats = {"quarantined": 0, "held_after_disconnect": 0, "partial_retries": 0, "connections": 0}

    # -- registration ---------------------------------------------------------------------

    def register(self, addr: int, length: int, *, cuda_device: int | None = None) -> MemoryRegion:
        """Registers [addr, addr+length) once (LMCache's whole arena); returns rkey/desc."""
        return self._ep().register(addr, length, cuda_device=cuda_device)

    def register_buffer(self, buf: Any) -> MemoryRegion:
        return self._ep().register_buffer(buf)

    def _ep(self) -> FabricEndpoint:
        if self.endpoint is None:
            raise FabricUnavailable("this FabricTransport uses the bulk data path; registration needs data_path='rma'")
        return self.endpoint

    def _triples(self, bufs: Sequence[Any], writable: bool) -> tuple[list[commands.Triple], list[Any], list[memoryview]]:
        ep = self._ep()
        triples, keep, views = [], [], []
        for b in bufs:
            mv = memoryview(b).cast("B") if not isinstance(b, memoryview) or b.format != "B" or b.ndim != 1 else b
            if len(mv) == 0:
                continue
            if writable and mv.readonly:
                raise UnregisteredBuffer("get_into needs writable buffers")
            addr, n = ep.address_of(mv)
            region = ep.find_region(addr, n)
            if region is None:
                raise UnregisteredBuffer(
                    f"buffer at {addr:#x} (+{n}) lies outside every registered region; register the arena first"
                )
            triples.append((region.key, region.remote_addr(addr), n))
            keep.append(mv)
            views.append(mv)
        if len(triples) > commands.MAX_TRIPLES:
            raise ValueError(f"at most {commands.MAX_TRIPLES} buffers per operation")
        return triples, keep, views

    # -- connections ----------------------------------------------------------------------

    async def connect(self) -> None:
        """Opens one connection (with HELLO in RMA mode): a cheap probe for ``auto``."""
        conn = await self._acquire(asyncio.get_running_loop().time() + float(self._conn_kwargs["socket_connect_timeout"]))
        self._release(conn)

    async def _new_conn(self) -> _Conn:
        raw = vconn.Connection(**self._conn_kwargs)
        try:
            await raw.connect()
            if self.endpoint is not None:
                await raw.send_command(*commands.hello(self.endpoint.name))
                reply = await raw.read_response()
                for name in reply or []:
                    # Lets the provider reach the server too (EFA, shm); harmless for tcp.
                    self.endpoint.add_peer(bytes.fromhex(name.decode() if isinstance(name, bytes) else name))
        except vexc.ResponseError as exc:
            await raw.disconnect()
            msg = str(exc)
            if "unknown command" in msg.lower():
                raise FabricUnavailable(f"server has no {commands.HELLO} (load endpoint/build/lmcv_blob.so): {msg}") from exc
            raise commands.map_error(msg) from exc
        except (vexc.ConnectionError, vexc.TimeoutError, OSError) as exc:
            await raw.disconnect()
            raise ConnectionLost(f"cannot connect to {self._conn_kwargs['host']}:{self._conn_kwargs['port']}: {exc}") from exc
        except BaseException:
            await raw.disconnect()
            raise
        self.stats["connections"] += 1
        return _Conn(raw)

    async def _acquire(self, deadline: float) -> _Conn:
        if self._closed:
            raise TransportError("transport is closed")
        if self._sem is None:
            self._sem = asyncio.Semaphore(self._max_conns)
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(self._sem.acquire(), max(0.0, deadline - loop.time()))
        except asyncio.TimeoutError:
            raise DeadlineExceeded("no connection became free before the deadline") from None
        while self._idle:
            conn = self._idle.pop()
            reader = getattr(conn.raw, "_reader", None)
            if reader is not None and reader.at_eof():
                # The server closed it while idle (restart): don't hand out a dead session.
                await self._close_raw(conn)
                continue
            return conn
        try:
            return await asyncio.wait_for(self._new_conn(), max(0.001, deadline - loop.time()))
        except asyncio.TimeoutError:
            self._sem.release()
            raise DeadlineExceeded("connecting took past the deadline") from None
        except BaseException:
            self._sem.release()
            raise

    def _release(self, conn: _Conn) -> None:
        self._idle.append(conn)
        assert self._sem is not None
        self._sem.release()

    async def _drop(self, conn: _Conn) -> None:
        # Never pool a connection that saw an error or cancellation mid-reply.
        assert self._sem is not None
        self._sem.release()
        await self._close_raw(conn)

    @staticmethod
    async def _close_raw(conn: _Conn) -> None:
        try:
            await conn.raw.disconnect(nowait=True)
        except Exception:
            pass

    def _hold(self, keep: Any, seconds: float) -> None:
        """Keeps buffers referenced for ``seconds`` (server deadline + grace)."""
        hid = next(self._held_ids)
        self._held[hid] = keep
        self.stats["held_after_disconnect"] += 1
        asyncio.get_running_loop().call_later(seconds, self._held.pop, hid, None)

    # -- one operation --------------------------------------------------------------------

    async def _op(self, args_for: Any, keep: Any, deadline: float) -> Any:
        """Runs one command on a pooled connection. ``args_for(timeout_ms)`` builds it.
        Runs as its own task so that a cancelled caller never cuts it short."""
        loop = asyncio.get_running_loop()
        conn = await self._acquire(deadline)
        server_ms = max(1, math.ceil((deadline - loop.time()) * 1000))
        try:
            await conn.raw.send_command(*args_for(server_ms))
            # Backstop: the server answers by its deadline; past deadline+grace it is gone.
            reply = await asyncio.wait_for(conn.raw.read_response(), server_ms / 1000 + self._grace)
        except vexc.ResponseError as exc:
            err = commands.map_error(str(exc))
            if isinstance(err, TransferFailed):
                # The provider may have torn down its link to us (tcp closes it on a bad
                # key): start a fresh session on a new connection rather than reuse this one.
                await self._drop(conn)
            else:
                self._release(conn)  # the error reply was read whole: the connection is clean
            if isinstance(err, ServerDeadline) and err.inflight:
                self._quarantine.append(keep)
                self.stats["quarantined"] += 1
            raise err from None
        except BaseException as exc:
            await self._drop(conn)
            # The server may still be moving bytes for this command until its deadline.
            if keep is not None:
                self._hold(keep, server_ms / 1000 + self._grace)
            if isinstance(exc, asyncio.TimeoutError):
                raise DeadlineExceeded("no reply from the server before deadline + grace") from None
            if isinstance(exc, (vexc.ConnectionError, vexc.TimeoutError, OSError)):
                raise ConnectionLost(f"connection lost during {args_for(0)[0]}: {exc}") from exc
            if isinstance(exc, vexc.ValkeyError):
                raise TransportError(str(exc)) from exc
            raise
        self._release(conn)
        return reply

    async def _call(self, args_for: Any, keep: Any, timeout: float) -> Any:
        if timeout <= 0:
            raise DeadlineExceeded("timeout must be positive")
        loop = asyncio.get_running_loop()
        task = loop.create_task(self._op(args_for, keep, loop.time() + timeout))
        self._tasks.add(task)
        task.add_done_callback(_forget_task(self._tasks))
        try:
            return await asyncio.wait_for(asyncio.shield(task), timeout)
        except asyncio.TimeoutError:
            raise DeadlineExceeded(f"{args_for(0)[0]} did not finish within {timeout:.3f}s") from None

    # -- public API -----------------------------------------------------------------------

    async def get_into(self, key: bytes, bufs: list[memoryview], timeout: float, *, allow_partial: bool = True) -> int | None:
        """Scatter-reads the value of ``key`` into ``bufs`` in order. Returns the stored
        value's full length, or None when the key is absent; bytes beyond the buffers'
        capacity are dropped (``allow_partial=False`` raises WindowTooSmall instead)."""
        if self.data_path == "bulk":
            return await self._get_bulk(key, bufs, timeout)
        triples, keep, views = self._triples(bufs, writable=True)
        if not triples:
            info = await self.info(key, timeout)
            return None if info is None else info[0]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            reply = await self._call(lambda ms: commands.get_rma(key, triples, ms, False), keep, timeout)
        except WindowTooSmall:
            if not allow_partial:
                raise
            # Our endpoint's PARTIAL extension: fill the window, report the full length.
            self.stats["partial_retries"] += 1
            reply = await self._call(lambda ms: commands.get_rma(key, triples, ms, True), keep, deadline - loop.time())
        parsed = commands.parse_get_reply(reply)
        if parsed is None:
            return None
        obj_len, crc = parsed
        if self._verify_crc and obj_len <= sum(t[2] for t in triples):
            self._check_crc(views, obj_len, crc, key)
        return obj_len

    async def set_from(self, key: bytes, parts: list[memoryview], ttl_s: float | None, timeout: float) -> None:
        """Stores the concatenation of ``parts`` under ``key`` (server reads them by RMA)."""
        ttl_ms = max(1, math.ceil(ttl_s * 1000)) if ttl_s else None
        if self.data_path == "bulk":
            value = b"".join(bytes(memoryview(p).cast("B")) for p in parts)
            reply = await self._call(lambda ms: commands.set_bulk(key, value, ttl_ms), None, timeout)
        else:
            triples, keep, _ = self._triples(parts, writable=False)
            total = sum(t[2] for t in triples)
            if not triples:
                reply = await self._call(lambda ms: commands.set_bulk(key, b"", ttl_ms), None, timeout)
            else:
                reply = await self._call(lambda ms: commands.set_rma(key, total, triples, ttl_ms, ms), keep, timeout)
        if reply not in (b"OK", "OK", True):
            raise ServerError(f"unexpected {commands.SET} reply: {reply!r}")

    async def delete(self, keys: Iterable[bytes], timeout: float = 5.0) -> int:
        keys = list(keys)
        if not keys:
            return 0
        return int(await self._call(lambda ms: [commands.DEL, *keys], None, timeout))

    async def info(self, key: bytes, timeout: float = 5.0) -> tuple[int, int] | None:
        """(length, crc32c) of a stored value, or None."""
        reply = await self._call(lambda ms: [commands.INFO, key], None, timeout)
        if reply is None:
            return None
        fields = dict(zip(reply[0::2], reply[1::2]))
        return int(fields[b"length"]), int(fields[b"crc32c"])

    async def command(self, *args: Any, timeout: float = 5.0) -> Any:
        """Sends one raw command on a pooled connection that carries a fabric session
        (diagnostics and dialect tests); error replies raise the mapped exception."""
        return await self._call(lambda ms: list(args), None, timeout)

    @property
    def pending_ops(self) -> int:
        """Operations whose buffers this transport still holds (running, waiting out a
        server deadline after a broken connection, or quarantined)."""
        return len(self._tasks) + len(self._held) + len(self._quarantine)

    async def _get_bulk(self, key: bytes, bufs: list[memoryview], timeout: float) -> int | None:
        value = await self._call(lambda ms: commands.get_bulk(key), None, timeout)
        if value is None:
            return None
        off = 0
        for b in bufs:
            mv = memoryview(b).cast("B")
            n = min(len(mv), len(value) - off)
            if n <= 0:
                break
            mv[:n] = value[off : off + n]
            off += n
        return len(value)

    def _check_crc(self, views: list[memoryview], obj_len: int, crc: int, key: bytes) -> None:
        if self._ep().crc32c(views, obj_len) != crc:
            raise CorruptChunk("crc", f"RMA GET of {key!r}: bytes in the buffers do not match the server's crc32c")

    async def close(self) -> None:
        """Cancels running commands, closes connections, then deregisters memory and closes
        the fabric endpoint; only then are held/quarantined buffers let go."""
        if self._closed:
            return
        self._closed = True
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        idle, self._idle = self._idle, []
        for c in idle:
            try:
                await c.raw.disconnect()
            except Exception:
                pass
        if self.endpoint is not None and self._owns_endpoint:
            # Blocking join of the progress thread (<= one wait period): off the loop.
            await asyncio.get_running_loop().run_in_executor(None, self.endpoint.close)
        self._held.clear()
        self._quarantine.clear()

    async def __aenter__(self) -> "FabricTransport":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _forget_task(tasks: set[asyncio.Task]) -> Any:
    def done(task: asyncio.Task) -> None:
        tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: an orphaned op's error is not "never retrieved"

    return done


__all__ = ["FabricTransport", "DATA_PATHS"]
