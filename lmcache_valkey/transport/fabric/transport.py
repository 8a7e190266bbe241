"""FabricTransport: GET/SET of values between Valkey (the BLOB.* endpoint) and buffers
registered with libfabric, with the server doing the RMA.

Ownership rule (docs/fabric-buffer-ownership.md): a buffer handed to ``get_into`` or
``set_from`` stays referenced by this transport until the server's transfer is known to be
over -- its reply arrived, or its deadline plus a grace period passed after the connection
broke -- even when the caller's await was cancelled or timed out. If the server reports
that operations were still in flight at its deadline, the buffers are quarantined
(referenced until ``close()``, which deregisters the memory first) and counted.

Control connections (and valkey-py) live in ``sessions``; this module decides what to send,
where the bytes move, and when buffers may be let go.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any

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
from .errors import NoFabricSession, ServerDeadline, TransferFailed, UnregisteredBuffer, WindowTooSmall
from .scratch import ScratchPool
from .sessions import ErrorReply, SessionPool

log = logging.getLogger(__name__)

DATA_PATHS = ("rma", "bulk")


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
        scratch_bytes: int = 1 << 20,
        bulk_fallback: bool = True,
        endpoint: FabricEndpoint | None = None,
    ) -> None:
        if data_path not in DATA_PATHS:
            raise ValueError(f"data_path must be one of {DATA_PATHS}, got {data_path!r}")
        if connections < 1:
            raise ValueError("connections must be >= 1")
        self.data_path = data_path
        self._connect_timeout = connect_timeout
        self._verify_crc = verify_crc
        self._grace = drain_grace_s
        self._owns_endpoint = endpoint is None
        self.endpoint: FabricEndpoint | None = None
        self._scratch: ScratchPool | None = None
        self._bulk_fallback = bulk_fallback
        if data_path == "rma":
            self.endpoint = endpoint or FabricEndpoint(provider, bind_addr, hmem=hmem)
            if scratch_bytes > 0:
                try:
                    self._scratch = ScratchPool(self.endpoint, scratch_bytes)
                except BaseException:  # e.g. RLIMIT_MEMLOCK: do not leak the endpoint's thread
                    if self._owns_endpoint:
                        self.endpoint.close()
                    raise
        conn_kwargs = dict(
            host=host, port=port, db=db, username=username, password=password,
            socket_connect_timeout=connect_timeout, socket_timeout=None, lib_name=None, lib_version=None,
        )
        ep = self.endpoint
        self._pool = SessionPool(conn_kwargs, connections, ep.name if ep else None, ep.add_peer if ep else None)
        self._tasks: set[asyncio.Task] = set()
        self._held: dict[int, Any] = {}
        self._held_ids = itertools.count()
        self._quarantine: list[Any] = []
        self._closed = False
        self._stats = {"quarantined": 0, "held_after_disconnect": 0, "partial_retries": 0,
                       "staged": 0, "bulk_fallbacks": 0}

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

    def _plan(self, bufs: Sequence[Any], writable: bool) -> "_Plan":
        """Maps buffers to (rkey, addr, len) triples. Registered buffers are used in place;
        a small unregistered one (the store's header) is staged through a scratch slot;
        anything else raises UnregisteredBuffer, or _NoSlot when scratch is exhausted."""
        ep = self._ep()
        plan = _Plan()
        try:
            for b in bufs:
                mv = _byte_view(b)
                if len(mv) == 0:
                    continue
                if writable and mv.readonly:
                    raise UnregisteredBuffer("get_into needs writable buffers")
                addr, n = ep.address_of(mv)
                region = ep.find_region(addr, n)
                target = mv
                if region is None:
                    slot = self._scratch.take(n) if self._scratch is not None else None
                    if slot is None:
                        if self._scratch is not None and n <= self._scratch.slot_bytes:
                            raise _NoSlot()
                        raise UnregisteredBuffer(
                            f"buffer at {addr:#x} (+{n}) lies outside every registered region; register the arena first"
                        )
                    index, target = slot
                    plan.slots.append(index)
                    plan.staged.append((mv, target))
                    if not writable:
                        target[:] = mv
                    addr, n = ep.address_of(target)
                    region = self._scratch.region
                plan.triples.append((region.key, region.remote_addr(addr), n))
                plan.keep.append(mv)
                plan.targets.append(target)
            if len(plan.triples) > commands.MAX_TRIPLES:
                raise ValueError(f"at most {commands.MAX_TRIPLES} buffers per operation")
        except BaseException:
            self._give_slots(plan)
            raise
        if plan.staged:
            self._stats["staged"] += 1
        return plan

    def _give_slots(self, plan: "_Plan") -> None:
        if self._scratch is not None:
            for index in plan.slots:
                self._scratch.give(index)
        plan.slots = []

    # -- connections ----------------------------------------------------------------------

    async def connect(self) -> None:
        """Opens one connection (with HELLO in RMA mode): a cheap probe for ``auto``."""
        session = await self._pool.acquire(asyncio.get_running_loop().time() + self._connect_timeout)
        self._pool.release(session)

    def _hold(self, keep: Any, seconds: float, over: Any = None) -> None:
        """Keeps buffers referenced for ``seconds`` (server deadline + grace)."""
        hid = next(self._held_ids)
        self._held[hid] = keep
        self._stats["held_after_disconnect"] += 1

        def let_go() -> None:
            self._held.pop(hid, None)
            if over and not self._closed:
                over()

        asyncio.get_running_loop().call_later(seconds, let_go)

    # -- one operation --------------------------------------------------------------------

    async def _op(self, args_for: Any, keep: Any, deadline: float, after: Any = None, over: Any = None) -> Any:
        """Runs one command on a pooled connection. ``args_for(timeout_ms)`` builds it.
        Runs as its own task so that a cancelled caller never cuts it short.

        ``after(reply)`` runs in this task once a reply arrived (copy-out of staged
        bytes); ``over()`` runs when the buffers in ``keep`` may be reused: at once after
        a reply, after the server's deadline plus grace when the connection broke, never
        for a quarantined transfer."""
        loop = asyncio.get_running_loop()
        try:
            session = await self._pool.acquire(deadline)
        except BaseException:
            if over:
                over()  # nothing was sent
            raise
        server_ms = max(1, math.ceil((deadline - loop.time()) * 1000))
        # Backstop: the server answers by its deadline; past deadline+grace it is gone.
        wait_s = server_ms / 1000 + self._grace
        try:
            args = args_for(server_ms)
            if args and args[0] is _PIPELINE:  # several plain commands, one round trip
                reply = await self._pool.pipeline(session, args[1], wait_s)
            else:
                reply = await self._pool.exchange(session, args, wait_s)
        except ErrorReply as exc:
            err = commands.map_error(exc.message)
            if isinstance(err, TransferFailed):
                # The provider may have torn down its link to us (tcp closes it on a bad
                # key): start a fresh session on a new connection rather than reuse this one.
                await self._pool.drop(session)
            else:
                self._pool.release(session)  # the error reply was read whole: clean
            if isinstance(err, ServerDeadline) and err.inflight:
                self._quarantine.append(keep)
                self._stats["quarantined"] += 1
            elif over:
                over()
            raise err from None
        except BaseException:
            await self._pool.drop(session)
            # The server may still be moving bytes for this command until its deadline.
            if keep is not None or over is not None:
                self._hold(keep, wait_s, over)
            raise
        self._pool.release(session)
        try:
            return after(reply) if after else reply
        finally:
            if over:
                over()

    async def _call(self, args_for: Any, keep: Any, timeout: float, after: Any = None, over: Any = None) -> Any:
        if self._closed:  # an op started during close() would outlive the endpoint it uses
            if over:
                over()
            raise ConnectionLost("the fabric transport is closed")
        if timeout <= 0:
            if over:
                over()
            raise DeadlineExceeded("timeout must be positive")
        loop = asyncio.get_running_loop()
        task = loop.create_task(self._op(args_for, keep, loop.time() + timeout, after, over))
        self._tasks.add(task)
        task.add_done_callback(_forget_task(self._tasks))
        try:
            return await asyncio.wait_for(asyncio.shield(task), timeout)
        except asyncio.TimeoutError:
            first = args_for(0)[0]
            what = "pipelined batch" if first is _PIPELINE else first
            raise DeadlineExceeded(f"{what} did not finish within {timeout:.3f}s") from None

    # -- public API -----------------------------------------------------------------------

    async def get_into(self, key: bytes, bufs: list[memoryview], timeout: float, *, allow_partial: bool = True,
                       on_release: Callable[[], None] | None = None) -> int | None:
        """Scatter-reads the value of ``key`` into ``bufs`` in order. Returns the stored
        value's full length, or None when the key is absent; bytes beyond the buffers'
        capacity are dropped (``allow_partial=False`` raises WindowTooSmall instead).
        A fabric failure (or no free scratch slot) falls back to the bulk path within the
        same deadline. ``on_release()`` runs once no transfer can touch ``bufs`` any more
        (right away after a reply; later if the caller was cancelled or timed out; never
        if they were quarantined): the moment to hand a MemoryObj back to its allocator."""
        rel = _Release(on_release)
        try:
            if self.data_path == "bulk":
                return await self._get_bulk(key, bufs, timeout)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            try:
                try:
                    return await self._get_rma(key, bufs, timeout, rel, partial=False)
                except WindowTooSmall:
                    if not allow_partial:
                        raise
                    # Our endpoint's PARTIAL extension: fill the window, report the full length.
                    self._stats["partial_retries"] += 1
                    return await self._get_rma(key, bufs, deadline - loop.time(), rel, partial=True)
            except _NoSlot:
                return await self._fallback_get(key, bufs, deadline, "no free scratch slot")
            except (TransferFailed, NoFabricSession) as exc:
                if self._bulk_fallback and deadline - loop.time() > 0:
                    return await self._fallback_get(key, bufs, deadline, str(exc))
                raise
        finally:
            rel.drop()

    async def _get_rma(self, key: bytes, bufs: Sequence[Any], timeout: float, rel: "_Release", *, partial: bool) -> int | None:
        plan = self._plan(bufs, writable=True)
        if not plan.triples:
            info = await self.info(key, timeout)
            return None if info is None else info[0]
        wanted = [True]  # cleared when the caller stops waiting: no late copy-out then

        def copy_out(reply: Any) -> Any:
            if reply is not None and wanted[0]:
                for user, staged in plan.staged:
                    user[:] = staged
            return reply

        def over() -> None:
            self._give_slots(plan)
            rel.drop()

        rel.hold()
        try:
            reply = await self._call(lambda ms: commands.get_rma(key, plan.triples, ms, partial), plan.keep, timeout,
                                     after=copy_out, over=over)
        except BaseException:
            wanted[0] = False
            raise
        parsed = commands.parse_get_reply(reply)
        if parsed is None:
            return None
        obj_len, crc = parsed
        if self._verify_crc and obj_len <= sum(t[2] for t in plan.triples):
            self._check_crc(plan.keep, obj_len, crc, key)
        return obj_len

    async def set_from(self, key: bytes, parts: list[memoryview], ttl_s: float | None, timeout: float, *,
                       on_release: Callable[[], None] | None = None) -> None:
        """Stores the concatenation of ``parts`` under ``key`` (server reads them by RMA).
        A fabric failure falls back to the bulk path within the same deadline.
        ``on_release()``: as for ``get_into`` (the server may read ``parts`` until then)."""
        rel = _Release(on_release)
        try:
            await self._set_from(key, parts, ttl_s, timeout, rel)
        finally:
            rel.drop()

    async def _set_from(self, key: bytes, parts: Sequence[Any], ttl_s: float | None, timeout: float,
                        rel: "_Release") -> None:
        ttl_ms = max(1, math.ceil(ttl_s * 1000)) if ttl_s else None
        if self.data_path == "bulk":
            return await self._set_bulk(key, parts, ttl_ms, timeout)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            plan = self._plan(parts, writable=False)
        except _NoSlot:
            self._stats["bulk_fallbacks"] += 1
            return await self._set_bulk(key, parts, ttl_ms, timeout)
        total = sum(t[2] for t in plan.triples)
        try:
            if not plan.triples:
                self._give_slots(plan)
                reply = await self._call(lambda ms: commands.set_bulk(key, b"", ttl_ms), None, timeout)
            else:
                def over() -> None:
                    self._give_slots(plan)
                    rel.drop()

                rel.hold()
                reply = await self._call(lambda ms: commands.set_rma(key, total, plan.triples, ttl_ms, ms), plan.keep,
                                         timeout, over=over)
        except (TransferFailed, NoFabricSession) as exc:
            left = deadline - loop.time()
            if not (self._bulk_fallback and left > 0):
                raise
            log.info("fabric SET of %r failed (%s): bulk fallback", key, exc)
            self._stats["bulk_fallbacks"] += 1
            return await self._set_bulk(key, parts, ttl_ms, left)
        _expect_ok(reply)

    async def _fallback_get(self, key: bytes, bufs: Sequence[Any], deadline: float, why: str) -> int | None:
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            raise DeadlineExceeded(f"no time left for a bulk fallback ({why})")
        log.info("fabric GET of %r not possible (%s): bulk fallback", key, why)
        self._stats["bulk_fallbacks"] += 1
        return await self._get_bulk(key, bufs, left)

    async def _set_bulk(self, key: bytes, parts: Sequence[Any], ttl_ms: int | None, timeout: float) -> None:
        value = b"".join(bytes(_byte_view(p)) for p in parts)
        _expect_ok(await self._call(lambda ms: commands.set_bulk(key, value, ttl_ms), None, timeout))

    # -- the store's ChunkTransport protocol ------------------------------------------------

    # The store may pass per-item ``on_release`` callbacks: with RMA the server writes,
    # so a destination is reusable only when its callback ran, not when the call returned.
    supports_release_callbacks = True

    async def get_many_into(
        self, items: Sequence[tuple[bytes, Sequence[memoryview]]], *, timeout: float,
        on_release: Sequence[Callable[[], None]] | None = None,
    ) -> list[int | None | TransportError]:
        """Concurrent ``get_into`` striped over the connections; per-item errors as values."""
        rel = list(on_release) if on_release is not None else [None] * len(items)
        got = await asyncio.gather(
            *(self.get_into(k, b, timeout, on_release=r) for (k, b), r in zip(items, rel)), return_exceptions=True
        )
        return [_as_result(g) for g in got]

    async def set_many(
        self, items: Sequence[tuple[bytes, Sequence[Any]]], *, ttl_s: float | None, timeout: float
    ) -> list[TransportError | None]:
        got = await asyncio.gather(*(self.set_from(k, list(p), ttl_s, timeout) for k, p in items), return_exceptions=True)
        return [_as_result(g) for g in got]

    async def exists_many(self, keys: Sequence[bytes], *, timeout: float) -> list[bool]:
        """One pipelined round trip on one connection (EXISTS per key keeps the order)."""
        if not keys:
            return []
        cmds = [("EXISTS", k) for k in keys]
        replies = await self._call(lambda ms: (_PIPELINE, cmds), None, timeout)
        for r in replies:
            if isinstance(r, ErrorReply):
                raise commands.map_error(r.message)
        return [bool(r) for r in replies]

    async def scan_iter(self, match: bytes, count: int = 1000) -> AsyncIterator[bytes]:
        cursor = b"0"
        while True:
            cursor, keys = await self.command("SCAN", cursor, "MATCH", match, "COUNT", count)
            for k in keys:
                yield k
            if cursor in (b"0", 0, "0"):
                return

    async def ping(self, *, timeout: float) -> None:
        await self.command("PING", timeout=timeout)

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
    def stats(self) -> dict[str, int]:
        """Counters: quarantined, held_after_disconnect, partial_retries, staged,
        bulk_fallbacks, connections (opened so far, each with its own HELLO)."""
        return {**self._stats, "connections": self._pool.opened}

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
            mv = _byte_view(b)
            n = min(len(mv), len(value) - off)
            if n <= 0:
                break
            mv[:n] = value[off : off + n]
            off += n
        return len(value)

    def _check_crc(self, views: list[memoryview], obj_len: int, crc: int, key: bytes) -> None:
        # Staged buffers were copied out already, so the user's views hold the bytes.
        if self._ep().crc32c(views, obj_len) != crc:
            raise CorruptChunk("crc", f"RMA GET of {key!r}: bytes in the buffers do not match the server's crc32c")

    async def close(self) -> None:
        """Cancels running commands, closes connections, then deregisters memory and closes
        the fabric endpoint; only then are held/quarantined buffers let go."""
        if self._closed:
            return
        self._closed = True  # refuse new ops; running ones are cancelled below
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await self._pool.close()
        if self.endpoint is not None and self._owns_endpoint:
            # Blocking join of the progress thread (<= one wait period): off the loop.
            await asyncio.get_running_loop().run_in_executor(None, self.endpoint.close)
        self._held.clear()
        self._quarantine.clear()

    async def __aenter__(self) -> "FabricTransport":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class _Release:
    """Calls ``cb`` once every holder let go: the public call itself (one hold) plus each
    transfer attempt, whose hold ends with the transport's ``over`` hook."""

    __slots__ = ("_cb", "_n")

    def __init__(self, cb: Callable[[], None] | None) -> None:
        self._cb = cb
        self._n = 1

    def hold(self) -> None:
        self._n += 1

    def drop(self) -> None:
        self._n -= 1
        if self._n == 0 and self._cb is not None:
            cb, self._cb = self._cb, None
            try:
                cb()
            except Exception:
                log.exception("on_release callback failed")


class _NoSlot(Exception):
    """No scratch slot free for a small unregistered buffer: use the bulk path."""


class _Plan:
    __slots__ = ("triples", "keep", "targets", "staged", "slots")

    def __init__(self) -> None:
        self.triples: list[commands.Triple] = []
        self.keep: list[memoryview] = []  # the caller's views, referenced until the transfer is over
        self.targets: list[memoryview] = []  # where the bytes really move (view or scratch slot)
        self.staged: list[tuple[memoryview, memoryview]] = []  # (caller's view, scratch slot)
        self.slots: list[int] = []


def _byte_view(b: Any) -> memoryview:
    mv = b if isinstance(b, memoryview) else memoryview(b)
    return mv if (mv.format == "B" and mv.ndim == 1) else mv.cast("B")


def _expect_ok(reply: Any) -> None:
    if reply not in (b"OK", "OK", True):
        raise ServerError(f"unexpected {commands.SET} reply: {reply!r}")


def _as_result(value: Any) -> Any:
    if isinstance(value, BaseException) and not isinstance(value, LmcacheValkeyError):
        if isinstance(value, asyncio.CancelledError):
            raise value
        return TransportError(f"{type(value).__name__}: {value}")
    return value


_PIPELINE = object()  # marks a pipelined batch of plain commands in ``_op``


def _forget_task(tasks: set[asyncio.Task]) -> Any:
    def done(task: asyncio.Task) -> None:
        tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: an orphaned op's error is not "never retrieved"

    return done


__all__ = ["FabricTransport", "DATA_PATHS"]
