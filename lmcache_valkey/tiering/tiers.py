"""The lower tiers behind Valkey RAM, as one protocol: :class:`LowerTier`.

NVMe (:mod:`.nvme`) and the object store (:mod:`.object_store`) implement it; the manager
holds them in ``tiers`` (fastest first) and loops over them, never naming one. What differs
between them is declared, not tested by name:

- ``remote``: removals may fail or hang (a network store). They are recorded as delete
  intents in Valkey first and retried in the background until the tier confirms; a local
  tier's removal is done before ``remove`` returns.
- ``write`` is durable on return for a local tier; a remote tier queues it (write-behind)
  and reports the outcome later, through :class:`TierEvents`. Either way the outcome reaches
  the ledger by the same two calls (``landed``/``dropped``).
- ``inventory`` lists what the tier holds for a restart; ``Found.expires_ms`` is None where
  the listing cannot tell a copy's expiry (the object listing), and ``expiry_of`` reads it.

Also here: :class:`ChunkRead` (a verified copy read into a pooled buffer) and :class:`Pins`
(reads and leases that keep a copy from being removed under them).

Never imports: aiobotocore (only :mod:`.object_store` does, and only :func:`open_tiers`
imports that), a transport, the store.
"""

from __future__ import annotations

import asyncio
import enum
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Iterator, Protocol, Sequence

from ..extras import missing_extra

if TYPE_CHECKING:
    from .settings import TieringSettings

Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True)
class Found:
    """One copy a tier's inventory lists (for rebuilding the ledger at start)."""

    key: bytes  # the Valkey data key
    value_len: int
    mtime: float
    expires_ms: int | None = 0  # Unix ms; 0 = never; None = the listing cannot tell


class Removal(enum.Enum):
    GONE = "gone"  # removed (a read holding it finishes first; nothing serves it meanwhile)
    ABSENT = "absent"  # the tier held no copy
    PENDING = "pending"  # not confirmed yet (a read holds it on a remote tier): ask again later


class TierEvents(Protocol):
    """What a tier reports about its copies (the manager turns it into ledger transitions).

    ``ticket`` names one ``write``: a copy that lands after a newer event (a delete, another
    write) is recognised as stale by it."""

    def wanted(self, tier: str, key: bytes, ticket: int) -> bool:
        """Is the write ``ticket`` still wanted (asked before and after a remote upload)?"""

    def landed(self, tier: str, key: bytes, ticket: int, value_len: int, expires_ms: int) -> bool:
        """The write is durable. False: it is stale; the tier removes the copy it just wrote."""

    def dropped(self, tier: str, key: bytes, ticket: int) -> None:
        """The write was given up (refused for good, retries exhausted, closed with a backlog)."""

    def lost(self, tier: str, key: bytes) -> None:
        """The tier dropped a copy on its own: evicted for space, found corrupt, absent or expired."""


class NoEvents:
    """Events nobody listens to (a tier used on its own: benchmarks, tests, the doctor)."""

    def wanted(self, tier: str, key: bytes, ticket: int) -> bool:
        return True

    def landed(self, tier: str, key: bytes, ticket: int, value_len: int, expires_ms: int) -> bool:
        return True

    def dropped(self, tier: str, key: bytes, ticket: int) -> None:
        pass

    def lost(self, tier: str, key: bytes) -> None:
        pass


class LowerTier(Protocol):
    """One lower tier: NVMe on the storage node, or an S3-compatible object store."""

    name: str  # "nvme" | "s3": metrics label, stats key, marker letter (markers.py)
    remote: bool  # removals may fail or hang: recorded as intents, retried in the background
    pins: "Pins"

    async def start(self) -> None:
        """Open the tier (a local tier also reads its inventory here)."""

    def inventory(self, tenant: str) -> AsyncIterator[Found]:
        """Every copy the tier holds for ``tenant``; raises TransportError when it cannot list."""

    async def write(self, key: bytes, parts: Sequence[Buffer], *, expires_ms: int = 0,
                    ticket: int | None = None) -> bool:
        """Store a chunk value (codec header + payload, possibly split in ``parts``).
        False: refused now, nothing more is reported. True: accepted; with a ``ticket`` the
        outcome is reported through the tier's events (a local tier before returning)."""

    async def read(self, key: bytes, value_len: int | None = None) -> "ChunkRead | None":
        """The verified copy, or None when the tier answered that it has no usable one (absent,
        corrupt, foreign, expired: counted, reported as ``lost``). Raises TransportError when
        the tier did not answer (outage, timeout, breaker open)."""

    async def remove(self, key: bytes) -> Removal:
        """Remove the copy; raises TransportError when a remote tier cannot take it now."""

    async def expiry_of(self, key: bytes) -> Found | None:
        """The copy's length and recorded expiry, or None when absent (TransportError: no answer)."""

    def available(self) -> bool:
        """Requests may go now (a remote tier's circuit breaker is not open)."""

    async def flush(self, timeout: float | None = None) -> bool:
        """Wait for accepted writes to become durable; True when none are left."""

    async def close(self, drain_timeout: float = 0.0) -> int:
        """Stop (draining accepted writes for up to ``drain_timeout``); returns writes left."""

    def take_unflushed(self) -> int:
        """Writes dropped since the last call instead of becoming durable (queue full, refused,
        retries exhausted): what a ``drain`` reports as not flushed (each drop once)."""

    def report(self) -> dict[str, Any]:
        """Counters and gauges for ``stats``."""


