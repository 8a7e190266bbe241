"""TierManager: Valkey RAM (hot) -> NVMe (warm) -> object storage (cold), one façade.

Two placements, same code: embedded in the worker (``EmbeddedTierClient``), or ``tierd``
next to Valkey (:mod:`.tierd`, serving workers through Valkey lists: :mod:`.service`).
One engine per job works on shared state (:class:`~.context.Wing`, docs/layers.md):
:mod:`.demotion` (admission, copy-down, demotion pass; decisions in :mod:`.policy`),
:mod:`.promotion`, :mod:`.deletion` (delete, expiry, evict) and :mod:`.markers`, over the
:mod:`.ledger` (every state of a chunk in the lower tiers) and the lower tiers
(:class:`~.tiers.LowerTier`). This module starts them (the ledger rebuilt from the tiers'
inventories), runs the background loop, and offers leases (an engine's lookup-and-lock: the
RAM copy stays, lower copies are pinned: :mod:`.leases`).

Never imports: aiobotocore (only via .object_store), valkey-py, the store, the integrations.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Sequence

from ..config import Settings
from ..errors import TransportError
from .context import Wing
from .deletion import Deleter
from .demotion import Demoter
from .ledger import DOOMED
from .leases import Leases
from .promotion import Promoter
from .settings import TieringSettings
from .tiers import open_tiers

log = logging.getLogger(__name__)


class TierManager:
    def __init__(self, settings: Settings, ts: TieringSettings, valkey: Any, *, tenant: str | None = None) -> None:
        """``valkey``: a started :class:`~lmcache_valkey.transport.resp.RespClient` (not owned)."""
        self.w = w = Wing(settings, ts, valkey, tenant=tenant or settings.tenant)
        self.settings, self.ts, self.valkey, self.tenant = settings, ts, valkey, w.tenant
        self.ledger, self.markers, self.counters = w.ledger, w.markers, w.counters
        self.deleter = Deleter(w, forget=lambda keys: self.demoter.forget(keys))
        self.demoter = Demoter(w, finish_removal=self.deleter.finish)
        self.promoter = Promoter(w, demoter=self.demoter, deleter=self.deleter)
        self.leases = Leases(w)
        self._listed: set[str] = set()  # tiers whose inventory is in the ledger
        self._loops: list[asyncio.Task[Any]] = []

    def tier(self, name: str) -> Any:
        return self.w.tier(name)

    # --- lifecycle -------------------------------------------------------------------------
    async def start(self, *, background: bool = True) -> None:
        """Open the tiers, rebuild the ledger from their inventories (never a copy with a
        pending delete intent), re-assert tier markers, and (``background``) start the loop."""
        intents = await self.deleter.load_intents()
        self.w.tiers[:] = await open_tiers(self.ts, self.w)
        for k in intents:
            for t in self.w.tiers:
                self.ledger.doom(k, t.name)
        self.ledger.record_intent(intents)
        for t in self.w.tiers:
            await self.rebuild_index(t.name)
        await self.markers.reconcile()
        if intents and not self.w.remote_tiers:
            await self.deleter.retry()  # nothing remote: the intents are done
        if background:
            self._loops.append(asyncio.create_task(self._background(), name="lmcv-tier-demote"))
        log.info("tiering: started (%d chunks indexed: %s)", len(self.ledger), self.ledger.stats())

    async def rebuild_index(self, tier: str) -> bool:
        """Put a tier's inventory into the ledger (at start; a remote listing that fails is
        retried by the background loop until it succeeds). True when listed."""
        t = self.w.tier(tier)
        if t is None or tier in self._listed:
            return True
        found = []
        try:
            async for f in t.inventory(self.tenant):
                found.append(f)
        except TransportError as e:
            log.warning("tiering: %s listing failed (%s); the ledger lacks it, retrying in the background", tier, e)
            return False
        self._listed.add(tier)
        for f in found:
            if self.ledger.state(f.key, tier) == DOOMED:
                if not t.remote:  # a delete intent names it: never indexed, removed now
                    await t.remove(f.key)
                continue
            self.ledger.found(f.key, tier, f.value_len, last_access=f.mtime, expires_ms=f.expires_ms)
        if not t.remote:
            for k in self.ledger.doomed(tier):
                self.ledger.removed(k, tier)
        return True

    async def close(self, drain_timeout: float = 5.0) -> int:
        """Stop loops; wait for admissions; drain the write-behind within ``drain_timeout``.
        Returns chunks left undrained (counted as drops)."""
        self.w.closing = self.markers.closing = True
        for t in self._loops:
            t.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        self._loops.clear()
        deadline = time.monotonic() + drain_timeout
        await self.demoter.close(deadline)
        left = 0
        for t in self.w.remote_tiers:
            left += await t.close(max(0.001, deadline - time.monotonic()))
        await self.w.cancel_background()
        for t in self.w.tiers:
            if not t.remote:
                await t.close()
        return left

    async def settle(self, timeout: float | None = None) -> bool:
        """Wait for background work (marker writes, remote removals). True when none is left."""
        return await self.w.settle(timeout)

    # --- the engines' operations ------------------------------------------------------------
    def lease(self, keys: Sequence[bytes], ttl_s: float) -> None:
        self.leases.lease(keys, ttl_s)

    def release(self, keys: Sequence[bytes]) -> None:
        self.leases.release(keys)

    def note_put(self, key: bytes, nbytes: int = 0) -> None:
        self.demoter.note_put(key, nbytes)

    def note_hit(self, key: bytes) -> None:
        self.demoter.note_hit(key)

    def note_miss(self, keys: Sequence[bytes]) -> None:
        """A lookup missed ``keys``: re-create the markers Valkey lost of those a tier holds."""
        self.markers.missed(keys)

    async def promote(self, key: bytes, *, timeout: float) -> bool:
        return await self.promoter.promote(key, timeout=timeout)

    async def delete(self, keys: Sequence[bytes], *, timeout: float | None = None) -> int:
        return await self.deleter.delete(keys, timeout=timeout)

    async def evict(self, tier: str, *, keys: Sequence[bytes] | None = None, prefix: bytes | None = None) -> int:
        return await self.deleter.evict(tier, keys=keys, prefix=prefix)

    async def flush(self, timeout: float | None = None) -> bool:
        return await self.demoter.flush(timeout)

    async def drain(self, timeout: float | None = None) -> dict[str, Any]:
        """Flush, and report what could not be flushed (backlog left, uploads dropped)."""
        return await self.demoter.drain(timeout)

    async def demote_once(self) -> int:
        return await self.demoter.demote_once()

    async def repair_markers(self) -> int:
        return await self.markers.repair(complete=len(self._listed) == len(self.w.tiers),
                                         copying=self.demoter.copying)

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"manager": dict(self.counters), "index": self.ledger.stats(),
                               "cost": self.promoter.cost.snapshot(), "chunks_indexed": len(self.ledger),
                               "leases": self.ledger.lease_count}
        for t in self.w.tiers:
            out[t.name] = t.report()
        return out

    # --- the background loop ----------------------------------------------------------------
    async def _background(self) -> None:
        last_repair = time.monotonic()
        wake = self.demoter.wake
        while True:
            try:
                await asyncio.wait_for(wake.wait(), self.ts.demote_interval_s)
            except asyncio.TimeoutError:
                pass
            wake.clear()
            try:
                self.leases.expire()
                await self.deleter.expire()
                await self.demote_once()
                for t in self.w.tiers:
                    await self.rebuild_index(t.name)
                self.deleter.kick()
                if time.monotonic() - last_repair >= self.ts.marker_repair_s:
                    last_repair = time.monotonic()
                    await self.repair_markers()
            except asyncio.CancelledError:
                raise
            except TransportError as e:
                log.debug("tiering: background pass failed: %s", e)
            except Exception:  # noqa: BLE001 - a background loop must survive
                log.exception("tiering: background pass failed")


__all__ = ["TierManager"]
