"""The transport-agnostic core: prefix lookup, get into a caller's buffer, put, delete.

Integrations call only this module. It speaks chunk ids, LMCache key strings and
buffers; it never imports ``lmcache`` (see docs/layers.md). Below it, a
transport moves bytes (RESP over TCP, or libfabric RMA) and, optionally, a tier
client brings chunks back from NVMe/S3 into Valkey RAM.

Contract, for every operation:

* a deadline bounds it (``Settings.op_timeout_s`` / ``lookup_timeout_s``); past
  it a get or lookup is a miss and a put is a counted failure;
* a miss is ``None`` (or a shorter prefix), never an exception; corrupt,
  truncated, foreign or oversized values are counted misses and the bad copy is
  deleted;
* a payload is one buffer or a list of parts whose concatenation is the chunk
  (:data:`codec.Payload`): a page an engine keeps scattered over its layers is sent
  from and read into its parts in place, never gathered into a copy;
* buffer ownership: the caller owns ``dest``. With RESP, when ``get_many_into``
  returns, raises or is cancelled, nothing can write into it any more (the
  transport aborts a connection cancelled mid-reply before the exception leaves
  it). With RMA the *server* writes: a caller that may reuse a missed buffer
  passes ``on_release`` and reuses it only when called back.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Protocol, Sequence

from . import codec, metrics
from .codec import HEADER_SIZE, ChunkMeta, Payload
from .config import Settings
from .errors import CorruptChunk, DeadlineExceeded, TransportError
from .keys import Namespace
from .timeouts import timeout as time_limit

if TYPE_CHECKING:
    from .tiering.settings import TieringSettings

log = logging.getLogger(__name__)

Buffer = bytes | bytearray | memoryview


class ChunkTransport(Protocol):
    """What the store needs from a transport: ``RespClient``, ``BlobTcpClient``,
    ``FabricTransport``, ``ClusterFabricTransport``, ``MemoryTransport`` (each checked
    against this declaration by tests/unit/test_transport_contract.py).

    ``get_many_into`` scatters each value into its buffers (a :class:`codec.PayloadSink`,
    whose ``crc`` a transport may fill in as bytes arrive) and returns the value's length,
    ``None`` when absent, or a per-item error. ``supports_release_callbacks``: the *server*
    writes into the buffers (RMA), so ``get_many_into`` also takes ``on_release=[callable
    per item]``, each called once nothing can touch that item's buffers any more.
    ``register``: a caller-owned arena the server's transfers use, registered once; False
    when the transport needs none. ``getrange_into``: the start of a value (a header)
    without moving the rest. ``exists_many_blocking`` / ``exists_many_on_caller_loop``:
    ``exists_many`` on the calling thread (which blocks) or awaited on another event loop
    than the transport's, for an engine's lookups; ``None`` where the transport cannot do
    that one (then the store runs ``exists_many`` on its own loop). ``prefix=True``: only the
    leading run of present keys must be right, every key after the first absent one may
    read absent (a transport may then ask the server less: transport/resp/prefix.py).
    """

    supports_release_callbacks: bool

    async def get_many_into(
        self, items: Sequence[tuple[bytes, Sequence[memoryview]]], *, timeout: float
    ) -> list[int | None | TransportError]: ...

    async def getrange_into(self, key: bytes, start: int, buf: memoryview, *, timeout: float) -> int | None: ...

    def register(self, addr: int, length: int) -> bool: ...

    async def set_many(
        self, items: Sequence[tuple[bytes, Sequence[Buffer]]], *, ttl_s: float | None, timeout: float
    ) -> list[TransportError | None]: ...

    async def exists_many(self, keys: Sequence[bytes], *, timeout: float, prefix: bool = False) -> list[bool]: ...

    def exists_many_blocking(self, keys: Sequence[bytes], *, timeout: float,
                             prefix: bool = False) -> list[bool] | None: ...

    async def exists_many_on_caller_loop(self, keys: Sequence[bytes], *, timeout: float,
                                         prefix: bool = False) -> list[bool] | None: ...

    async def delete(self, keys: Sequence[bytes], *, timeout: float) -> int: ...

    def scan_iter(self, match: bytes, count: int = 1000) -> AsyncIterator[bytes]: ...

    async def ping(self, *, timeout: float) -> None: ...

    async def close(self) -> None: ...


class TierHints(Protocol):
    """The worker-side view of the lower tiers (``tiering.client``: EmbeddedTierClient, RemoteTierClient)."""

    async def promote(self, data_key: bytes, *, timeout: float) -> bool: ...

    async def note_put(self, data_key: bytes, nbytes: int) -> None: ...

    async def note_hit(self, data_key: bytes) -> None: ...

    async def note_miss(self, data_keys: Sequence[bytes]) -> None: ...

    async def delete(self, data_keys: Sequence[bytes], *, timeout: float) -> int: ...

    async def lease(self, data_keys: Sequence[bytes], ttl_s: float) -> None: ...

    async def release(self, data_keys: Sequence[bytes]) -> None: ...


@dataclass(frozen=True)
class GetResult:
    """A verified hit: ``nbytes`` payload bytes now sit at the start of the caller's buffer."""

    meta: ChunkMeta
    nbytes: int


@dataclass(frozen=True)
class ChunkRef:
    """Names one chunk: ``chunk_id`` places it, ``key_string`` proves it is the right one."""

    chunk_id: str
    key_string: str


