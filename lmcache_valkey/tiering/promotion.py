"""Promotion: a chunk a worker missed in RAM comes back from the fastest affordable lower tier.

Concurrent promotions of one chunk share one lower-tier read (a caller timing out does not
cancel it: the next caller finds the chunk in RAM). Tiers are tried fastest first; a tier
whose expected time (:class:`~.policy.CostModel`) exceeds ``min(recompute_budget_s, what is
left of the deadline)`` is skipped, re-checked before every read; reads the tier answered are
its samples, reads it did not answer (timeout, outage) are not; a skipped tier gets a probe
read every ``probe_interval_s`` (1 s), and a probe faster than the estimate restarts it. The
copy is verified (header, CRC32C by the tier; namespace here), then SET into RAM with the chunk's remaining
TTL; an object-tier hit is also copied to the faster tiers (``promote_to_nvme``). A
promotion never frees RAM itself: above the high watermark it wakes the demotion pass.

Never imports: aiobotocore, valkey-py, the store, the integrations.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Sequence

from .. import codec, metrics
from ..errors import TransportError
from ..keys import Namespace
from .context import Wing
from .deletion import Deleter
from .demotion import Demoter
from .ledger import ABSENT
from .markers import split_data_key
from .policy import CostModel

log = logging.getLogger(__name__)


class Promoter:
    def __init__(self, wing: Wing, *, demoter: Demoter, deleter: Deleter) -> None:
        self.w = wing
        self.ledger = wing.ledger
        self.demoter = demoter
        self.deleter = deleter
        self.cost = CostModel()
        self._promoting: dict[bytes, asyncio.Future[bool]] = {}

    async def promote(self, key: bytes, *, timeout: float) -> bool:
        """Bring ``key`` back into Valkey RAM from the fastest lower tier. True when staged.

        Coalesced: concurrent calls for one key share one lower-tier read. A caller timing
        out does not cancel the shared promotion. A chunk promoted for a caller stays in RAM
        until it was read (its hit) or ``promote_hold_s`` passed (``policy.Demotion``)."""
        fut = self._promoting.get(key)
        first = fut is None
        if fut is None:
            self.ledger.promoting(key, True)
            fut = asyncio.ensure_future(self._promote_one(key, time.monotonic() + timeout))
            self._promoting[key] = fut
            fut.add_done_callback(lambda _f, k=key: self._done(k))
        else:
            self.w.counters["promote_coalesced"] += 1
        try:
            ok = await asyncio.wait_for(asyncio.shield(fut), timeout)
        except asyncio.TimeoutError:
            tiers = self.ledger.tiers_of(key) or [t.name for t in self.w.tiers[-1:]]
            metrics.record_miss(tiers[0] if tiers else "ram", "deadline")
            return False
        if ok and not first:
            self._await_reader(key)  # the promotion held it for its first caller; one more reads it
        return ok

    def _await_reader(self, key: bytes) -> None:
        self.ledger.await_reader(key, time.monotonic() + self.w.ts.promote_hold_s)

    def _done(self, key: bytes) -> None:
        self._promoting.pop(key, None)
        self.ledger.promoting(key, False)

    async def _promote_one(self, key: bytes, deadline: float) -> bool:
        w, ledger = self.w, self.ledger
        t0 = time.perf_counter()
        gen = ledger.gen(key)
        r = ledger.get(key)
        if r is None:
            w.counters["promotion_misses"] += 1
            return False
        try:  # staged meanwhile (another worker's promotion finished just before)?
            left = min(w.timeout, max(0.001, deadline - time.monotonic()))
            if (await w.valkey.exists_many([key], timeout=left))[0]:
                w.counters["already_in_ram"] += 1
                self._await_reader(key)
                return True
        except TransportError:
            pass
        for name in ledger.tiers_of(key):
            tier = w.tier(name)
            remaining = deadline - time.monotonic()
            if tier is None or remaining <= 0:  # re-checked before every tier read (requests may have queued)
                metrics.record_miss(name, "deadline")
                break
            verdict = self.cost.admit(name, r.value_len, min(w.ts.recompute_budget_s, remaining))
            if verdict == CostModel.SKIP:
                w.counters["skipped_cost"] += 1
                metrics.record_miss(name, "deadline")
                continue
            r0 = time.perf_counter()
            try:
                got = await tier.read(key, r.value_len)
            except TransportError:
                # The tier did not answer (timeout, outage, breaker open): that says nothing
                # about its speed once it answers again, so it is no cost sample (the
                # breaker tracks availability). A black hole's timeout fed in as a sample
                # kept the tier "too slow" for minutes after it came back.
                continue
            if got is None:  # answered without a usable copy (absent, corrupt): timed like a read
                self.cost.failure(name, r.value_len, time.perf_counter() - r0, probe=verdict == CostModel.PROBE)
                continue
            # A probe restarts an estimate it beats: reads that waited out a black hole and
            # were answered when it lifted are timed as very slow reads, and used to keep the
            # tier skipped for minutes (issue 28: chunks nobody asked for during the outage).
            self.cost.observe(name, r.value_len, time.perf_counter() - r0, probe=verdict == CostModel.PROBE)
            hdr, payload = got
            if not self._compatible(key, hdr, name):
                got.release()
                await self.deleter.remove_copies([key], (name,))
                continue
            if not ledger.current(key, gen) or ledger.get(key) is None:
                got.release()  # deleted or expired while we read: never resurrect it
                w.counters["promotion_misses"] += 1
                return False
            # The copy records the chunk's expiry (the object listing cannot: after a restart
            # the ledger may not know it); without any, the configured TTL applies.
            expires_ms = got.expires_ms or r.expires_ms
            if got.expires_ms or not tier.remote:
                ledger.set_expiry(key, expires_ms)
            try:
                staged = await self._stage(key, [hdr, payload], expires_ms)
                if staged and not ledger.current(key, gen):  # deleted while staging
                    await w.valkey.delete([key], timeout=w.timeout)
                    staged = False
                faster = [t for t in w.tiers[: w.tiers.index(tier)] if ledger.state(key, t.name) == ABSENT]
                if staged and faster and w.ts.promote_to_nvme:
                    value = memoryview(bytes(hdr) + bytes(payload))
                    ttl = max(1, expires_ms - int(time.time() * 1000)) if expires_ms else 0
                    w.spawn(self.demoter.copy_down(key, value, ttl, gen, only=faster))
            finally:
                got.release()
            if not staged:
                continue
            w.counters["promotions"] += 1
            ledger.touch(key)
            self._await_reader(key)  # before the promotion ends: no demotion pass slips in between
            metrics.record_promotion(name, r.value_len)
            metrics.record_hit(name, "local", r.value_len - codec.HEADER_SIZE)
            metrics.observe_latency("promote", name, "local", time.perf_counter() - t0)
            return True
        w.counters["promotion_misses"] += 1
        return False

    def _compatible(self, key: bytes, hdr: memoryview, tier: str) -> bool:
        """The copy's header names the key's namespace (else: foreign, counted, removed)."""
        try:
            prefix, tenant, digest, _cid = split_data_key(key)
        except ValueError:
            return True  # not our key layout: nothing to compare with
        h = codec.decode_header(hdr)
        if h.namespace_digest == Namespace(prefix, tenant, digest).digest_bytes:
            return True
        log.warning("tiering: copy of %r in %s belongs to another namespace; removed", key, tier)
        self.w.counters["foreign"] += 1
        metrics.record_miss(tier, "foreign")
        return False

    async def _stage(self, key: bytes, parts: Sequence[memoryview], expires_ms: int) -> bool:
        w = self.w
        nbytes = sum(p.nbytes for p in parts)
        ttl_s = w.settings.ttl_s
        if expires_ms:
            ttl_s = (expires_ms - time.time() * 1000) / 1000
            if ttl_s <= 0:
                return False
        try:
            await self.demoter.make_room(nbytes)  # above maxmemory, Valkey's own policy evicts
            await w.valkey.set(key, list(parts), ttl_s=ttl_s, timeout=w.timeout)
            self.demoter.staged(key, nbytes)
            return True
        except TransportError as e:
            log.warning("tiering: staging %r into RAM failed: %s", key, e)
            metrics.record_error("promote", getattr(e, "cause", "error"))
            return False


__all__ = ["Promoter"]
