"""Demotion: chunk values move from Valkey RAM down to the lower tiers.

- Admission (put and hit hints): a chunk the policy admits (second touch, frequency) is
  read from RAM once (PTTL, then GET) and written to every lower tier that lacks it: NVMe
  now, the object store write-behind. Each write is a ledger transition with a ticket, so a
  delete meanwhile drops or undoes it.
- The demotion pass (single-flight, woken by the background loop or by a promotion under
  memory pressure): the tenant's RAM chunks tierd knows of (its own index,
  :mod:`.key_index`: put and hit hints, its promotions; never a SCAN) with their OBJECT
  IDLETIME become
  :class:`~.policy.Candidate` facts, :class:`~.policy.Demotion` decides which RAM copies go
  and when the pass has freed enough; the pass copies down what it must first, then DELs.

Which copies move is decided only in :mod:`.policy` (and its settings); this module does
the I/O.

Never imports: aiobotocore, valkey-py, the store, the integrations.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable, Sequence

from .. import metrics
from ..errors import TransportError
from .context import Wing
from .ledger import ABSENT, DOOMED, DURABLE, WRITING
from .policy import Admission, Candidate, Demotion, MemoryState, parse_info_memory
from .tiers import LowerTier

log = logging.getLogger(__name__)

_COPIES_AT_ONCE = 8
_IDLE_BATCH = 256  # OBJECT IDLETIME commands per round


class Demoter:
    def __init__(self, wing: Wing, *, finish_removal: Callable[[bytes, LowerTier], Awaitable[bool]]) -> None:
        self.w = wing
        self.ledger = wing.ledger
        ts = wing.ts
        self.admission = Admission(ts.admission_min_touches, ts.admission_window)
        self.policy = Demotion(ts.demote_high_watermark, ts.demote_low_watermark, ts.demote_idle_s)
        self._finish_removal = finish_removal  # a pending removal of an older copy, sent first
        self._copying: dict[bytes, asyncio.Task[bool]] = {}
        self._copy_sem = asyncio.Semaphore(_COPIES_AT_ONCE)
        self.wake = asyncio.Event()  # a promotion under memory pressure wakes the demotion pass
        self._free_lock = asyncio.Lock()  # one demotion pass at a time
        self._mem: MemoryState | None = None
        self._mem_at = 0.0

    # --- admission (put/hit hints) -----------------------------------------------------------
    def note_put(self, key: bytes, nbytes: int = 0) -> None:
        """A chunk was written to RAM. Cheap; the copy to lower tiers runs in the background.

        A put hint may arrive after a delete of the same key (hints are batched): it never
        clears the delete. A copy reads the value from RAM under the current generation, so
        only a value put again after the delete can be copied."""
        self.w.ram.add_soon(key)
        self._touch(key)

    def note_hit(self, key: bytes) -> None:
        self.w.ram.add_soon(key)  # also a chunk put before tierd heard of it (a lost hint)
        self.ledger.touch(key)
        self.ledger.reader_done(key)  # a promotion waiting for this read may let the copy go now
        self._touch(key)

    def forget(self, keys: Sequence[bytes]) -> None:
        for k in keys:
            self.admission.forget(k)

    def copying(self, key: bytes) -> bool:
        return key in self._copying

    @property
    def in_flight(self) -> int:
        """Copy-downs running now."""
        return len(self._copying)

    def _touch(self, key: bytes) -> None:
        self.admission.touch(key)
        w = self.w
        if w.closing or not w.tiers or key in self._copying or self._has_all_copies(key):
            return
        first = w.tiers[0].name
        if self.admission.admit(key):
            w.counters["admitted"] += 1
            metrics.record_admission(first, True)
            self._copying[key] = t = asyncio.ensure_future(self.copy_down(key, gen=self.ledger.gen(key)))
            t.add_done_callback(lambda _t, k=key: self._copying.pop(k, None))
        elif self.admission.count(key) == 1:
            w.counters["rejected"] += 1
            metrics.record_admission(first, False)

    def _has_all_copies(self, key: bytes) -> bool:
        return bool(self.ledger.tiers_of(key)) and all(
            self.ledger.state(key, t.name) in (WRITING, DURABLE) for t in self.w.tiers)

    async def copy_down(self, key: bytes, value: memoryview | None = None, pttl_ms: int | None = None,
                        gen: int | None = None, only: Sequence[LowerTier] | None = None) -> bool:
        """Copy one chunk from RAM (or ``value``) to the lower tiers (``only``: those) that lack it."""
        w, ledger = self.w, self.ledger
        gen = ledger.gen(key) if gen is None else gen
        async with self._copy_sem:
            try:
                if value is None:
                    # PTTL first, then GET: a key that expires in between reads as absent;
                    # -2 (gone) is never taken for "no expiry" (-1).
                    pttl = int(await w.valkey.command(b"PTTL", key, key=key, timeout=w.timeout))
                    if pttl == -2:
                        return False
                    raw = await w.valkey.command(b"GET", key, key=key, timeout=w.timeout)
                    if raw is None:
                        return False
                    value, pttl_ms = memoryview(raw), pttl
            except TransportError as e:
                log.debug("tiering: could not read %r from RAM for demotion: %s", key, e)
                return False
            if not ledger.current(key, gen):
                return False  # deleted while we read it
            expires_ms = int(time.time() * 1000) + pttl_ms if pttl_ms and pttl_ms > 0 else 0
            changed = False
            for t in (w.tiers if only is None else only):
                if ledger.state(key, t.name) == DOOMED and t.remote and not await self._finish_removal(key, t):
                    continue  # an older copy's removal is pending: a new copy would race it
                if ledger.state(key, t.name) != ABSENT or not ledger.current(key, gen):
                    continue
                ticket = ledger.write(key, t.name)
                if not await t.write(key, [value], expires_ms=expires_ms, ticket=ticket):
                    ledger.dropped(key, t.name, ticket)
                elif not t.remote and ledger.state(key, t.name) == DURABLE:
                    metrics.record_demotion(t.name, value.nbytes)
                    changed = True
            if changed:
                await w.markers.sync([key])
            return bool(ledger.tiers_of(key)) or any(t.remote for t in w.tiers)

    async def flush(self, timeout: float | None = None) -> bool:
        """Wait for pending admissions, the tiers' write-behind and marker writes. True when
        all drained."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._copying:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            done, _ = await asyncio.wait(list(self._copying.values()), timeout=left)
            if not done and left == 0.0:
                return False
        for t in self.w.tiers:
            left = None if deadline is None else max(0.001, deadline - time.monotonic())
            if not await t.flush(left):
                return False
        await self.w.markers.settle()
        await self.w.ram.settle()
        return True

    async def drain(self, timeout: float | None = None) -> dict[str, Any]:
        """:meth:`flush`, then what could not be flushed (docs/tiering-tiers.md, "drain"):
        ``backlog`` (still queued: the store is down or slow), ``dropped`` (given up since the
        previous drain: queue full, refused, retries exhausted; each drop is reported once)
        and each write-behind tier's breaker. ``drained`` only when both are 0: after an
        outage an empty backlog may only mean that the uploads were dropped."""
        flushed = await self.flush(timeout)
        backlog = dropped = 0
        tiers: dict[str, dict[str, Any]] = {}
        for t in self.w.tiers:
            rep = t.report()
            n = t.take_unflushed()
            left = int(rep.get("backlog", 0) or 0)
            backlog += left
            dropped += n
            if t.remote:
                tiers[t.name] = {"backlog": left, "dropped": n, "breaker": rep.get("breaker")}
        return {"drained": flushed and not backlog and not dropped, "backlog": backlog, "dropped": dropped,
                "tiers": tiers}

    async def close(self, deadline: float) -> None:
        """Wait for the copies in flight until ``deadline`` (monotonic), then stop them."""
        if self._copying:
            await asyncio.wait(list(self._copying.values()), timeout=max(0.0, deadline - time.monotonic()))
        copying = list(self._copying.values())
        for t in copying:
            t.cancel()
        await asyncio.gather(*copying, return_exceptions=True)

    # --- memory --------------------------------------------------------------------------------
    async def memory(self, max_age: float = 0.2) -> MemoryState:
        """Valkey's used memory against ``maxmemory`` (the fullest primary), cached ``max_age``."""
        now = time.monotonic()
        if self._mem is None or now - self._mem_at > max_age:
            replies = await self.w.valkey.command_all_primaries(b"INFO", b"memory", timeout=self.w.timeout)
            self._mem = max((parse_info_memory(r) for r in replies), key=lambda m: m.ratio)
            self._mem_at = now
        return self._mem

    async def make_room(self, nbytes: int) -> None:
        """About to stage ``nbytes`` (a promotion): never free memory inline (a SCAN + OBJECT
        IDLETIME per promotion); wake the one demotion pass when it will be needed."""
        if self.policy.room_for(await self.memory(), nbytes):
            self.w.counters["demote_wakeups"] += 1
            self.wake.set()

    def staged(self, key: bytes, nbytes: int) -> None:
        """A promotion put ``key`` into RAM."""
        self.w.ram.add_soon(key)
        if self._mem is not None:
            self._mem = MemoryState(self._mem.used + nbytes, self._mem.maxmemory)

    # --- the demotion pass ---------------------------------------------------------------------
    def candidate(self, key: bytes, idle_s: float) -> Candidate:
        promoting, reader, leased = self.ledger.held(key, time.monotonic())
        return Candidate(key, idle_s, lower=bool(self.ledger.tiers_of(key)), admitted=self.admission.admit(key),
                         promoting=promoting, awaiting_reader=reader, leased=leased)

    async def candidates(self) -> list[Candidate]:
        """The tenant's RAM chunks tierd knows of (its index) with their idle time (OBJECT
        IDLETIME); index entries whose key is gone are removed."""
        w = self.w
        keys = await w.ram.members()
        out: list[Candidate] = []
        gone: list[bytes] = []
        for i in range(0, len(keys), _IDLE_BATCH):
            batch = keys[i : i + _IDLE_BATCH]
            idles = await asyncio.gather(
                *(w.valkey.command(b"OBJECT", b"IDLETIME", k, key=k, timeout=w.timeout) for k in batch),
                return_exceptions=True,
            )
            out.extend(self.candidate(k, int(t)) for t, k in zip(idles, batch) if isinstance(t, int))
            gone.extend(k for t, k in zip(idles, batch) if t is None)  # expired, evicted, deleted
        await w.ram.remove(gone)
        return out

    async def demote_once(self) -> int:
        """One demotion pass (single-flight). Returns the number of RAM copies removed."""
        async with self._free_lock:
            need = self.policy.bytes_to_free(await self.memory(max_age=0.0))
            if not need and self.policy.idle_s is None:
                return 0
            return await self._free(need)

    async def _free(self, need: int) -> int:
        w, ledger = self.w, self.ledger
        freed = removed = 0
        moved: list[bytes] = []
        for c in self.policy.plan(await self.candidates()):
            if self.policy.enough(freed, need, c.idle_s):
                break
            if not self.policy.eligible(self.candidate(c.key, c.idle_s)):
                continue  # held since the scan (a promotion, a lease)
            if not c.lower:
                await (self._copying.get(c.key) or asyncio.ensure_future(self.copy_down(c.key)))
                if not ledger.tiers_of(c.key):
                    continue  # refused, or the remote copy is not durable yet: keep RAM
            r = ledger.get(c.key)
            try:
                n = await w.valkey.delete([c.key], timeout=w.timeout)
            except TransportError:
                break
            if n:
                moved.append(c.key)
                removed += 1
                freed += r.value_len if r is not None else 0
                w.counters["demoted"] += 1
        await w.ram.remove(moved)
        if removed:
            self._mem = None
        return removed


__all__ = ["Demoter"]