class ChunkStore:
    """Async chunk store over one transport; run it on one event loop."""

    def __init__(
        self,
        settings: Settings,
        namespace: Namespace,
        transport: ChunkTransport,
        *,
        transport_name: str = "resp",
        tiers: TierHints | None = None,
    ) -> None:
        self.settings = settings
        self.namespace = namespace
        self.transport = transport
        self.transport_name = transport_name
        self.tiers = tiers
        self._background: set[asyncio.Task[Any]] = set()
        self._closed = False
        self._borrowed = False  # a view made by for_namespace: the connections are another store's
        self._loop = _running_loop()  # where this store runs (created there, by open_store)
        # chunk id -> its keys, for lookups (see _remembered); any thread may fill them
        self._data_keys: dict[str, bytes] = {}
        self._marker_keys: dict[str, bytes] = {}
        self.owned: list[Any] = []  # tier client/manager, extra connections: closed before the transport

    def for_namespace(self, namespace: Namespace) -> "ChunkStore":
        """This store's connections and tiers, for another namespace (an engine with several
        layouts: one per host pool). The view owns nothing: closing it only stops its own
        background work, and this store closes the connections. Same loop as this store."""
        view = ChunkStore(self.settings, namespace, self.transport, transport_name=self.transport_name,
                          tiers=self.tiers)
        view._borrowed = True
        view._loop = self._loop
        return view

    # ------------------------------------------------------------------ lookup

    async def contains_prefix(self, chunk_ids: Sequence[str], timeout: float | None = None) -> int:
        """How many chunks, from the first, exist in some tier. One round trip per node.
        ``timeout``: less than ``lookup_timeout_s`` where the caller has less left."""
        if not chunk_ids:
            return 0
        started = time.perf_counter()
        found = await self._exists_any_tier(chunk_ids, prefix=True, timeout=timeout)
        return self._prefix_found(chunk_ids, found, started)

    async def contains_each(self, chunk_ids: Sequence[str]) -> list[bool]:
        """Whether each chunk exists in some tier, every one answered (not only a prefix).

        For engines that scan keys in their own order (vLLM looks sliding-window blocks up
        from the end). Same cost as :meth:`contains_prefix`: one round trip per node; a
        failed or late lookup answers ``False`` for every chunk."""
        found = await self.answer_each(chunk_ids)
        return [False] * len(chunk_ids) if found is None else found

    async def answer_each(self, chunk_ids: Sequence[str]) -> list[bool] | None:
        """:meth:`contains_each`, but ``None`` when the lookup failed or was late (counted):
        for a caller that acts on an answered "absent" (the vLLM tier's KV removal events)."""
        if not chunk_ids:
            return []
        started = time.perf_counter()
        found = await self._exists_any_tier(chunk_ids)
        if found is None:
            return None
        return self._each_found(chunk_ids, found, started)

    def contains_prefix_blocking(self, chunk_ids: Sequence[str], timeout: float | None = None) -> int | None:
        """:meth:`contains_prefix` on the calling thread, which waits for it anyway (an
        engine's synchronous lookup): the same answer, errors and metrics without a hop to
        the store's loop and back. ``None`` when the transport cannot answer this one
        without the loop, or when called on the loop itself (which must never block): then
        run :meth:`contains_prefix` there (transport/resp/blocking.py says when).
        ``timeout``: less than ``lookup_timeout_s`` where the caller has less left."""
        if not chunk_ids:
            return 0
        started = time.perf_counter()
        found = self._exists_any_tier_blocking(chunk_ids, timeout, prefix=True)
        return None if found is _NEEDS_LOOP else self._prefix_found(chunk_ids, found, started)

    async def contains_prefix_on_caller_loop(self, chunk_ids: Sequence[str], timeout: float | None = None) -> int | None:
        """:meth:`contains_prefix` awaited on another event loop than the store's (an
        engine's own), without waking the store's loop: ``None`` when the transport cannot
        do this one there (then use a thread, or the store's loop). ``timeout``: as for
        :meth:`contains_prefix_blocking`."""
        if not chunk_ids:
            return 0
        if not self._may_look_up_here():
            return None
        started = time.perf_counter()
        keys = self._lookup_keys(chunk_ids)
        try:
            found = await self.transport.exists_many_on_caller_loop(keys, timeout=self._lookup_timeout(timeout),
                                                                    prefix=self.tiers is None)
        except TransportError as e:
            return self._prefix_found(chunk_ids, self._lookup_failed(len(chunk_ids), e), started)
        if found is None:
            return None
        return self._prefix_found(chunk_ids, self._any_tier(keys, len(chunk_ids), found), started)

    def contains_each_blocking(self, chunk_ids: Sequence[str]) -> list[bool] | None:
        """:meth:`contains_each` on the calling thread (see :meth:`contains_prefix_blocking`)."""
        if not chunk_ids:
            return []
        started = time.perf_counter()
        found = self._exists_any_tier_blocking(chunk_ids)
        return None if found is _NEEDS_LOOP else self._each_found(chunk_ids, found, started)

    def _prefix_found(self, chunk_ids: Sequence[str], found: list[bool] | None, started: float) -> int:
        if found is None:
            return 0
        prefix = _prefix(found)
        metrics.record_lookup(len(chunk_ids), prefix, time.perf_counter() - started)
        return prefix

    def _each_found(self, chunk_ids: Sequence[str], found: list[bool] | None, started: float) -> list[bool]:
        if found is None:
            return [False] * len(chunk_ids)
        metrics.record_lookup(len(chunk_ids), _prefix(found), time.perf_counter() - started)
        return found

    def _lookup_keys(self, chunk_ids: Sequence[str]) -> list[bytes]:
        keys = _remembered(self._data_keys, chunk_ids, self.namespace.data_keys)
        if self.tiers is not None:
            # Value and marker share a slot; one pipelined pass answers "any tier".
            keys += _remembered(self._marker_keys, chunk_ids, self.namespace.marker_keys)
        return keys

    async def _exists_any_tier(self, chunk_ids: Sequence[str], prefix: bool = False,
                               timeout: float | None = None) -> list[bool] | None:
        """One pipelined pass: per chunk, is its value (or, with tiering, its lower-tier
        marker) present? ``None`` when the lookup failed or missed its deadline (counted).
        ``prefix``: only the leading run of found chunks matters (the transport may answer
        the rest "absent"); with tiering every answer is used, for the tier manager."""
        keys = self._lookup_keys(chunk_ids)
        timeout = self._lookup_timeout(timeout)
        try:
            async with time_limit(timeout + _GRACE_S):  # (no task per lookup, unlike wait_for)
                found = await self.transport.exists_many(keys, timeout=timeout, prefix=prefix and self.tiers is None)
        except (TransportError, asyncio.TimeoutError) as e:
            return self._lookup_failed(len(chunk_ids), e)
        return self._any_tier(keys, len(chunk_ids), found)

    def _exists_any_tier_blocking(self, chunk_ids: Sequence[str], timeout: float | None = None,
                                  prefix: bool = False) -> Any:
        """:meth:`_exists_any_tier` on the calling thread, or ``_NEEDS_LOOP``."""
        if not self._may_look_up_here():
            return _NEEDS_LOOP
        keys = self._lookup_keys(chunk_ids)
        try:
            found = self.transport.exists_many_blocking(keys, timeout=self._lookup_timeout(timeout),
                                                        prefix=prefix and self.tiers is None)
        except TransportError as e:
            return self._lookup_failed(len(chunk_ids), e)
        if found is None:
            return _NEEDS_LOOP
        return self._any_tier(keys, len(chunk_ids), found)

    def _lookup_timeout(self, timeout: float | None) -> float:
        own = self.settings.lookup_timeout_s
        return own if timeout is None else max(0.0, min(own, timeout))

    def lookup_abandoned(self, n: int, timeout: float) -> int:
        """A lookup of ``n`` chunks its caller stopped waiting for after ``timeout``: a
        counted deadline miss."""
        self._lookup_failed(n, DeadlineExceeded(f"no answer within {timeout:g}s"))
        return 0

    def _may_look_up_here(self) -> bool:
        """A lookup may skip the store's loop: it runs, and this is not its thread."""
        return self._loop is not None and not self._closed and _running_loop() is not self._loop

    def _lookup_failed(self, n: int, e: BaseException) -> None:
        metrics.record_error("lookup", _cause(e))
        log.warning("lookup of %d chunks failed (%s): treating as a miss", n, e)
        return None

    def _any_tier(self, keys: list[bytes], n: int, found: Sequence[bool]) -> list[bool]:
        """Per chunk: its value or its marker found (any thread: the miss report goes to the loop)."""
        if self.tiers is None:
            return list(map(bool, found[:n]))
        out = [bool(found[i] or found[n + i]) for i in range(n)]
        # A lower tier may hold a chunk whose marker Valkey evicted (allkeys-*): report the
        # first misses, so the tier manager re-creates what it has (docs/tiering-tiers.md).
        missed = [keys[i] for i, f in enumerate(out) if not f][:_MISSES_REPORTED]
        if missed:
            self._spawn_threadsafe(self.tiers.note_miss, missed)
        return out

    async def exists(self, chunk_id: str) -> bool:
        return await self.contains_prefix([chunk_id]) == 1

    # --------------------------------------------------------------------- get

    async def get_into(self, ref: ChunkRef, dest: Payload) -> GetResult | None:
        return (await self.get_many_into([(ref, dest)]))[0]

    async def load_into(
        self,
        items: Sequence[tuple[ChunkRef, Payload]],
        *,
        accept: Callable[[int, ChunkMeta], bool] | None = None,
        layout: codec.ChunkLayout | None = None,
    ) -> list[GetResult | None]:
        """:meth:`get_many_into` for a caller that reuses a missed item's buffer as soon as it
        has the answer (an engine's own pool slot): returns only once no transfer can write
        into any missed item's buffer. With RESP that is at once; with RMA it waits for each
        missed item's ``on_release``, which for a transfer whose end cannot be confirmed means
        until the transport has revoked the link it used (deadline plus ``drain_grace_s``,
        docs/fabric-buffer-ownership.md): a bounded stall, never a slot written after the
        engine took it back."""
        loop = asyncio.get_running_loop()
        released = 0
        misses: int | None = None
        all_released = asyncio.Event()

        def note_release() -> None:
            nonlocal released
            released += 1
            if misses is not None and released >= misses:
                all_released.set()

        def on_release(_i: int) -> None:  # may run on a transport's thread
            loop.call_soon_threadsafe(note_release)

        results = await self.get_many_into(items, on_release=on_release, accept=accept, layout=layout)
        misses = sum(r is None for r in results)
        if released < misses:
            await all_released.wait()
        return results

    async def get_many_into(
        self,
        items: Sequence[tuple[ChunkRef, Payload]],
        *,
        on_release: Callable[[int], None] | None = None,
        accept: Callable[[int, ChunkMeta], bool] | None = None,
        layout: codec.ChunkLayout | None = None,
    ) -> list[GetResult | None]:
        """Read each chunk's payload into its buffer (or its parts, in order). Verified hits or
        ``None``; never raises for a miss.

        ``on_release(i)`` is called once for every item that did not become a hit, when its
        buffer may be reused: with RESP before this returns (or raises); with RMA when the
        server's transfer is known to be over, which can be later, and is never for a
        transfer the server left in flight (it stays quarantined rather than reused).

        ``accept(i, meta)``: whether item i's stored layout (shapes, dtypes, format from the
        chunk header) fits the caller's buffer; a refused chunk is a counted ``layout`` miss
        and stays in place (another deployment's valid chunk).

        ``layout``: the layout every chunk of this namespace has (its fingerprint covers it).
        A chunk that does not fit it can never be served here, whatever its checksums say: a
        counted ``meta`` miss, deleted. Without it, only the header's own consistency is
        checked (its shapes and dtypes describe exactly its payload length).
        """
        if not items:
            return []
        started = time.perf_counter()
        deadline = started + self.settings.op_timeout_s
        rel = _Releases(len(items), on_release, self.transport.supports_release_callbacks)
        try:
            results = await self._read_round(items, deadline, rel=rel, accept=accept, layout=layout)
            if self.tiers is not None:
                missing = [i for i, r in enumerate(results) if r is _ABSENT]
                if missing:
                    promoted = await self._promote([items[i][0] for i in missing], deadline)
                    again = [i for i, ok in zip(missing, promoted) if ok]
                    if again:
                        second = await self._read_round([items[i] for i in again], deadline, tier="ram",
                                                        rel=rel, index=again, accept=accept, layout=layout)
                        for i, r in zip(again, second):
                            results[i] = r
        except BaseException:
            rel.settle()  # broken or cancelled: nothing became a hit
            raise
        out: list[GetResult | None] = []
        for i, r in enumerate(results):
            if isinstance(r, GetResult):
                out.append(r)
                rel.keep(i)
            else:
                if r is _ABSENT:
                    metrics.record_miss("ram", "absent")
                out.append(None)
        rel.settle()
        metrics.observe_latency("get", "ram", self.transport_name, time.perf_counter() - started)
        return out

    async def _read_round(
        self,
        items: Sequence[tuple[ChunkRef, Payload]],
        deadline: float,
        tier: str = "ram",
        *,
        rel: "_Releases",
        index: Sequence[int] | None = None,
        accept: Callable[[int, ChunkMeta], bool] | None = None,
        layout: codec.ChunkLayout | None = None,
    ) -> list[GetResult | None | object]:
        """One pass over the transport. Returns GetResult, None (counted miss) or _ABSENT."""
        headers = [bytearray(HEADER_SIZE) for _ in items]
        keys = [self.namespace.data_key(ref.chunk_id) for ref, _ in items]
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            for _ in items:
                metrics.record_miss(tier, "deadline")
            return [None] * len(items)
        dests = [codec.payload_parts(d) for _, d in items]
        sinks = [codec.PayloadSink([memoryview(h), *d]) for h, d in zip(headers, dests)]
        reqs = list(zip(keys, sinks))
        kw: dict[str, Any] = {}
        if rel.by_transport:
            kw["on_release"] = [rel.transfer_over_callback(i) for i in (index or range(len(items)))]
        try:
            async with time_limit(remaining + _GRACE_S):  # (no task per batch, unlike wait_for)
                raw = await self.transport.get_many_into(reqs, timeout=remaining, **kw)
        except (TransportError, asyncio.TimeoutError) as e:
            cause = _cause(e)
            log.warning("get of %d chunks failed (%s): misses", len(items), e)
            for _ in items:
                metrics.record_miss(tier, cause)
            return [None] * len(items)
        out: list[GetResult | None | object] = [None] * len(items)
        verified: list[tuple[int, bytes, codec.Header, tuple[memoryview, ...]]] = []
        known_crc: dict[int, int] = {}  # checksums the transport computed while receiving
        for i, (key, header, (ref, _), dest, value_len) in enumerate(zip(keys, headers, items, dests, raw)):
            if value_len is None:
                out[i] = _ABSENT
                continue
            if isinstance(value_len, CorruptChunk):  # the transport checked and refused it
                self._reject(key, tier, value_len)
                continue
            if isinstance(value_len, BaseException):
                metrics.record_miss(tier, _cause(value_len))
                continue
            try:
                if value_len < HEADER_SIZE:
                    raise CorruptChunk("truncated", f"value of {value_len} bytes")
                h = codec.decode_header(header)
                codec.check(h, value_len, dest, self.namespace.digest_bytes, self.namespace.key_digest(ref.key_string),
                            verify_crc=False)
                if layout is not None and not layout.admits(h.meta):
                    raise CorruptChunk("meta", f"stored as {h.meta.shapes} {h.meta.dtypes} fmt {h.meta.fmt}, "
                                               f"not a layout of this namespace")
                if accept is not None and not accept(index[i] if index else i, h.meta):
                    raise CorruptChunk("layout", f"stored as {h.meta.shapes} {h.meta.dtypes} fmt {h.meta.fmt}")
            except CorruptChunk as e:
                self._reject(key, tier, e)
                continue
            verified.append((i, key, h, dest))
            if sinks[i].crc is not None:
                known_crc[i] = sinks[i].crc
        todo = [(i, codec.clip_parts(dest, h.payload_len)) for i, _, h, dest in verified if i not in known_crc]
        known_crc.update(zip((i for i, _ in todo), await _payload_crcs([v for _, v in todo])))
        for i, key, h, _ in verified:
            crc = known_crc[i]
            if crc != h.payload_crc:
                self._reject(key, tier, CorruptChunk("crc", "payload checksum mismatch"))
                continue
            metrics.record_hit(tier, self.transport_name, h.payload_len)
            if self.tiers is not None:
                self._spawn(self.tiers.note_hit(key))
            out[i] = GetResult(h.meta, h.payload_len)
        return out

    def _reject(self, key: bytes, tier: str, e: CorruptChunk) -> None:
        """A stored value is unusable: count the miss and delete the bad copy.

        A value in another format version is left alone: during a rolling upgrade the
        other version's workers still read it.
        """
        metrics.record_miss(tier, e.reason)
        if e.reason in ("format", "layout"):
            # another format version (a rolling upgrade) or another layout (a deployment
            # whose chunks the reader cannot use): valid for its writers, left in place
            log.info("chunk %s is not for this reader (%s): a miss, left in place", key.decode(), e)
            return
        log.warning("chunk %s is unusable (%s): counted as a miss and deleted", key.decode(), e)
        # Metadata that cannot be right is the same in every tier's copy (they are copied
        # verbatim): remove them all, or a lookup would go on finding the chunk.
        self._spawn(self._delete_bad(key, everywhere=e.reason == "meta"))

    async def _promote(self, refs: Sequence[ChunkRef], deadline: float) -> list[bool]:
        assert self.tiers is not None
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            return [False] * len(refs)
        keys = [self.namespace.data_key(r.chunk_id) for r in refs]
        got = await asyncio.gather(
            *(asyncio.wait_for(self.tiers.promote(k, timeout=remaining), remaining) for k in keys),
            return_exceptions=True,
        )
        return [g is True for g in got]

    async def _delete_bad(self, key: bytes, everywhere: bool = False) -> None:
        try:
            if everywhere and self.tiers is not None:
                await self.delete([self.namespace.chunk_id_of(key)])
            else:
                await self.transport.delete([key], timeout=self.settings.op_timeout_s)
        except (TransportError, asyncio.TimeoutError) as e:
            log.warning("could not delete bad chunk %s: %s", key.decode(), e)

    # --------------------------------------------------------------------- put

    async def put(self, ref: ChunkRef, meta: ChunkMeta, payload: Payload) -> bool:
        return (await self.put_many([(ref, meta, payload)]))[0]

    async def put_many(self, items: Sequence[tuple[ChunkRef, ChunkMeta, Payload]]) -> list[bool]:
        """Store chunks (header + payload, the payload sent from the caller's buffer or its
        parts). True = stored.

        The whole batch goes to the transport as one request set, which stripes it over the
        node's connections, once its CRCs are known (large payloads checked on worker
        threads in parallel, so the loop keeps serving lookups and gets meanwhile). One
        request set per chunk, each waiting for its own checksum, cost more client CPU than
        the checksums do (0.37 vs 0.32 CPU-s/GB for 32 x 4 MiB, same GB/s).
        """
        if not items:
            return []
        started = time.perf_counter()
        deadline = started + self.settings.op_timeout_s
        items = [(ref, meta, codec.payload_parts(p)) for ref, meta, p in items]
        ok = await self._put_batch(items, deadline)
        metrics.observe_latency("put", "ram", self.transport_name, time.perf_counter() - started)
        return ok

    async def _put_batch(
        self, items: Sequence[tuple[ChunkRef, ChunkMeta, tuple[memoryview, ...]]], deadline: float
    ) -> list[bool]:
        ok = [False] * len(items)
        slots = []
        for i, (ref, meta, payload) in enumerate(items):
            nbytes = codec.parts_nbytes(payload)
            if nbytes > self.settings.max_chunk_bytes:
                log.warning("chunk %s of %d bytes exceeds max_chunk_bytes; not stored", ref.chunk_id, nbytes)
                metrics.record_error("put", "oversized")
                continue
            described = codec.described_nbytes(meta)
            if nbytes == 0 or (described is not None and described != nbytes):
                # Every reader would refuse (and delete) it: an adapter bug, not worth a round trip.
                log.warning("chunk %s not stored: %d payload bytes, metadata %s %s describes %s",
                            ref.chunk_id, nbytes, meta.shapes, meta.dtypes, described)
                metrics.record_error("put", "meta")
                continue
            slots.append(i)
        crcs = await _payload_crcs([items[i][2] for i in slots])
        reqs: list[tuple[bytes, Sequence[Buffer]]] = []
        sent: list[int] = []
        for i, crc in zip(slots, crcs):
            ref, meta, payload = items[i]
            try:
                header = codec.encode_header(
                    meta, payload, self.namespace.digest_bytes, self.namespace.key_digest(ref.key_string), payload_crc=crc
                )
            except ValueError as e:  # metadata too large for the header: this chunk only
                log.warning("chunk %s not stored: %s", ref.chunk_id, e)
                metrics.record_error("put", "format")
                continue
            reqs.append((self.namespace.data_key(ref.chunk_id), (header, *payload)))
            sent.append(i)
        if not reqs:
            return ok
        timeout = deadline - time.perf_counter()
        try:
            if timeout <= 0:
                raise DeadlineExceeded("put deadline passed before sending")
            async with time_limit(timeout + _GRACE_S):
                errs = await self.transport.set_many(reqs, ttl_s=self.settings.ttl_s, timeout=timeout)
        except (TransportError, asyncio.TimeoutError) as e:
            log.warning("put of %d chunks failed: %s", len(reqs), e)
            errs = [e] * len(reqs)
        for slot, (key, parts), err in zip(sent, reqs, errs):
            nbytes = sum(memoryview(p).nbytes for p in parts[1:])
            if err is None:
                ok[slot] = True
                if self.tiers is not None:
                    self._spawn(self.tiers.note_put(key, nbytes))
            else:
                metrics.record_error("put", _cause(err))
            metrics.record_put("ram", self.transport_name, nbytes, err is None)
        return ok

    # ------------------------------------------------------------ delete, list

    async def delete(self, chunk_ids: Sequence[str]) -> int:
        """Remove chunks: from RAM, and with tiering from every tier (markers and copies too)."""
        keys = [self.namespace.data_key(c) for c in chunk_ids]
        if self.tiers is None:
            return await self.transport.delete(keys, timeout=self.settings.op_timeout_s)
        # The RAM value and its tier marker go first, whatever the tier manager's state;
        # then the tier manager removes lower copies within what is left of the deadline.
        deadline = time.perf_counter() + self.settings.op_timeout_s
        markers = [self.namespace.marker_key(c) for c in chunk_ids]
        ram, _ = await asyncio.gather(self.transport.delete(keys, timeout=self.settings.op_timeout_s),
                                      self.transport.delete(markers, timeout=self.settings.op_timeout_s))
        left = deadline - time.perf_counter()
        if left <= 0:
            return ram
        try:
            lower = await self.tiers.delete(keys, timeout=left)
        except (TransportError, asyncio.TimeoutError) as e:
            log.warning("delete of %d chunk(s): lower tiers not confirmed: %s", len(keys), e)
            lower = 0
        return max(ram, int(lower or 0))

    # ------------------------------------------------------------- lease, release

    async def lease(self, chunk_ids: Sequence[str], ttl_s: float) -> None:
        """Keep chunks loadable for an engine's lookup-and-lock: with tiering, their RAM copies
        are not demoted and their lower-tier copies not removed for space until :meth:`release`
        or ``ttl_s``. Valkey's own eviction (``maxmemory-policy``) is out of reach: a chunk it
        drops meanwhile is a counted miss at load (docs/lmcache-mp.md)."""
        if self.tiers is None or not chunk_ids:
            return
        await self.tiers.lease([self.namespace.data_key(c) for c in chunk_ids], ttl_s)

    async def release(self, chunk_ids: Sequence[str]) -> None:
        if self.tiers is None or not chunk_ids:
            return
        await self.tiers.release([self.namespace.data_key(c) for c in chunk_ids])

    async def touch(self, chunk_ids: Sequence[str]) -> None:
        """The engine used these chunks without reading them here: with tiering, recency and
        admission count it like a hit."""
        if self.tiers is None:
            return
        for c in chunk_ids:
            await self.tiers.note_hit(self.namespace.data_key(c))

    async def list_ids(self, limit: int | None = None) -> list[str]:
        out: list[str] = []
        async for chunk in self.iter_ids():
            out.append(chunk)
            if limit is not None and len(out) >= limit:
                break
        return out

    async def iter_ids(self) -> AsyncIterator[str]:
        """Chunk ids of this namespace in Valkey RAM, as the server's SCAN yields them. The
        walk is bounded (docs/scan-bounds.md): a server that lies about its cursor ends it
        with a counted ``TransportError``; a key outside the namespace is counted and skipped."""
        async for key in self.transport.scan_iter(self.namespace.data_pattern()):
            try:
                chunk = self.namespace.chunk_id_of(key)
            except ValueError:  # the pattern asked for data keys of this namespace only
                metrics.record_error("scan", "protocol")
                log.warning("SCAN answered a key outside namespace %s: %r", self.namespace.digest, key[:80])
                continue
            yield chunk

    async def peek_headers(self, chunk_ids: Sequence[str]) -> list[codec.Header | None]:
        """Each chunk's verified header (metadata, payload length) without moving its payload:
        ``GETRANGE`` over RESP, a header-sized RMA window over fabric. ``None``: absent,
        unreadable, or not a valid header of this namespace."""
        if not chunk_ids:
            return []
        keys = [self.namespace.data_key(c) for c in chunk_ids]
        bufs = [bytearray(HEADER_SIZE) for _ in keys]
        timeout = self.settings.op_timeout_s
        try:
            got = await asyncio.wait_for(asyncio.gather(
                *(self.transport.getrange_into(k, 0, memoryview(b), timeout=timeout) for k, b in zip(keys, bufs)),
                return_exceptions=True), timeout + _GRACE_S)
        except (TransportError, asyncio.TimeoutError) as e:
            log.warning("reading %d chunk headers failed: %s", len(keys), e)
            return [None] * len(keys)
        out: list[codec.Header | None] = []
        for g, b in zip(got, bufs):
            if not isinstance(g, int) or isinstance(g, bool) or g < HEADER_SIZE:
                out.append(None)
                continue
            try:
                h = codec.decode_header(b)
            except CorruptChunk:
                out.append(None)
                continue
            out.append(h if h.namespace_digest == self.namespace.digest_bytes else None)
        return out

    def register_memory(self, addr: int, length: int) -> bool:
        """Register a caller-owned arena with the transport, once (RMA needs it; RESP does not).

        Returns False when the transport needs no registration.
        """
        if not self.transport.register(addr, length):
            return False
        metrics.set_registered_bytes(length)
        return True

    async def ping(self) -> bool:
        try:
            await self.transport.ping(timeout=self.settings.lookup_timeout_s)
            return True
        except TransportError:
            return False

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for t in list(self._background):
            t.cancel()
        if self._background:
            await asyncio.wait(list(self._background), timeout=1.0)
        if self._borrowed:
            return
        for obj in reversed(self.owned):
            await _close_quietly(obj)
        await self.transport.close()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _spawn_threadsafe(self, fn: Callable[..., Any], *args: Any) -> None:
        """``_spawn(fn(*args))`` on the store's loop, from the loop or any other thread."""
        loop = self._loop
        if loop is None:
            return
        try:
            if _running_loop() is loop:
                self._spawn(fn(*args))
            else:
                loop.call_soon_threadsafe(lambda: self._closed or self._spawn(fn(*args)))
        except RuntimeError:  # the loop is closed: the store is going away, nothing to report to
            pass


