"""FabricTransport: GET/SET of values between Valkey (the BLOB.* endpoint) and buffers
registered with libfabric, with the server doing the RMA.

Ownership rule (docs/fabric-buffer-ownership.md): a buffer handed to ``get_into`` or
``set_from`` stays referenced by this transport until no transfer can touch it any more:
the server's reply arrived (it answers once its operations drained), or -- when that cannot
be confirmed (connection broken, no reply by the deadline plus a grace period, a TIMEOUT
reporting operations still in flight) -- once the link the transfer used is revoked: its
connections and its endpoint closed, so that no write a paused or lagging server still has
queued can land. The next operations use a fresh link (new address, new keys).

Control connections (and valkey-py) live in ``sessions``; endpoints, registrations and the
handshake in ``link``; this module decides what to send, where the bytes move, and when
buffers may be let go.
"""

from __future__ import annotations

import asyncio
import logging
import math
import ssl
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any

from lmcache_valkey import codec, metrics
from lmcache_valkey.codec import clip_parts, crc32c_parts, scatter
from lmcache_valkey.errors import (
    ConnectionLost,
    CorruptChunk,
    DeadlineExceeded,
    FabricUnavailable,
    LmcacheValkeyError,
    OutOfMemory,
    ProtocolError,
    TransportError,
)

from .. import read_window
from ..resp.parser import SimpleString, describe
from ..scan import scan_walk
from . import commands
from .dma import DMA
from .endpoint import FabricEndpoint, MemoryRegion
from .errors import NoFabricSession, OutsideRegions, ServerDeadline, TransferFailed, WindowTooSmall
from .link import EndpointSpec, FabricLink, NoSlot, Range, byte_view, has_raw_spans
from .sessions import ErrorReply, Pipelined, SessionPool

log = logging.getLogger(__name__)

DATA_PATHS = ("rma", "bulk")
# The most bytes one reply may hold (docs/resp-reply-bounds.md): the default largest chunk
# with its header, plus room for the rest; ``open_fabric_transport`` sizes it from the settings.
DEFAULT_MAX_REPLY_BYTES = (256 << 20) + (1 << 20) + (1 << 20)
_CONTROL_TIMEOUT_S = 5.0  # one control command (SCAN step, diagnostics) without a caller's deadline

