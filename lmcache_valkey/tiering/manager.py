"""TierManager: Valkey RAM (hot) -> NVMe (warm) -> object storage (cold).

One class, two placements (same code):

- embedded: created in the worker, next to the store; ``TierClient.embedded(manager)``;
- service: ``tierd`` next to Valkey (:mod:`.service`); :meth:`serve_requests` consumes the
  per-tenant request list in Valkey (docs/tiering-promotion.md), so workers need no extra
  port: ``TierClient.remote(...)``.

Flows:

- put hint (``note_put``/``note_hit``) -> admission (second touch / frequency) -> the chunk
  value is read from RAM once and written to NVMe (durable on return) and queued for the
  object tier (write-behind). A tier marker in Valkey records lower-tier presence.
- demotion: above the high watermark of Valkey ``maxmemory`` (INFO memory), or idle longer
  than ``demote_idle_s`` (OBJECT IDLETIME), RAM copies that a lower tier holds are removed
  (most idle first) down to the low watermark; admitted chunks without a lower copy are
  written first.
- promotion: on a RAM miss, the fastest affordable lower tier is read (verified), staged into
  RAM with SET, and the normal fast path serves it. Concurrent promotions of one chunk share
  one lower-tier read. A tier whose expected time exceeds the recompute budget or the
  caller's deadline is skipped.
- delete/evict/expiry are applied to RAM, marker, index and every lower tier; a copy pinned
  by an in-flight read is removed when the read finishes. A delete changes the key's
  generation (copies/uploads of an older one are dropped) and, with an object tier, records
  a delete intent in Valkey first; object DELETEs the store cannot take now are resent by a
  background task, also after a restart (docs/tiering-tiers.md, "Delete, step by step").
- promotion never frees RAM inline: under memory pressure it wakes the (single) demotion pass.
- leases (:meth:`lease`/:meth:`release`, an engine's lookup-and-lock): a leased chunk's RAM
  copy is skipped by demotion and its lower-tier copies are pinned (never evicted for
  space; a delete meanwhile removes them at the release) until released or past the
  lease's deadline, which bounds what a worker that died holding it can keep.

Never imports: aiobotocore (only via .object_store), valkey-py, the store, the integrations.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections import OrderedDict
from typing import Any, Sequence

from .. import codec
from ..config import Settings
from ..errors import ServerError, TransportError
from ..extras import missing_extra
from .. import metrics
from . import protocol, requests
from ..keys import Namespace
from .index import LOWER_TIERS, ChunkRead, TierIndex, data_of, marker_of, marker_value, split_data_key
from .nvme import NvmeTier
from .policy import Admission, CostModel, Demotion, MemoryState, parse_info_memory
from .settings import TieringSettings

log = logging.getLogger(__name__)

_TOMBSTONES_MAX = 100_000
_SERVE_MAX = 256  # requests handled at once by serve_requests (then BLPOP waits)
_DELETE_BATCH = 256  # object deletes retried per background pass
_REPLY_SCRIPT = b"redis.call('RPUSH', KEYS[1], ARGV[1]); return redis.call('PEXPIRE', KEYS[1], ARGV[2])"


class TierManager:
    def __init__(self, settings: Settings, ts: TieringSettings, valkey: Any, *, tenant: str | None = None) -> None:
        """``valkey``: a started :class:`~lmcache_valkey.transport.resp.RespClient` (not owned)."""
        self.settings = settings
        self.ts = ts
        self.valkey = valkey
        self.tenant = tenant or settings.tenant
        self.key_prefix = settings.key_prefix
        self.timeout = settings.op_timeout_s
        self.index = TierIndex()
        self.admission = Admission(ts.admission_min_touches, ts.admission_window)
        self.demotion = Demotion(ts.demote_high_watermark, ts.demote_low_watermark, ts.demote_idle_s)
        self.cost = CostModel()
        self.nvme: NvmeTier | None = None
        self.s3 = None  # ObjectTier, imported lazily (aiobotocore stays optional)
        if ts.nvme_dir:
            self.nvme = NvmeTier(ts.nvme_dir, ts.nvme_budget_bytes, direct=ts.nvme_direct,
                                 threads=ts.nvme_threads, on_evict=self._on_nvme_gone,
                                 fsync_dir=ts.nvme_fsync_dir)
        self._promoting: dict[bytes, asyncio.Future[bool]] = {}
        self._copying: dict[bytes, asyncio.Task[bool]] = {}
        self._copy_sem = asyncio.Semaphore(8)
        # key -> generation of its last delete. A copy or upload started under another
        # generation is dropped/undone: a late put hint can never resurrect a deleted chunk.
        self._tombstones: OrderedDict[bytes, int] = OrderedDict()
        self._gen_seq = itertools.count(1)
        self._s3_pending: set[bytes] = set()  # queued for upload, not durable yet
        self._s3_doomed: set[bytes] = set()  # object DELETEs still to send (retried in the background)
        self._intents: set[bytes] = set()  # of those, recorded in Valkey's delete-intent hash
        self._listed = False  # the object listing went into the index
        self._wake = asyncio.Event()  # promotion under memory pressure wakes the demotion loop
        self._free_lock = asyncio.Lock()  # one demotion pass at a time
        self._serve_sem = asyncio.Semaphore(_SERVE_MAX)
        self._scripts = True  # EVAL allowed (replies), until Valkey says otherwise
        self._del_key = protocol.delete_key(self.key_prefix, self.tenant)
        self._scope = requests.TenantScope(self.key_prefix, self.tenant)  # what requests may name
        self._bad_log = requests.RateLimitedLog(log, "tierd: bad request refused")
        self._deleter: asyncio.Task[int] | None = None
        self._exp_unknown: set[bytes] = set()  # listed objects whose expiry is not known yet
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loops: list[asyncio.Task[Any]] = []
        self._mem: MemoryState | None = None
        # chunk -> [holders, deadline (monotonic), the lower tiers whose pins it holds]
        self._leases: dict[bytes, list[Any]] = {}
        self._mem_at = 0.0
        self._closing = False
        self.stats_counters = {
            "promotions": 0, "promotion_misses": 0, "promote_coalesced": 0, "skipped_cost": 0, "already_in_ram": 0, "foreign": 0, "markers_restored": 0,
            "admitted": 0, "rejected": 0, "demoted": 0, "ram_evicted": 0, "deleted": 0, "expired": 0,
            "requests": 0, "bad_requests": 0, "s3_deletes_pending": 0, "stale_markers_removed": 0,
            "demote_wakeups": 0,
        }

    # --- lifecycle -------------------------------------------------------------------------
    async def start(self, *, background: bool = True) -> None:
        """Open tiers, rebuild the index from NVMe headers and the object listing, re-assert
        tier markers, and (``background``) start the demotion/expiry loop."""
        doomed = await self._load_intents()
        if self.nvme is not None:
            for e in await self.nvme.start():
                if e.key in doomed:
                    await self.nvme.remove(e.key)
                    continue
                self.index.add(e.key, "nvme", e.value_len, last_access=e.mtime, expires_ms=e.expires_ms)
        if self.ts.s3_bucket:
            try:
                from .object_store import ObjectTier
            except ModuleNotFoundError as e:
                raise (missing_extra(e, "the S3 tier (s3_bucket)") or e) from None

            self.s3 = ObjectTier(self.ts, on_durable=self._on_durable, is_wanted=self._current, on_gone=self._on_s3_gone)
            await self.s3.start()
            self._s3_doomed |= doomed
            await self.rebuild_object_index()
        await self.reconcile_markers()
        if self.s3 is None and doomed:
            await self.retry_deletes()  # nothing lower than NVMe: the intents are done
        if background:
            self._loops.append(asyncio.create_task(self._demotion_loop(), name="lmcv-tier-demote"))
        log.info("tiering: started (%d chunks indexed: %s)", len(self.index), self.index.stats())

    async def rebuild_object_index(self) -> bool:
        """Index the object listing (at start; retried by the background loop until it
        succeeds). Objects with a pending delete are not indexed. True when listed."""
        if self.s3 is None or self._listed:
            return True
        found: list[Any] = []
        try:
            async for o in self.s3.list_objects(self.tenant):
                found.append(o)
        except TransportError as e:
            log.warning("tiering: object listing failed (%s); index holds NVMe only, retrying in the background", e)
            return False
        self._listed = True
        for o in found:
            if o.key in self._s3_doomed:
                continue
            self.index.add(o.key, "s3", o.value_len, last_access=o.mtime, expires_ms=o.expires_ms)
            if not o.expires_ms:
                self._exp_unknown.add(o.key)  # the listing cannot tell: HEAD in the background
            if self._loops:  # listed late: markers for what was found
                self._spawn(self._sync_marker(o.key))
        return True

    async def _load_intents(self, *, quiet: bool = False) -> set[bytes]:
        """Delete intents recorded in Valkey (by this manager before a restart, or by workers)."""
        try:
            r = await self.valkey.command(b"HKEYS", self._del_key, key=self._del_key, timeout=self.timeout)
        except TransportError as e:
            (log.debug if quiet else log.warning)("tiering: delete intents unreadable (%s); retried in the background", e)
            return set()
        keys = {bytes(k) for k in r or ()}
        # Workers write this hash: an intent naming anything but this tenant's chunks is
        # never applied (tierd may run with a wider account), and is removed.
        foreign = {k for k in keys if not self._scope.owns(k)}
        if foreign:
            keys -= foreign
            self.stats_counters["bad_requests"] += len(foreign)
            self._bad_log.note(f"{len(foreign)} delete intent(s) outside tenant {self.tenant!r} ignored")
            try:
                await self.valkey.command(b"HDEL", self._del_key, *foreign, key=self._del_key, timeout=self.timeout)
            except TransportError as e:
                log.debug("tiering: foreign delete intents not removed: %s", e)
        self._intents |= keys
        return keys

    async def close(self, drain_timeout: float = 5.0) -> int:
        """Stop loops; wait for admissions; drain the object backlog within ``drain_timeout``.
        Returns chunks left undrained (counted as drops)."""
        self._closing = True
        for t in self._loops:
            t.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        self._loops.clear()
        deadline = time.monotonic() + drain_timeout
        if self._copying:
            await asyncio.wait(list(self._copying.values()), timeout=max(0.0, deadline - time.monotonic()))
        copying = list(self._copying.values())
        for t in copying:  # past the drain deadline: stop them
            t.cancel()
        await asyncio.gather(*copying, return_exceptions=True)
        left = 0
        if self.s3 is not None:
            left = await self.s3.close(max(0.001, deadline - time.monotonic()))
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.nvme is not None:
            await self.nvme.close()
        return left

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        t = asyncio.ensure_future(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    # --- leases (lookup-and-lock) -----------------------------------------------------------
    def lease(self, keys: Sequence[bytes], ttl_s: float) -> None:
        """Keep ``keys`` loadable for up to ``ttl_s``: no demotion of their RAM copies, no
        removal of their lower-tier copies for space. Counted: each call needs a release."""
        deadline = time.monotonic() + ttl_s
        for k in keys:
            e = self._leases.get(k)
            if e is not None:
                e[0] += 1
                e[1] = max(e[1], deadline)
                continue
            held = [t for t in (self.nvme, self.s3) if t is not None]
            for t in held:
                t.pins.hold(k)
            self._leases[k] = [1, deadline, held]

    def release(self, keys: Sequence[bytes]) -> None:
        """End one lease of each key (unknown or expired keys are ignored)."""
        for k in keys:
            e = self._leases.get(k)
            if e is None:
                continue
            e[0] -= 1
            if e[0] <= 0:
                self._end_lease(k)

    def leased(self, key: bytes) -> bool:
        e = self._leases.get(key)
        return e is not None and e[1] > time.monotonic()

    def expire_leases(self) -> int:
        """End leases past their deadline (their holder is gone or forgot to release)."""
        now = time.monotonic()
        late = [k for k, e in self._leases.items() if e[1] <= now]
        for k in late:
            self._end_lease(k)
        return len(late)

    def _end_lease(self, key: bytes) -> None:
        e = self._leases.pop(key)
        for t in e[2]:
            t.pins.drop(key)

    # --- markers and index callbacks --------------------------------------------------------
    async def _sync_marker(self, key: bytes) -> None:
        tiers = self.index.tiers_of(key)
        mk = marker_of(key)
        gen = self._gen(key)
        try:
            if tiers:
                e = self.index.get(key)
                args: list[Any] = [b"SET", mk, marker_value(tiers)]
                if e is not None and e.expires_ms:
                    args += [b"PXAT", e.expires_ms]
                await self.valkey.command(*args, key=mk, timeout=self.timeout)
                # A delete/expiry that ran while the SET was in flight may have sent its DEL
                # first: re-check, and take the marker back if the chunk is gone now.
                if not self.index.tiers_of(key) or self._gen(key) != gen:
                    await self.valkey.delete([mk], timeout=self.timeout)
            else:
                await self.valkey.delete([mk], timeout=self.timeout)
        except TransportError as e:
            log.debug("tiering: marker update for %r failed: %s", key, e)

    async def reconcile_markers(self) -> int:
        """(Re)write the marker of every indexed chunk (after a restart, or a Valkey restart)."""
        keys = self.index.keys()
        for i in range(0, len(keys), 256):
            await asyncio.gather(*(self._sync_marker(k) for k in keys[i : i + 256]))
        return len(keys)

    def _on_nvme_gone(self, key: bytes) -> None:
        self.index.discard(key, "nvme")
        if not self._closing:
            self._spawn(self._sync_marker(key))

    def _on_s3_gone(self, key: bytes) -> None:
        self.index.discard(key, "s3")
        if not self._closing:
            self._spawn(self._sync_marker(key))

    def _on_durable(self, key: bytes, value_len: int, expires_ms: int, gen: int = 0) -> None:
        if not self._current(key, gen):
            return  # deleted meanwhile (the uploader undoes it)
        self._s3_pending.discard(key)
        self.index.add(key, "s3", value_len, expires_ms=expires_ms)
        self._spawn(self._sync_marker(key))

    def _gen(self, key: bytes) -> int:
        return self._tombstones.get(key, 0)

    def _current(self, key: bytes, gen: int) -> bool:
        """No delete of ``key`` happened since generation ``gen`` was read."""
        return self._tombstones.get(key, 0) == gen

    # --- admission (put/hit hints) ---------------------------------------------------------
    def note_put(self, key: bytes, nbytes: int = 0) -> None:
        """A chunk was written to RAM. Cheap; the copy to lower tiers runs in the background.

        A put hint may arrive after a delete of the same key (hints are batched): it never
        clears the delete. A copy reads the value from RAM under the current generation, so
        only a value put again after the delete can be copied."""
        self._touch(key)

    def note_hit(self, key: bytes) -> None:
        self.index.touch(key)
        self._touch(key)

    def _touch(self, key: bytes) -> None:
        self.admission.touch(key)
        if self._closing or key in self._copying or self._has_all_copies(key):
            return
        if self.admission.admit(key):
            self.stats_counters["admitted"] += 1
            metrics.record_admission("nvme" if self.nvme else "s3", True)
            self._copying[key] = t = asyncio.ensure_future(self._copy_down(key, gen=self._gen(key)))
            t.add_done_callback(lambda _t, k=key: self._copying.pop(k, None))
        elif self.admission.count(key) == 1:
            self.stats_counters["rejected"] += 1
            metrics.record_admission("nvme" if self.nvme else "s3", False)

    def _has_all_copies(self, key: bytes) -> bool:
        e = self.index.get(key)
        if e is None:
            return False
        return (self.nvme is None or "nvme" in e.tiers) and (self.s3 is None or "s3" in e.tiers or key in self._s3_pending)

    async def _copy_down(self, key: bytes, value: memoryview | None = None, pttl_ms: int | None = None,
                         gen: int | None = None) -> bool:
        """Copy one chunk from RAM to NVMe (now) and the object tier (write-behind)."""
        gen = self._gen(key) if gen is None else gen
        async with self._copy_sem:
            try:
                if value is None:
                    # PTTL first, then GET: a key that expires in between reads as absent;
                    # -2 (gone) is never taken for "no expiry" (-1).
                    pttl = int(await self.valkey.command(b"PTTL", key, key=key, timeout=self.timeout))
                    if pttl == -2:
                        return False
                    raw = await self.valkey.command(b"GET", key, key=key, timeout=self.timeout)
                    if raw is None:
                        return False
                    value, pttl_ms = memoryview(raw), pttl
            except TransportError as e:
                log.debug("tiering: could not read %r from RAM for demotion: %s", key, e)
                return False
            if not self._current(key, gen):
                return False  # deleted while we read it
            expires_ms = int(time.time() * 1000) + pttl_ms if pttl_ms and pttl_ms > 0 else 0
            e = self.index.get(key)
            have = e.tiers if e is not None else set()
            changed = False
            if self.nvme is not None and "nvme" not in have:
                if await self.nvme.write(key, [value], expires_ms=expires_ms):
                    if not self._current(key, gen):
                        await self.nvme.remove(key)
                        return False
                    self.index.add(key, "nvme", value.nbytes, expires_ms=expires_ms)
                    metrics.record_demotion("nvme", value.nbytes)
                    changed = True
            if self.s3 is not None and "s3" not in have and key not in self._s3_pending:
                if self.s3.enqueue(key, value, expires_ms=expires_ms, gen=gen):
                    self._s3_pending.add(key)
            if changed:
                await self._sync_marker(key)
            return bool(self.index.tiers_of(key)) or (self.s3 is not None)

    async def flush(self, timeout: float | None = None) -> bool:
        """Wait for pending admissions and the object-tier backlog. True when all drained."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._copying:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            done, _ = await asyncio.wait(list(self._copying.values()), timeout=left)
            if not done and left == 0.0:
                return False
        if self.s3 is not None:
            left = None if deadline is None else max(0.001, deadline - time.monotonic())
            return await self.s3.flush(left)
        return True

    # --- promotion -------------------------------------------------------------------------
    async def promote(self, key: bytes, *, timeout: float) -> bool:
        """Bring ``key`` back into Valkey RAM from the fastest lower tier. True when staged.

        Coalesced: concurrent calls for one key share one lower-tier read. A caller timing
        out does not cancel the shared promotion."""
        fut = self._promoting.get(key)
        if fut is None:
            fut = asyncio.ensure_future(self._promote_one(key, time.monotonic() + timeout))
            self._promoting[key] = fut
            fut.add_done_callback(lambda _f, k=key: self._promoting.pop(k, None))
        else:
            self.stats_counters["promote_coalesced"] += 1
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except asyncio.TimeoutError:
            metrics.record_miss("nvme" if self.index.tiers_of(key)[:1] == ["nvme"] else "s3", "deadline")
            return False

    async def _promote_one(self, key: bytes, deadline: float) -> bool:
        t0 = time.perf_counter()
        gen = self._gen(key)
        e = self.index.get(key)
        if e is None:
            self.stats_counters["promotion_misses"] += 1
            return False
        try:  # staged meanwhile (another worker's promotion finished just before)?
            if (await self.valkey.exists_many([key], timeout=min(self.timeout, max(0.001, deadline - time.monotonic()))))[0]:
                self.stats_counters["already_in_ram"] += 1
                return True
        except TransportError:
            pass
        for tier in self.index.tiers_of(key):
            remaining = deadline - time.monotonic()
            if remaining <= 0:  # re-checked before every tier read (requests may have queued)
                metrics.record_miss(tier, "deadline")
                break
            budget = min(self.ts.recompute_budget_s, remaining)
            if not self.cost.affordable(tier, e.value_len, budget):
                self.stats_counters["skipped_cost"] += 1
                metrics.record_miss(tier, "deadline")
                continue
            r0 = time.perf_counter()
            got = await self._read_tier(tier, key, e.value_len)
            if got is None:
                self.cost.failure(tier, e.value_len, time.perf_counter() - r0)
                continue
            self.cost.observe(tier, e.value_len, time.perf_counter() - r0)
            hdr, payload = got
            if not self._compatible(key, hdr):
                got.release()
                await self._remove_lower([key], (tier,))
                continue
            if not self._current(key, gen) or self.index.get(key) is None:
                got.release()  # deleted or expired while we read: never resurrect it
                self.stats_counters["promotion_misses"] += 1
                return False
            # The copy records the chunk's expiry (the object listing cannot: after a restart
            # the index may not know it); without any, the configured TTL applies.
            expires_ms = got.expires_ms or e.expires_ms
            if got.expires_ms or tier != "s3":
                self._exp_unknown.discard(key)
            if expires_ms and expires_ms != e.expires_ms:
                self.index.add(key, tier, e.value_len, expires_ms=expires_ms)
                self._spawn(self._sync_marker(key))
            try:
                staged = await self._stage(key, [hdr, payload], expires_ms)
                if staged and not self._current(key, gen):  # deleted while staging
                    await self.valkey.delete([key], timeout=self.timeout)
                    staged = False
                if staged and tier == "s3" and self.nvme is not None and self.ts.promote_to_nvme and key not in self.nvme:
                    value = memoryview(bytes(hdr) + bytes(payload))
                    ttl = max(1, expires_ms - int(time.time() * 1000)) if expires_ms else 0
                    self._spawn(self._copy_down(key, value, ttl, gen))
            finally:
                got.release()
            if not staged:
                continue
            self.stats_counters["promotions"] += 1
            self.index.touch(key)
            metrics.record_promotion(tier, e.value_len)
            metrics.record_hit(tier, "local", e.value_len - codec.HEADER_SIZE)
            metrics.observe_latency("promote", tier, "local", time.perf_counter() - t0)
            return True
        self.stats_counters["promotion_misses"] += 1
        return False

    def _compatible(self, key: bytes, hdr: memoryview) -> bool:
        """The copy's header names the key's namespace (else: foreign, counted, removed)."""
        try:
            prefix, tenant, digest, _cid = split_data_key(key)
        except ValueError:
            return True  # not our key layout: nothing to compare with
        h = codec.decode_header(hdr)
        if h.namespace_digest == Namespace(prefix, tenant, digest).digest_bytes:
            return True
        log.warning("tiering: copy of %r belongs to another namespace; removed", key)
        self.stats_counters["foreign"] += 1
        metrics.record_miss("nvme", "foreign")
        return False

    async def _read_tier(self, tier: str, key: bytes, value_len: int) -> ChunkRead | None:
        if tier == "nvme" and self.nvme is not None:
            return await self.nvme.read_value(key)
        if tier == "s3" and self.s3 is not None:
            return await self.s3.read_value(key, value_len)
        return None

    async def _stage(self, key: bytes, parts: Sequence[memoryview], expires_ms: int) -> bool:
        nbytes = sum(p.nbytes for p in parts)
        ttl_s = self.settings.ttl_s
        if expires_ms:
            ttl_s = (expires_ms - time.time() * 1000) / 1000
            if ttl_s <= 0:
                return False
        try:
            # Never free memory inline (a SCAN + OBJECT IDLETIME per promotion): wake the one
            # demotion pass and stage now; above maxmemory Valkey's own policy evicts.
            mem = await self._memory()
            if self.demotion.room_for(mem, nbytes):
                self.stats_counters["demote_wakeups"] += 1
                self._wake.set()
            await self.valkey.set(key, list(parts), ttl_s=ttl_s, timeout=self.timeout)
            if self._mem is not None:
                self._mem = MemoryState(self._mem.used + nbytes, self._mem.maxmemory)
            return True
        except TransportError as e:
            log.warning("tiering: staging %r into RAM failed: %s", key, e)
            metrics.record_error("promote", getattr(e, "cause", "error"))
            return False

    # --- demotion --------------------------------------------------------------------------
    async def _memory(self, max_age: float = 0.2) -> MemoryState:
        now = time.monotonic()
        if self._mem is None or now - self._mem_at > max_age:
            replies = await self.valkey.command_all_primaries(b"INFO", b"memory", timeout=self.timeout)
            states = [parse_info_memory(r) for r in replies]
            self._mem = max(states, key=lambda m: m.ratio)
            self._mem_at = now
        return self._mem

    async def _candidates(self) -> list[tuple[int, bytes]]:
        """(idle seconds, key) of the tenant's RAM chunks, most idle first."""
        keys: list[bytes] = []
        async for k in self.valkey.scan_iter(protocol.data_pattern(self.key_prefix, self.tenant), self.ts.demote_scan_count):
            keys.append(k)
        out: list[tuple[int, bytes]] = []
        for i in range(0, len(keys), 256):
            batch = keys[i : i + 256]
            idles = await asyncio.gather(
                *(self.valkey.command(b"OBJECT", b"IDLETIME", k, key=k, timeout=self.timeout) for k in batch),
                return_exceptions=True,
            )
            out.extend((int(t), k) for t, k in zip(idles, batch) if isinstance(t, int))
        out.sort(key=lambda x: -x[0])
        return out

    async def demote_once(self) -> int:
        """One demotion pass (single-flight). Returns the number of RAM copies removed."""
        async with self._free_lock:
            mem = await self._memory(max_age=0.0)
            need = self.demotion.bytes_to_free(mem)
            if not need and self.demotion.idle_s is None:
                return 0
            return await self._free(need, idle_only=not need)

    async def _free(self, need: int, *, exclude: bytes | None = None, idle_only: bool = False) -> int:
        freed = removed = 0
        for idle, key in await self._candidates():
            if key == exclude or key in self._promoting or self.leased(key):
                continue
            if freed >= need and not self.demotion.idle_enough(idle):
                break
            if idle_only and not self.demotion.idle_enough(idle):
                break
            if not self.index.tiers_of(key):
                if not self.admission.admit(key):
                    continue  # one-time prompt: Valkey's own eviction policy may drop it
                task = self._copying.get(key) or asyncio.ensure_future(self._copy_down(key))
                await task
                if not self.index.tiers_of(key):
                    continue  # NVMe refused and the object copy is not durable yet: keep RAM
            e = self.index.get(key)
            try:
                n = await self.valkey.delete([key], timeout=self.timeout)
            except TransportError:
                break
            if n:
                removed += 1
                freed += e.value_len if e is not None else 0
                self.stats_counters["demoted"] += 1
        if removed:
            self._mem = None
        return removed

    async def repair_markers(self) -> int:
        """Re-create markers that Valkey lost (eviction under allkeys-* policies, restart),
        and remove markers of chunks no tier holds (a phantom prefix hit otherwise)."""
        keys = self.index.keys()
        restored = 0
        for i in range(0, len(keys), 1024):
            batch = keys[i : i + 1024]
            present = await self.valkey.exists_many([marker_of(k) for k in batch], timeout=self.timeout)
            missing = [k for k, p in zip(batch, present) if not p]
            await asyncio.gather(*(self._sync_marker(k) for k in missing))
            restored += len(missing)
        self.stats_counters["markers_restored"] += restored
        if self.s3 is not None and not self._listed:
            return restored  # the index is incomplete: a marker it lacks may be valid
        stray: list[bytes] = []
        async for mk in self.valkey.scan_iter(protocol.marker_pattern(self.key_prefix, self.tenant), 1000):
            try:
                k = data_of(mk)
            except ValueError:
                continue
            if not self.index.tiers_of(k) and k not in self._copying:
                stray.append(mk)
        for i in range(0, len(stray), 1024):
            batch = stray[i : i + 1024]
            self.stats_counters["stale_markers_removed"] += await self.valkey.delete(batch, timeout=self.timeout)
        for mk in stray:  # indexed meanwhile: put it back
            if self.index.tiers_of(data_of(mk)):
                await self._sync_marker(data_of(mk))
        return restored

    async def _demotion_loop(self) -> None:
        last_repair = time.monotonic()
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self.ts.demote_interval_s)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            try:
                self.expire_leases()
                await self.expire_once()
                await self.demote_once()
                if not self._listed:
                    await self.rebuild_object_index()
                self._kick_deleter()
                if time.monotonic() - last_repair >= self.ts.marker_repair_s:
                    last_repair = time.monotonic()
                    await self.repair_markers()
            except asyncio.CancelledError:
                raise
            except TransportError as e:
                log.debug("tiering: demotion pass failed: %s", e)
            except Exception:  # noqa: BLE001 - a background loop must survive
                log.exception("tiering: demotion pass failed")

    async def expire_once(self) -> int:
        """Remove expired copies from every tier. Object deletes go to the background deleter:
        a slow or dead object store never holds up demotion."""
        keys = self.index.expired_keys()
        if keys:
            await self._remove_lower(keys)
            self.stats_counters["expired"] += len(keys)
        return len(keys)

    # --- delete / evict --------------------------------------------------------------------
    async def delete(self, keys: Sequence[bytes], *, timeout: float | None = None) -> int:
        """Coordinated delete: RAM value, marker, index entries and every lower-tier copy.
        Queued or in-flight uploads of these keys are dropped/undone. Bounded by ``timeout``
        (default ``op_timeout_s``).

        With an object tier, a delete intent is recorded in Valkey first; object DELETEs are
        sent within the deadline where the store answers, else retried in the background
        (also after a restart, which never indexes an object with a pending intent)."""
        keys = list(keys)
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        self._bump(keys)
        for k in keys:
            self.admission.forget(k)
            self._s3_pending.discard(k)
        if self.s3 is not None and keys:
            await self._record_intents(keys, deadline)
        err: TransportError | None = None
        n = 0
        try:
            left = max(0.001, deadline - time.monotonic())
            n, _ = await asyncio.gather(self.valkey.delete(keys, timeout=left),
                                        self.valkey.delete([marker_of(k) for k in keys], timeout=left))
        except TransportError as e:
            err = e
        # Again: a copy that read the generation while the DEL was in flight may have read
        # the value before it went; it now carries a stale generation and is dropped.
        self._bump(keys)
        await self._remove_lower(keys, always_s3=True, wait_s=max(0.0, deadline - time.monotonic()))
        self.stats_counters["deleted"] += len(keys)
        if err is not None:
            raise err
        return n

    def _bump(self, keys: Sequence[bytes]) -> None:
        for k in keys:
            self._tombstones[k] = next(self._gen_seq)
            self._tombstones.move_to_end(k)
        while len(self._tombstones) > _TOMBSTONES_MAX:
            self._tombstones.popitem(last=False)

    async def _record_intents(self, keys: Sequence[bytes], deadline: float) -> None:
        now = int(time.time() * 1000)
        args: list[Any] = [b"HSET", self._del_key]
        for k in keys:
            args += [k, now]
        try:
            await self.valkey.command(*args, key=self._del_key, timeout=max(0.001, deadline - time.monotonic()))
            self._intents.update(keys)
        except TransportError as e:
            log.warning("tiering: delete intent not recorded (%s); a restart before the object store "
                        "takes the delete may serve the chunk again", e)

    async def _remove_lower(self, keys: Sequence[bytes], tiers: Sequence[str] = LOWER_TIERS, *,
                            always_s3: bool = False, wait_s: float | None = 0.0) -> int:
        """Remove ``keys``' copies from ``tiers``. NVMe files go now; object DELETEs are
        handed to the deleter (``wait_s``: how long to wait for them; None: until done)."""
        removed = 0
        doomed: list[bytes] = []
        for k in keys:
            had = set(self.index.tiers_of(k)) | {t for t in tiers if t in self.index._e.get(k, _NO).tiers}
            if "nvme" in tiers and self.nvme is not None and (await self.nvme.remove(k) or "nvme" in had):
                removed += 1
            if "s3" in tiers and self.s3 is not None and ("s3" in had or always_s3 or k in self._s3_pending):
                self._s3_doomed.add(k)
                doomed.append(k)
                if "s3" in had:
                    removed += 1
            for t in tiers:
                self.index.discard(k, t)
        for i in range(0, len(keys), 256):
            await asyncio.gather(*(self._sync_marker(k) for k in keys[i : i + 256]))
        self.stats_counters["s3_deletes_pending"] = len(self._s3_doomed)
        if doomed:
            tasks = [self._spawn(self._delete_object(k)) for k in doomed]
            if wait_s is None or wait_s > 0:
                await asyncio.wait(tasks, timeout=wait_s)
        return removed

    async def _delete_object(self, key: bytes) -> bool:
        """Send one pending object DELETE; True when done (the intent is then cleared)."""
        if key not in self._s3_doomed:
            return True
        if self.s3 is None:
            return False
        try:
            if not await self.s3.delete(key):
                return False  # pinned by a read: the next pass retries
        except TransportError as e:
            log.debug("tiering: object delete of %r deferred: %s", key, e)
            return False
        self._s3_doomed.discard(key)
        self.stats_counters["s3_deletes_pending"] = len(self._s3_doomed)
        if key in self._intents:
            try:
                await self.valkey.command(b"HDEL", self._del_key, key, key=self._del_key, timeout=self.timeout)
                self._intents.discard(key)
            except TransportError as e:
                log.debug("tiering: delete intent of %r not cleared: %s", key, e)
        return True

    async def retry_deletes(self) -> int:
        """Background pass: pick up delete intents recorded in Valkey (by workers, or before a
        restart), apply them to NVMe/index/markers, and resend pending object DELETEs while
        the breaker lets requests through. Returns object deletes completed."""
        recorded = await self._load_intents(quiet=True)
        fresh = [k for k in recorded if k not in self._s3_doomed]
        if fresh:
            self._bump(fresh)
            for k in fresh:
                self._s3_pending.discard(k)
            await self._remove_lower(fresh, always_s3=True, wait_s=0.0)
        if self.s3 is None:  # no object tier: the local removal was all of it
            done = list(self._intents)
            if done:
                try:
                    await self.valkey.command(b"HDEL", self._del_key, *done, key=self._del_key, timeout=self.timeout)
                    self._intents.difference_update(done)
                except TransportError as e:
                    log.debug("tiering: delete intents not cleared: %s", e)
            return 0
        ok = 0
        todo = [k for k in self._s3_doomed if k not in fresh][:_DELETE_BATCH]
        for i in range(0, len(todo), 32):
            if self.s3.breaker.state == self.s3.breaker.OPEN:
                break
            ok += sum(await asyncio.gather(*(self._delete_object(k) for k in todo[i : i + 32])))
        return ok

    def _kick_deleter(self) -> None:
        """Run :meth:`retry_deletes` (then :meth:`learn_object_expiry`) in the background, one
        at a time: a slow object store never holds up the demotion loop."""
        if self._deleter is None or self._deleter.done():
            self._deleter = self._spawn(self._object_chores())

    async def _object_chores(self) -> int:
        n = await self.retry_deletes()
        await self.learn_object_expiry()
        return n

    async def learn_object_expiry(self, limit: int = 256) -> int:
        """HEAD up to ``limit`` listed objects whose expiry the listing could not tell: the
        index and the marker take it (PXAT); expired ones are removed. Returns objects seen."""
        if self.s3 is None or not self._exp_unknown:
            return 0
        batch = [self._exp_unknown.pop() for _ in range(min(limit, len(self._exp_unknown)))]
        gone: list[bytes] = []
        seen = 0
        for i in range(0, len(batch), 32):
            if self.s3.breaker.state == self.s3.breaker.OPEN:
                self._exp_unknown.update(batch[i:])
                break
            part = batch[i : i + 32]
            infos = await asyncio.gather(*(self.s3.head_info(k) for k in part), return_exceptions=True)
            for k, info in zip(part, infos):
                if isinstance(info, BaseException):
                    self._exp_unknown.add(k)  # next pass
                    continue
                seen += 1
                e = self.index._e.get(k)
                if e is None or "s3" not in e.tiers:
                    continue
                if info is None:
                    self.index.discard(k, "s3")
                    self._spawn(self._sync_marker(k))
                elif info.expires_ms:
                    self.index.add(k, "s3", e.value_len, expires_ms=info.expires_ms)
                    if e.expired():
                        gone.append(k)
                    else:
                        self._spawn(self._sync_marker(k))
        if gone:
            await self._remove_lower(gone)
            self.stats_counters["expired"] += len(gone)
        return seen

    async def evict(self, tier: str, *, keys: Sequence[bytes] | None = None, prefix: bytes | None = None) -> int:
        """Remove copies from one tier only (``ram``, ``nvme`` or ``s3``), by keys or key prefix
        (e.g. ``<prefix>:<tenant>:<namespace digest>:c:``). Returns copies removed."""
        if tier not in ("ram", *LOWER_TIERS):
            raise ValueError(f"unknown tier {tier!r}: ram, nvme or s3")
        if keys is None:
            if prefix is None:
                raise ValueError("evict needs keys or a prefix")
            if tier == "ram":
                found = [k async for k in self.valkey.scan_iter(prefix + b"*", 1000)]
                keys = [k for k in found if b":c:{" in k]
            else:
                keys = self.index.keys(tier=tier, prefix=prefix)
        if tier == "ram":
            n = await self.valkey.delete(list(keys), timeout=self.timeout) if keys else 0
            self.stats_counters["ram_evicted"] += n
            return n
        return await self._remove_lower(list(keys), (tier,), wait_s=self.timeout)

    # --- stats -----------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"manager": dict(self.stats_counters), "index": self.index.stats(),
                               "cost": self.cost.snapshot(), "chunks_indexed": len(self.index),
                               "leases": len(self._leases)}
        if self.nvme is not None:
            out["nvme"] = {**self.nvme.stats, "used_bytes": self.nvme.used_bytes, "budget_bytes": self.nvme.budget,
                           "direct_io": self.nvme.direct}
        if self.s3 is not None:
            out["s3"] = {**self.s3.stats, "backlog": self.s3.backlog, "queue_max": self.ts.flush_queue_max,
                         "breaker": self.s3.breaker.state}
        return out

    # --- service placement: requests through Valkey ------------------------------------------
    async def serve_requests(self, stop: asyncio.Event | None = None) -> None:
        """Consume the tenant's request list until ``stop`` is set (docs/tiering-promotion.md)."""
        req = protocol.request_key(self.key_prefix, self.tenant)
        block = self.ts.request_block_s
        while stop is None or not stop.is_set():
            try:
                r = await self.valkey.command(b"BLPOP", req, block, key=req, timeout=block + self.timeout)
            except asyncio.CancelledError:
                raise
            except TransportError as e:
                log.warning("tierd: request list unavailable (%s); retrying", e)
                await asyncio.sleep(min(1.0, block))
                continue
            if not r:
                continue
            await self._serve_one(r[1])
            # Drain what is already queued without blocking (one round trip).
            try:
                more = await self.valkey.command(b"LPOP", req, 128, key=req, timeout=self.timeout)
            except TransportError:
                more = None
            for m in more or ():
                await self._serve_one(m)

    async def _serve_one(self, raw: bytes) -> None:
        """Handle a request in the background; at most ``_SERVE_MAX`` at once (the request
        list is not read meanwhile, so a burst waits in Valkey, not in tierd's memory)."""
        await self._serve_sem.acquire()
        t = self._spawn(self._handle(raw))
        t.add_done_callback(lambda _t: self._serve_sem.release())

    async def _handle(self, raw: bytes) -> None:
        """Act on one request, checked first (requests.py): a malformed one, or one naming
        anything outside this tenant, is counted, logged and answered with an error."""
        self.stats_counters["requests"] += 1
        try:
            req = requests.parse_request(raw, self._scope)
        except requests.BadRequest as e:
            self.stats_counters["bad_requests"] += 1
            self._bad_log.note(e.reason)
            if e.reply is not None:
                await self._reply(e.reply, protocol.pack({"id": e.id, "ok": False, "result": f"bad request: {e.reason}"}))
            return
        result: Any = None
        ok = True
        ttl = req.ttl_ms / 1000
        try:
            if req.op == "hint":
                for k, n in req.puts:
                    self.note_put(k, n)
                for k in req.hits:
                    self.note_hit(k)
                # leases before releases: a batch never ends a lease it has not begun
                for k, ms in req.leases:
                    self.lease([k], ms / 1000)
                self.release(req.releases)
                return
            if req.op == "promote":
                result = await self.promote(req.key, timeout=ttl) if ttl > 0 else False
            elif req.op == "stats":
                result = self.stats()
            elif req.op == "evict":
                result = await self.evict(req.tier, keys=req.keys, prefix=req.prefix)
            elif req.op == "drain":
                result = await self.flush(min(req.timeout_s, max(ttl, 0.001)))
            elif req.op == "delete":
                result = await self.delete(req.keys, timeout=max(ttl, 0.001))
        except Exception as e:  # noqa: BLE001 - the reply carries it
            ok, result = False, f"{type(e).__name__}: {e}"
        if req.reply is not None:
            await self._reply(req.reply, protocol.pack({"id": req.id, "ok": ok, "result": result}))

    async def _reply(self, reply: bytes, payload: bytes) -> None:
        """RPUSH + PEXPIRE as one script, so a reply list never exists without its TTL (a
        connection lost between two commands would leak it). Where scripts are refused
        (ACL, disabled), the two commands are sent one after the other."""
        try:
            if self._scripts:
                try:
                    await self.valkey.command(b"EVAL", _REPLY_SCRIPT, 1, reply, payload, protocol.REPLY_TTL_MS,
                                              key=reply, timeout=self.timeout)
                    return
                except ServerError as e:
                    log.warning("tierd: EVAL refused (%s); replies use RPUSH then PEXPIRE", e)
                    self._scripts = False
            await self.valkey.command(b"RPUSH", reply, payload, key=reply, timeout=self.timeout)
            await self.valkey.command(b"PEXPIRE", reply, protocol.REPLY_TTL_MS, key=reply, timeout=self.timeout)
        except TransportError as e:
            log.debug("tierd: reply failed: %s", e)


class _No:
    tiers: set[str] = set()


_NO = _No()


def new_worker_id() -> str:
    return uuid.uuid4().hex