class _Releases:
    """Bookkeeping for ``get_many_into``'s ``on_release``: item i is handed back once it
    is known not to be a hit *and* no transfer can write into it any more."""

    def __init__(self, n: int, on_release: Callable[[int], None] | None, by_transport: bool) -> None:
        self.on_release = on_release
        self.by_transport = by_transport and on_release is not None
        # Free until a transfer targets it (``transfer_over_callback``); with RESP (no
        # callbacks) that never happens: a buffer is free once the call returned or raised.
        # (An item no transfer ever took, e.g. past the deadline before the first round, is
        # handed back at ``settle`` instead of never.)
        self.free = [True] * n
        self.miss: list[bool | None] = [None] * n  # None: not decided yet
        self.done = [False] * n

    def transfer_over_callback(self, i: int) -> Callable[[], None]:
        self.free[i] = False  # a (new) transfer may target it now

        def over() -> None:
            self.free[i] = True
            self._fire(i)

        return over

    def keep(self, i: int) -> None:
        self.miss[i] = False

    def settle(self) -> None:
        for i in range(len(self.miss)):
            if self.miss[i] is None:
                self.miss[i] = True
            self._fire(i)

    def _fire(self, i: int) -> None:
        if self.on_release is not None and self.free[i] and self.miss[i] and not self.done[i]:
            self.done[i] = True
            self.on_release(i)