async def open_tiers(ts: "TieringSettings", events: TierEvents) -> list[LowerTier]:
    """The lower tiers ``ts`` configures, fastest first, started. On failure the ones already
    started are closed."""
    tiers: list[LowerTier] = []
    try:
        if ts.nvme_dir:
            from .nvme import NvmeTier

            tiers.append(NvmeTier(ts.nvme_dir, ts.nvme_budget_bytes, direct=ts.nvme_direct, threads=ts.nvme_threads,
                                  events=events, fsync_dir=ts.nvme_fsync_dir))
            await tiers[-1].start()
        if ts.s3_bucket:
            try:
                from .object_store import ObjectTier
            except ModuleNotFoundError as e:
                raise (missing_extra(e, "the S3 tier (s3_bucket)") or e) from None
            tiers.append(ObjectTier(ts, events=events))
            await tiers[-1].start()
    except BaseException:
        for t in tiers:
            await t.close()
        raise
    return tiers


class ChunkRead:
    """A verified chunk read from a lower tier: ``header`` (codec header) and ``payload``
    are views of one buffer that may be pooled; call :meth:`release` when done with them
    (after which the views must not be used)."""

    __slots__ = ("header", "payload", "_release", "expires_ms")

    def __init__(self, header: memoryview, payload: memoryview, release: Callable[[], None] | None = None,
                 *, expires_ms: int = 0) -> None:
        self.header, self.payload, self._release = header, payload, release
        self.expires_ms = expires_ms  # the copy's own record of the chunk's expiry (Unix ms, 0 = never)

    def release(self) -> None:
        r, self._release = self._release, None
        if r is not None:
            r()

    def __iter__(self):  # (header, payload) unpacking
        return iter((self.header, self.payload))


class Pins:
    """Holds on one tier's copies: a copy pinned by an in-flight read (or a lease) is not
    removed until the pin goes; a removal asked meanwhile runs at the last unpin."""

    def __init__(self) -> None:
        self._n: Counter[bytes] = Counter()
        self._deferred: dict[bytes, list[Callable[[], object]]] = {}
        self._tasks: set[asyncio.Task[object]] = set()

    def pinned(self, key: bytes) -> bool:
        return self._n[key] > 0

    @contextmanager
    def pin(self, key: bytes) -> Iterator[None]:
        self.hold(key)
        try:
            yield
        finally:
            self.drop(key)

    def hold(self, key: bytes) -> None:
        """Take a pin that outlives one read (a lookup-and-lock lease); :meth:`drop` ends it."""
        self._n[key] += 1

    def drop(self, key: bytes) -> None:
        """End one pin; at the last one, removals deferred meanwhile run."""
        if self._n[key] <= 0:
            del self._n[key]
            return
        self._n[key] -= 1
        if self._n[key] <= 0:
            del self._n[key]
            for fn in self._deferred.pop(key, []):
                r = fn()
                if asyncio.iscoroutine(r):
                    t = asyncio.ensure_future(r)
                    self._tasks.add(t)  # referenced until done (the loop keeps only weak refs)
                    t.add_done_callback(self._tasks.discard)

    def defer(self, key: bytes, fn: Callable[[], object]) -> bool:
        """Run ``fn`` now (returns False) or at the last unpin (returns True)."""
        if self._n[key] > 0:
            self._deferred.setdefault(key, []).append(fn)
            return True
        if key in self._n:
            del self._n[key]
        return False


__all__ = ["ChunkRead", "Found", "LowerTier", "NoEvents", "Pins", "Removal", "TierEvents", "open_tiers"]
