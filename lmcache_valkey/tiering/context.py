"""What the tier manager's engines share (:class:`Wing`), and how tier events reach the ledger.

The engines (:mod:`.promotion`, :mod:`.demotion`, :mod:`.deletion`, :mod:`.markers`) each
do one kind of I/O; they find the Valkey client, the settings, the ledger, the lower tiers,
the counters and the background-task spawner here, so none reaches into another's fields.
:class:`Wing` is also the :class:`~.tiers.TierEvents` the tiers report to: every report
becomes a ledger transition.

Never imports: aiobotocore, valkey-py, the store, the integrations.
"""

from __future__ import annotations

import asyncio
from typing import Any, Coroutine

from ..config import Settings
from . import protocol
from .key_index import KeyIndex
from .ledger import Ledger
from .markers import Markers
from .settings import TieringSettings
from .tiers import LowerTier

COUNTERS = (
    "promotions", "promotion_misses", "promote_coalesced", "skipped_cost", "already_in_ram", "foreign",
    "markers_restored", "admitted", "rejected", "demoted", "ram_evicted", "deleted", "expired", "requests",
    "bad_requests", "s3_deletes_pending", "stale_markers_removed", "demote_wakeups", "leases_refused",
)


def tier_names(ts: TieringSettings) -> tuple[str, ...]:
    """The lower tiers ``ts`` configures, fastest first (as :func:`~.tiers.open_tiers` opens them)."""
    return tuple(name for name, on in (("nvme", ts.nvme_dir), ("s3", ts.s3_bucket)) if on)


class Wing:
    def __init__(self, settings: Settings, ts: TieringSettings, valkey: Any, *, tenant: str) -> None:
        self.settings, self.ts, self.valkey = settings, ts, valkey
        self.tenant = tenant
        self.key_prefix = settings.key_prefix
        self.timeout = settings.op_timeout_s
        self.counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self.tiers: list[LowerTier] = []  # opened by the manager's start(), fastest first
        self._tasks: set[asyncio.Task[Any]] = set()
        self.closing = False
        self.markers: Markers
        self.ledger = Ledger(tier_names(ts), max_leases=ts.max_leases,
                             on_change=lambda key: self.markers.sync_soon(key))
        self.markers = Markers(valkey, self.ledger, key_prefix=self.key_prefix, tenant=tenant,
                               timeout=self.timeout, spawn=self.spawn, counters=self.counters)
        # The chunk values tierd knows to be in RAM (hints, its promotions): what the demotion
        # pass and `evict ram` look at, instead of listing the keyspace (docs/tiering-index.md).
        self.ram = KeyIndex(valkey, protocol.ram_index_key(self.key_prefix, tenant), timeout=self.timeout,
                            spawn=self.spawn)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coro`` in the background, referenced until done (and cancelled at close)."""
        t = asyncio.ensure_future(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    @property
    def busy(self) -> bool:
        return bool(self._tasks)

    async def settle(self, timeout: float | None = None) -> bool:
        """Wait for background work (marker writes, object deletes, undo of stale copies)."""
        loop = asyncio.get_running_loop()
        end = None if timeout is None else loop.time() + timeout
        while self._tasks:
            left = None if end is None else end - loop.time()
            if left is not None and left <= 0:
                return False
            await asyncio.wait(list(self._tasks), timeout=left)
        return True

    async def cancel_background(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def tier(self, name: str) -> LowerTier | None:
        return next((t for t in self.tiers if t.name == name), None)

    @property
    def remote_tiers(self) -> list[LowerTier]:
        return [t for t in self.tiers if t.remote]

    # --- TierEvents: what the tiers report, as ledger transitions --------------------------------
    def wanted(self, tier: str, key: bytes, ticket: int) -> bool:
        return self.ledger.wanted(key, tier, ticket)

    def landed(self, tier: str, key: bytes, ticket: int, value_len: int, expires_ms: int) -> bool:
        return self.ledger.landed(key, tier, ticket, value_len, expires_ms)

    def dropped(self, tier: str, key: bytes, ticket: int) -> None:
        self.ledger.dropped(key, tier, ticket)

    def lost(self, tier: str, key: bytes) -> None:
        self.ledger.lost(key, tier)


__all__ = ["COUNTERS", "Wing", "tier_names"]