# Transports honour their own deadline and report per-item results; our outer guard
# fires only if one does not, a little later, so finished items are not thrown away.
_GRACE_S = 0.25

_ABSENT = object()  # the server said "no such key": a plain miss, maybe a lower-tier hit
_MISSES_REPORTED = 4  # chunks a lookup reports missing to the tier manager (the first ones)

# CRC32C (hardware, ~25 GB/s per core here) releases the GIL: large payloads are checked on
# worker threads, concurrently, so a batch's checks overlap each other and the event loop
# keeps serving other I/O. Below the threshold a thread hop costs more than the check.
_CRC_THREAD_MIN = 256 << 10
_CRC_THREADS = min(8, os.cpu_count() or 2)
_crc_pool: concurrent.futures.ThreadPoolExecutor | None = None


async def _payload_crcs(payloads: Sequence[Sequence[memoryview]]) -> list[int]:
    """CRC32C of each payload (its parts chained). With several large ones, the batch is
    split into one run of consecutive payloads per worker thread: the checks run in
    parallel off the loop, and the loop is woken once per worker, not once per chunk (each
    wake-up is a system call and a loop turn)."""
    global _crc_pool
    sizes = [codec.parts_nbytes(p) for p in payloads]
    large = sum(n >= _CRC_THREAD_MIN for n in sizes)
    if large < 2:  # nothing to overlap: skip the thread hop
        return [codec.crc32c_parts(p) for p in payloads]
    if _crc_pool is None:
        _crc_pool = concurrent.futures.ThreadPoolExecutor(max_workers=_CRC_THREADS, thread_name_prefix="lmcv-crc")
    runs = _even_runs(sizes, min(_CRC_THREADS, large))
    jobs = [_crc_pool.submit(_crcs_of, payloads[a:b]) for a, b in runs]
    try:
        done = await asyncio.gather(*map(asyncio.wrap_future, jobs))
    except BaseException:
        # Cancelled (or failed): the workers read the caller's buffers, which the caller may
        # release as soon as we return. Queued runs never start; a running one is waited for
        # (at most one run's checksum, milliseconds, on the loop's thread).
        for job in jobs:
            job.cancel()
        concurrent.futures.wait(jobs)
        raise
    return [crc for part in done for crc in part]