# ``_op``'s callbacks. ``ArgsFor(ms)``: the command, given the milliseconds the server may
# take (or ``(_PIPELINE, [cmd, ...])``: plain commands in one round trip); ``After(reply)``:
# runs in the op's task once the reply arrived (copy-out of staged bytes), its result is the
# op's; ``Over()``: the buffers the op keeps (``keep``) may be reused.
ArgsFor = Callable[[int], Sequence[Any]]
After = Callable[[Any], Any]
Over = Callable[[], None]


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
        ssl_context: ssl.SSLContext | None = None,
        server_name: str | None = None,
        max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
        dialect: str = commands.LARGE_OBJECT.name,
        bounce_bytes: int = 0,
    ) -> None:
        if data_path not in DATA_PATHS:
            raise ValueError(f"data_path must be one of {DATA_PATHS}, got {data_path!r}")
        if dialect not in DIALECTS:
            raise ValueError(f"dialect must be one of {tuple(DIALECTS)}, got {dialect!r}")
        if connections < 1:
            raise ValueError("connections must be >= 1")
        self.data_path = data_path
        self._connect_timeout = connect_timeout
        self._verify_crc = verify_crc
        self._grace = drain_grace_s
        self._bulk_fallback = bulk_fallback
        # The command set (docs/fabric-command-dialect.md, docs/fabric-dma-dialect.md); a
        # one-region dialect moves a value that is not one registered range through
        # ``bounce_bytes`` of registered memory (or, without room there, the bulk path).
        self._dialect = DIALECTS[dialect]
        self._bounce_bytes = bounce_bytes
        self._conn_kwargs = dict(
            host=host, port=port, db=db, username=username, password=password,
            socket_connect_timeout=connect_timeout, socket_timeout=None, lib_name=None, lib_version=None,
        )
        if ssl_context is not None:  # TLS on the control connections (the RMA payload is the fabric's)
            self._conn_kwargs.update(ssl_context=ssl_context, server_name=server_name)
        self._max_conns = connections
        self._reply_bound = max_reply_bytes  # a whole value (the bulk path) and room for the rest
        self._spec = EndpointSpec(provider, bind_addr, hmem)
        self._scratch_bytes = scratch_bytes
        self._ranges: list[Range] = []
        self._generation = 0
        self._link: FabricLink | None = None  # the link new operations use
        self._links: set[FabricLink] = set()  # the current one and revoked ones still closing
        self._opening: asyncio.Future | None = None
        # Commands that move no bytes by RMA (bulk GET/SET, INFO, UNLINK, EXISTS) use plain
        # connections: they work while a link is being replaced and need no fabric session.
        self._plain_pool = SessionPool(self._conn_kwargs, connections, None, max_reply_bytes)
        if data_path == "rma":
            self._link = self._adopt(self._build_link(1))
        self._tasks: set[asyncio.Task] = set()  # operations
        self._closers: set[asyncio.Task] = set()  # links being closed
        self._closed = False
        self._stats = {"revocations": 0, "released_after_revocation": 0, "held_after_disconnect": 0,
                       "partial_retries": 0, "staged": 0, "bulk_fallbacks": 0}
        self._opened_before = 0  # connections opened by links already gone

    # -- links and registration -------------------------------------------------------------

    def _build_link(self, generation: int) -> FabricLink:
        """Opens an endpoint and registers every range on it (may run off the loop)."""
        return FabricLink(self._spec, list(self._ranges), self._conn_kwargs, self._max_conns, self._scratch_bytes,
                          generation, self._reply_bound, self._dialect, self._bounce_bytes)

    def _adopt(self, link: FabricLink) -> FabricLink:
        self._generation = link.generation
        self._links.add(link)
        return link

    @property
    def endpoint(self) -> FabricEndpoint | None:
        """The endpoint of the current link (None in bulk mode or while a new one opens)."""
        return self._link.endpoint if self._link is not None else None

    def register(self, addr: int, length: int, *, cuda_device: int | None = None) -> MemoryRegion:
        """Registers [addr, addr+length) once (LMCache's whole arena); returns rkey/desc.
        The range is registered again, under new keys, on every later link."""
        return self._add_range(Range(addr=addr, length=length, cuda_device=cuda_device))

    def register_buffer(self, buf: Any) -> MemoryRegion:
        return self._add_range(Range(buffer=buf))

    def _add_range(self, r: Range) -> MemoryRegion:
        link = self._rma_link()
        region = link.register(r)
        self._ranges.append(r)
        return region

    def _rma_link(self) -> FabricLink:
        if self.data_path != "rma":
            raise FabricUnavailable("this FabricTransport uses the bulk data path; registration needs data_path='rma'")
        if self._link is None:
            raise TransportError("the fabric link is being replaced; register before the first operation")
        return self._link

    async def _current_link(self, deadline: float) -> FabricLink:
        """The link for a new operation; after a revocation, a new one (opened off the
        loop: registering a large arena takes a while on some providers)."""
        if self._link is not None and not self._link.revoked:
            return self._link
        loop = asyncio.get_running_loop()
        if self._opening is None:
            self._opening = loop.create_task(self._open_link(self._generation + 1))
        try:
            return await asyncio.wait_for(asyncio.shield(self._opening), max(0.001, deadline - loop.time()))
        except asyncio.TimeoutError:
            raise DeadlineExceeded("a new fabric link was not ready before the deadline") from None

    async def _open_link(self, generation: int) -> FabricLink:
        loop = asyncio.get_running_loop()
        try:
            link = await loop.run_in_executor(None, self._build_link, generation)
        finally:
            self._opening = None
        self._adopt(link)
        if self._closed:
            self._close_soon(link)
            raise ConnectionLost("the fabric transport is closed")
        self._link = link
        return link

    def _revoke(self, link: FabricLink) -> None:
        """No transfer on ``link`` may be trusted to be over: stop using it and close it;
        buffers parked on it are released once its endpoint is closed."""
        if link.revoked:
            return
        self._stats["revocations"] += 1
        log.warning("fabric: a transfer's end could not be confirmed (server paused, gone or past its deadline): "
                    "closing fabric link %d so that nothing can reach memory given back; a new link follows",
                    link.generation)
        self._close_soon(link)

    def _close_soon(self, link: FabricLink) -> None:
        link.revoked = True
        if self._link is link:
            self._link = None
        task = asyncio.get_running_loop().create_task(self._close_link(link))
        self._closers.add(task)
        task.add_done_callback(_forget_task(self._closers))

    async def _close_link(self, link: FabricLink) -> None:
        try:
            await link.close(asyncio.get_running_loop())
        finally:
            self._opened_before += link.pool.opened
            self._links.discard(link)
            parked, link.parked = link.parked, []
            for _keep, over in parked:
                self._stats["released_after_revocation"] += 1
                over()

    def _unconfirmed(self, link: FabricLink | None, keep: object, over: Over | None) -> None:
        """A transfer's end is unknown: its buffers go only once ``link`` is closed."""
        if over is None and keep is None:
            return
        if link is None or link.closed:
            if over:
                over()
            return
        self._stats["held_after_disconnect"] += 1
        link.parked.append((keep, over or (lambda: None)))
        self._revoke(link)

    # -- connections ----------------------------------------------------------------------

    async def connect(self) -> None:
        """Opens one connection (with HELLO in RMA mode): a cheap probe for ``auto``."""
        deadline = asyncio.get_running_loop().time() + self._connect_timeout
        pool = self._plain_pool if self.data_path == "bulk" else (await self._current_link(deadline)).pool
        session = await pool.acquire(deadline)
        pool.release(session)

    # -- one operation --------------------------------------------------------------------

    async def _op(self, link: "FabricLink | _CurrentLink | None", args_for: ArgsFor, keep: object, deadline: float,
                  after: After | None = None, over: Over | None = None) -> Any:
        """Runs one command on a pooled connection. ``args_for(timeout_ms)`` builds it.
        Runs as its own task so that a cancelled caller never cuts it short.

        ``link``: the link whose registrations the command's triples name; ``_SESSION``:
        the current link (a command that needs a fabric session); None: a plain connection.
        ``after(reply)`` runs in this task once a reply arrived (copy-out of staged
        bytes); ``over()`` runs when the buffers in ``keep`` may be reused: at once after
        a reply, after the link is closed when the end of the transfer is unknown."""
        loop = asyncio.get_running_loop()
        try:
            if link is _SESSION:
                link = await self._current_link(deadline)
            if link is None:
                pool = self._plain_pool
            else:
                if link.revoked:
                    raise ConnectionLost("the fabric link of this transfer was revoked before it started")
                pool = link.pool
            session = await pool.acquire(deadline)
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
                reply = await pool.pipeline(session, args[1], wait_s)
                if reply and isinstance(reply[0], ErrorReply):
                    # The first command (an RMA command with its TTL behind it) was refused:
                    # handled as if it had been sent alone (a failed transfer drops the
                    # session, a server deadline with operations in flight revokes the link).
                    raise reply[0]
            else:
                reply = await pool.exchange(session, args, wait_s)
        except ErrorReply as exc:
            err = commands.map_error(exc.message)
            if isinstance(err, TransferFailed):
                # The provider may have torn down its link to us (tcp closes it on a bad
                # key): start a fresh session on a new connection rather than reuse this one.
                await pool.drop(session)
            else:
                pool.release(session)  # the error reply was read whole: clean
            if isinstance(err, ServerDeadline) and err.inflight:
                self._unconfirmed(link, keep, over)  # operations still in flight at the server
            elif over:
                over()
            raise err from None
        except BaseException:
            await pool.drop(session)
            # The server may still be moving bytes for this command: only a closed link stops it.
            if link is not None:
                self._unconfirmed(link, keep, over)
            elif over:
                over()
            raise
        pool.release(session)
        try:
            return after(reply) if after else reply
        finally:
            if over:
                over()

    async def _call(self, args_for: ArgsFor, keep: object, timeout: float, after: After | None = None,
                    over: Over | None = None, link: "FabricLink | _CurrentLink | None" = None) -> Any:
        if self._closed:  # an op started during close() would outlive the endpoint it uses
            if over:
                over()
            raise ConnectionLost("the fabric transport is closed")
        if timeout <= 0:
            if over:
                over()
            raise DeadlineExceeded("timeout must be positive")
        loop = asyncio.get_running_loop()
        task = loop.create_task(self._op(link, args_for, keep, loop.time() + timeout, after, over))
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
        (right away after a reply; later if the caller was cancelled or timed out, at the
        latest once the link was revoked): the moment to hand a MemoryObj back to its
        allocator. ``bufs`` may hold ``RawSpan``s (registered GPU memory): those move by
        RMA only, with no bulk fallback."""
        raw = _rma_only(self.data_path, bufs)
        rel = ReleaseBarrier(on_release)
        try:
            if self.data_path == "bulk":
                return await self._get_bulk(key, bufs, timeout)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            try:
                try:
                    return await self._get_rma(key, bufs, timeout, rel, partial=False)
                except WindowTooSmall:
                    if not allow_partial or self.peer_proof is not True or self._dialect.one_region:
                        raise  # PARTIAL is our BLOB.* extension: a server without it cannot fill a short window
                    # Our endpoint's PARTIAL extension: fill the window, report the full length.
                    self._stats["partial_retries"] += 1
                    return await self._get_rma(key, bufs, deadline - loop.time(), rel, partial=True)
            except NoSlot:
                if raw:
                    raise TransportError("no free scratch slot, and RawSpans have no bulk fallback") from None
                return await self._fallback_get(key, bufs, deadline, "no free scratch slot")
            except (TransferFailed, NoFabricSession, OutsideRegions, OutOfMemory) as exc:
                # OutOfMemory: no arena room for a DMA.GET's copy of a string (the TCP read
                # needs none); BLOB.RDMA_GET never answers it.
                if self._bulk_fallback and not raw and deadline - loop.time() > 0:
                    return await self._fallback_get(key, bufs, deadline, str(exc))
                raise
        finally:
            rel.drop()

    async def _get_rma(self, key: bytes, bufs: Sequence[Any], timeout: float, rel: "ReleaseBarrier", *, partial: bool) -> int | None:
        loop = asyncio.get_running_loop()
        link = await self._current_link(loop.time() + timeout)
        plan = link.plan(bufs, writable=True)
        if plan.staged:
            self._stats["staged"] += 1
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
            link.give_slots(plan)
            rel.drop()

        rel.hold()
        try:
            # Our options only where the session's server took the extended HELLO.
            reply = await self._call(
                lambda ms: self._dialect.get_rma(key, plan.triples, ms, partial, link.peer_proof is True,
                                                 link.endpoint.name),
                plan.keep, timeout, after=copy_out, over=over, link=link)
        except BaseException:
            wanted[0] = False
            raise
        parsed = self._dialect.parse_get_reply(reply)
        if parsed is None:
            return None
        obj_len, crc = parsed
        # RawSpans (GPU memory) cannot be read here: the server's CRC stands for them.
        if self._verify_crc and obj_len <= sum(t[2] for t in plan.triples) and not has_raw_spans(plan.keep):
            self._check_crc(plan.keep, obj_len, crc, key)
        return obj_len

    async def set_from(self, key: bytes, parts: list[memoryview], ttl_s: float | None, timeout: float, *,
                       on_release: Callable[[], None] | None = None) -> None:
        """Stores the concatenation of ``parts`` under ``key`` (server reads them by RMA).
        A fabric failure falls back to the bulk path within the same deadline.
        ``on_release()``: as for ``get_into`` (the server may read ``parts`` until then).
        ``RawSpan`` parts move by RMA only, as for ``get_into``."""
        _rma_only(self.data_path, parts)
        rel = ReleaseBarrier(on_release)
        try:
            await self._set_from(key, parts, ttl_s, timeout, rel)
        finally:
            rel.drop()

    async def _set_from(self, key: bytes, parts: Sequence[Any], ttl_s: float | None, timeout: float,
                        rel: "ReleaseBarrier") -> None:
        ttl_ms = max(1, math.ceil(ttl_s * 1000)) if ttl_s else None
        if self.data_path == "bulk":
            return await self._set_bulk(key, parts, ttl_ms, timeout)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        link = await self._current_link(deadline)
        raw = has_raw_spans(parts)
        try:
            plan = link.plan(parts, writable=False)
        except NoSlot:
            if raw:
                raise TransportError("no free scratch slot, and RawSpans have no bulk fallback") from None
            self._fell_back("put")
            return await self._set_bulk(key, parts, ttl_ms, timeout)
        if plan.staged:
            self._stats["staged"] += 1
        total = sum(t[2] for t in plan.triples)
        # A chunk's CRC, from its header (no payload byte read): the server stores it only if
        # the bytes it read match, so a buffer changed under the transfer is never stored.
        crc = codec.value_crc(parts[0], total) if parts else None
        try:
            if not plan.triples:
                link.give_slots(plan)
                return await self._set_bulk(key, [], ttl_ms, timeout)

            def over() -> None:
                link.give_slots(plan)
                rel.drop()

            def args_for(ms: int) -> Any:
                cmds = self._dialect.set_rma(key, total, plan.triples, ttl_ms, ms, link.peer_proof is True, crc,
                                             link.endpoint.name)
                return _one_trip(cmds)  # the TTL in the same round trip

            rel.hold()
            reply = await self._call(args_for, plan.keep, timeout, after=_first_reply, over=over, link=link)
        # NoSlot here: a new session's HELLO proof found the scratch taken by staged headers
        # (a burst of sets on fresh connections); like a get, the set falls back to bulk.
        except (TransferFailed, NoFabricSession, OutsideRegions, NoSlot, OutOfMemory) as exc:
            left = deadline - loop.time()
            # OutOfMemory: a full arena refuses BLOB.TCP_SET as well, but a DMA.SET's landing
            # copy is all it lacked (a SET of a string needs none).
            if not (self._bulk_fallback and not raw and left > 0) or (
                    isinstance(exc, OutOfMemory) and not self._dialect.one_region):
                raise
            log.info("fabric SET of %r failed (%s): bulk fallback", key, exc)
            self._fell_back("put")
            return await self._set_bulk(key, parts, ttl_ms, left)
        self._dialect.check_set_reply(reply, total)

    async def _fallback_get(self, key: bytes, bufs: Sequence[Any], deadline: float, why: str) -> int | None:
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            raise DeadlineExceeded(f"no time left for a bulk fallback ({why})")
        log.info("fabric GET of %r not possible (%s): bulk fallback", key, why)
        self._fell_back("get")
        return await self._get_bulk(key, bufs, left)

    def _fell_back(self, op: str) -> None:
        """An RMA transfer that the module's bulk (TCP) commands carry instead: counted here
        and as lmcache_valkey_fabric_fallbacks_total (an alert: RMA is failing)."""
        self._stats["bulk_fallbacks"] += 1
        metrics.record_fabric_fallback(op)

    async def _set_bulk(self, key: bytes, parts: Sequence[Any], ttl_ms: int | None, timeout: float) -> None:
        value = b"".join(bytes(byte_view(p)) for p in parts)
        args = _one_trip(self._dialect.set_bulk(key, value, ttl_ms))
        _expect_ok(await self._call(lambda ms: args, None, timeout, after=_first_reply))

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

    async def getrange_into(self, key: bytes, start: int, buf: memoryview, *, timeout: float) -> int | None:
        """The start of a value through a window of ``len(buf)`` bytes (``start`` 0 only): an
        RMA read of that window, or the bulk path."""
        return await read_window(self, key, start, buf, timeout)

    async def set_many(
        self, items: Sequence[tuple[bytes, Sequence[Any]]], *, ttl_s: float | None, timeout: float
    ) -> list[TransportError | None]:
        got = await asyncio.gather(*(self.set_from(k, list(p), ttl_s, timeout) for k, p in items), return_exceptions=True)
        return [_as_result(g) for g in got]

    async def exists_many(self, keys: Sequence[bytes], *, timeout: float, prefix: bool = False) -> list[bool]:
        """One pipelined round trip on one connection (EXISTS per key keeps the order)."""
        if not keys:
            return []
        cmds = [("EXISTS", k) for k in keys]
        replies = await self._call(lambda ms: (_PIPELINE, cmds), None, timeout)
        for r in replies:
            if isinstance(r, ErrorReply):
                raise commands.map_error(r.message)
            if type(r) is not int or r not in (0, 1):  # EXISTS of one key
                raise ProtocolError(f"unexpected EXISTS reply: {describe(r)}")
        return [r == 1 for r in replies]

    def exists_many_blocking(self, keys: Sequence[bytes], *, timeout: float,
                             prefix: bool = False) -> list[bool] | None:
        return None  # the control connection belongs to the transport's loop: lookups run there

    async def exists_many_on_caller_loop(self, keys: Sequence[bytes], *, timeout: float,
                                         prefix: bool = False) -> list[bool] | None:
        return None

    async def scan_iter(self, match: bytes, count: int = 1000) -> AsyncIterator[bytes]:
        """SCAN this node on plain connections; the walk is bounded (``transport/scan.py``)."""
        async def call(cursor: bytes, wait: float) -> Any:
            return await self._call(lambda ms: ["SCAN", cursor, "MATCH", match, "COUNT", count], None, wait)

        async for k in scan_walk(self._plain_pool.where, call, _CONTROL_TIMEOUT_S):
            yield k

    async def ping(self, *, timeout: float) -> None:
        await self.command("PING", timeout=timeout)

    async def delete(self, keys: Iterable[bytes], timeout: float = 5.0) -> int:
        keys = list(keys)
        if not keys:
            return 0
        n = await self._call(lambda ms: [commands.DELETE, *keys], None, timeout)
        if type(n) is not int or not 0 <= n <= len(keys):
            raise ProtocolError(f"unexpected {commands.DELETE} reply: {describe(n)}")
        return n

    async def info(self, key: bytes, timeout: float = 5.0) -> tuple[int, int] | None:
        """(length, crc32c) of a stored value, or None. The DMA dialect's values are strings,
        which carry no CRC: (length, None)."""
        args = _one_trip(self._dialect.info(key))
        return self._dialect.parse_info_reply(await self._call(lambda ms: args, None, timeout))

    async def control(self, *args: Any, timeout: float = 5.0) -> Any:
        """One command on a plain connection (no fabric session): topology, diagnostics."""
        return await self._call(lambda ms: list(args), None, timeout)

    async def command(self, *args: Any, timeout: float = 5.0) -> Any:
        """Sends one raw command on a pooled connection that carries a fabric session
        (diagnostics and dialect tests); error replies raise the mapped exception."""
        return await self._call(lambda ms: list(args), None, timeout, link=_SESSION)

    @property
    def stats(self) -> dict[str, int]:
        """Counters: revocations (links closed because a transfer's end was unknown),
        held_after_disconnect (transfers whose buffers waited for that), released_after_revocation,
        partial_retries, staged, bulk_fallbacks, connections (opened so far, each with its own
        HELLO)."""
        sessions = self._opened_before + sum(link.pool.opened for link in self._links)
        return {**self._stats, "connections": sessions, "plain_connections": self._plain_pool.opened}

    @property
    def peer_proof(self) -> bool | None:
        """Whether the server took our HELLO extensions (fabric address proved by a nonce,
        transfers confined to declared regions); None before the first session, False
        against a server without them (docs/security.md states what that leaves open)."""
        return self._link.peer_proof if self._link is not None else None

    @property
    def pending_ops(self) -> int:
        """Operations whose buffers this transport still holds (running, or waiting for
        the link they used to close)."""
        return len(self._tasks) + sum(len(link.parked) for link in self._links)

    async def _get_bulk(self, key: bytes, bufs: list[memoryview], timeout: float) -> int | None:
        cmd = self._dialect.get_bulk(key)
        value = await self._call(lambda ms: cmd, None, timeout)
        if value is None:
            return None
        if type(value) is not bytes:  # a bulk string, not a status, number or array
            raise ProtocolError(f"unexpected {cmd[0]} reply: {describe(value)}")
        scatter(value, [byte_view(b) for b in bufs])
        return len(value)

    def _check_crc(self, views: list[memoryview], obj_len: int, crc: int, key: bytes) -> None:
        # Staged buffers were copied out already, so the user's views hold the bytes.
        if crc32c_parts(clip_parts(views, obj_len)) != crc:
            raise CorruptChunk("crc", f"RMA GET of {key!r}: bytes in the buffers do not match the server's crc32c")

    async def close(self) -> None:
        """Cancels running commands, closes every link (connections, then the endpoint:
        memory deregistered); only then are buffers of unconfirmed transfers let go."""
        if self._closed:
            return
        self._closed = True  # refuse new ops; running ones are cancelled below
        # Operations end first (their buffers park on their link), then every link closes.
        ops = list(self._tasks)
        for t in ops:
            t.cancel()
        if ops:
            await asyncio.gather(*ops, return_exceptions=True)
        if self._opening is not None:
            await asyncio.gather(self._opening, return_exceptions=True)
        for link in list(self._links):
            if not link.revoked:
                self._close_soon(link)
        while self._closers:
            await asyncio.gather(*list(self._closers), return_exceptions=True)
        await self._plain_pool.close()

    async def __aenter__(self) -> "FabricTransport":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class ReleaseBarrier:
    """Calls ``cb`` once every holder let go: the public call itself (one hold) plus each
    transfer attempt, whose hold ends with the transport's ``over`` hook (or, for the
    cluster transport, with a node's own release of the attempt)."""

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


def _rma_only(data_path: str, bufs: Sequence[Any]) -> bool:
    """Whether ``bufs`` hold RawSpans; those need the RMA data path (nothing here can copy them)."""
    raw = has_raw_spans(bufs)
    if raw and data_path != "rma":
        raise FabricUnavailable("RawSpans (registered GPU memory) move by RMA only: this transport uses the bulk path")
    return raw


def _expect_ok(reply: Any) -> None:
    """The status ``+OK`` (a bulk ``OK`` is not a successful SET)."""
    if not (isinstance(reply, SimpleString) and reply == b"OK"):
        raise ProtocolError(f"unexpected SET reply: {describe(reply)}")


def _first_reply(replies: Any) -> Any:
    """A pipelined command and its follower (the TTL): the first one's reply, errors raised.
    A command sent alone: its reply."""
    if not isinstance(replies, Pipelined):
        return replies
    first = replies[0]
    if isinstance(first, ErrorReply):
        raise commands.map_error(first.message)
    return first


def _as_result(value: Any) -> Any:
    if isinstance(value, BaseException) and not isinstance(value, LmcacheValkeyError):
        if isinstance(value, asyncio.CancelledError):
            raise value
        return TransportError(f"{type(value).__name__}: {value}")
    return value


_PIPELINE = object()  # marks a pipelined batch of plain commands in ``_op``
DIALECTS = {d.name: d for d in (commands.LARGE_OBJECT, DMA)}


def _one_trip(cmds: list[list[object]]) -> Any:
    """A dialect's commands for one operation, as ``_op`` takes them: one command alone, or
    several pipelined in one round trip."""
    return cmds[0] if len(cmds) == 1 else (_PIPELINE, cmds)


class _CurrentLink:
    """``_op``'s link: whichever link is current when the command starts."""


_SESSION = _CurrentLink()


def _forget_task(tasks: set[asyncio.Task]) -> Any:
    def done(task: asyncio.Task) -> None:
        tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: an orphaned op's error is not "never retrieved"

    return done


__all__ = ["FabricTransport", "DATA_PATHS"]