def _crcs_of(payloads: Sequence[Sequence[memoryview]]) -> list[int]:
    return [codec.crc32c_parts(p) for p in payloads]


def _even_runs(sizes: Sequence[int], n: int) -> list[tuple[int, int]]:
    """``n`` (or fewer) consecutive runs of ``sizes``, each about an n-th of the bytes."""
    total, runs, start, acc = sum(sizes), [], 0, 0
    for i, size in enumerate(sizes):
        acc += size
        if acc * n >= total * (len(runs) + 1) and len(runs) < n - 1:
            runs.append((start, i + 1))
            start = i + 1
    runs.append((start, len(sizes)))
    return [r for r in runs if r[0] < r[1]]


_NEEDS_LOOP = object()  # a blocking lookup the transport cannot do off the loop
_KEYS_REMEMBERED = 1 << 16  # lookup keys kept per store (~20-30 MB at most, with tiering), then all forgotten


def _remembered(cache: dict[str, bytes], chunk_ids: Sequence[str],
                make: Callable[[Sequence[str]], list[bytes]]) -> list[bytes]:
    """The keys of ``chunk_ids``, the same bytes objects as the last lookup of those ids.

    An engine looks the same prefixes up again and again. A key object seen before carries
    its hash, so the transport's per-key dictionaries (a Cluster's slot per key) answer without
    hashing ~70 bytes per key again; and the keys are not formatted again either."""
    keys = list(map(cache.get, chunk_ids))
    if None in keys:
        if len(cache) + len(chunk_ids) > _KEYS_REMEMBERED:
            cache.clear()
        keys = make(chunk_ids)
        cache.update(zip(chunk_ids, keys))
    return keys


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _prefix(found: list[bool]) -> int:
    """How many from the first are true (a C-level scan: a lookup may hold thousands)."""
    try:
        return found.index(False)
    except ValueError:
        return len(found)


def _cause(e: BaseException) -> str:
    if isinstance(e, (asyncio.TimeoutError, DeadlineExceeded)):
        return "deadline"
    return getattr(e, "cause", "error")


async def open_store(
    settings: Settings, namespace: Namespace, *, tiering: "TieringSettings | None" = None
) -> ChunkStore:
    """Connect the transport that ``settings.transport`` asks for and wrap it in a store.

    ``tcp``: RESP over TCP/TLS/Unix. ``fabric``: libfabric RMA through a large-object
    module (ours or valkey-large-object), failing at start-up if it cannot be used.
    ``blob-tcp``: the same large objects moved inline over RESP (``BLOB.TCP_*``).
    ``auto``: fabric when the module answers and the provider opens, else RESP strings.

    ``tiering`` (enabled): lower tiers behind RAM, through a ``tierd`` next to
    Valkey (mode ``service``) or a manager embedded in this process (``embedded``).
    """
    from .transport.resp import RespClient

    owned: list[Any] = []  # closed by ChunkStore.close, in reverse order
    transport: ChunkTransport | None = None
    name = "resp"
    try:
        if settings.transport in ("fabric", "auto"):
            transport = await _open_fabric(settings)
            if transport is not None:
                name = "fabric"
        elif settings.transport == "blob-tcp":
            from .transport.blob_tcp import open_blob_tcp

            transport = await open_blob_tcp(settings)
            name = "blob-tcp"
        resp: Any = None
        if transport is None or (tiering is not None and tiering.enabled):
            resp = RespClient(settings)
            owned.append(resp)
            await resp.start()
        if transport is None:
            transport = resp
            owned.remove(resp)  # closed as the store's transport
        else:
            owned.insert(0, transport)
        tiers = None
        if tiering is not None and tiering.enabled:
            from .tiering.client import EmbeddedTierClient, RemoteTierClient

            if tiering.mode == "embedded":
                from .tiering.manager import TierManager

                manager = TierManager(settings, tiering, resp, tenant=settings.tenant)
                await manager.start()
                owned.append(manager)
                tiers = EmbeddedTierClient(manager)
            else:
                tiers = RemoteTierClient(resp, settings)
            owned.append(tiers)
    except BaseException:
        for obj in reversed(owned):
            await _close_quietly(obj)
        if transport is not None and transport not in owned:
            await _close_quietly(transport)
        raise
    store = ChunkStore(settings, namespace, transport, transport_name=name, tiers=tiers)
    store.owned = [o for o in owned if o is not transport]
    return store


async def _open_fabric(settings: Settings) -> ChunkTransport | None:
    """The fabric transport, or None when ``auto`` falls back to RESP."""
    try:
        from .transport.fabric import open_fabric_transport
    except ImportError as e:
        if settings.transport == "fabric":
            from .errors import FabricUnavailable

            raise FabricUnavailable(f"the fabric transport is not available in this build: {e}") from e
        return None
    try:
        return await open_fabric_transport(settings)
    except Exception as e:
        if settings.transport == "fabric":
            raise
        log.info("transport auto: fabric unavailable (%s); using RESP over TCP", e)
        return None


async def _close_quietly(obj: Any) -> None:
    try:
        await asyncio.wait_for(obj.close(), 5.0)
    except Exception as e:
        log.warning("closing %r failed: %s", obj, e)
