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
  by an in-flight read is removed when the read finishes.

Never imports: aiobotocore (only via .object_store), valkey-py, the store, the integrations.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict
from typing import Any, Sequence

from .. import codec
from ..config import Settings
from ..errors import TransportError
from . import _metrics, protocol
from ..keys import Namespace
from .index import LOWER_TIERS, ChunkRead, TierIndex, marker_of, marker_value, split_data_key
from .nvme import NvmeTier
from .policy import Admission, CostModel, Demotion, MemoryState, parse_info_memory
from .settings import TieringSettings

log = logging.getLogger(__name__)

_TOMBSTONES_MAX = 100_000


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
        self._tombstones: OrderedDict[bytes, None] = OrderedDict()
        self._s3_pending: set[bytes] = set()  # queued for upload, not durable yet
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loops: list[asyncio.Task[Any]] = []
        self._mem: MemoryState | None = None
        self._mem_at = 0.0
        self._closing = False
        self.stats_counters = {
            "promotions": 0, "promotion_misses": 0, "promote_coalesced": 0, "skipped_cost": 0, "already_in_ram": 0, "foreign": 0, "markers_restored": 0,
            "admitted": 0, "rejected": 0, "demoted": 0, "ram_evicted": 0, "deleted": 0, "expired": 0,
            "requests": 0, "bad_requests": 0,
        }

    # --- lifecycle -------------------------------------------------------------------------
    async def start(self, *, background: bool = True) -> None:
        """Open tiers, rebuild the index from NVMe headers and the object listing, re-assert
        tier markers, and (``background``) start the demotion/expiry loop."""
        if self.nvme is not None:
            for e in await self.nvme.start():
                self.index.add(e.key, "nvme", e.value_len, last_access=e.mtime, expires_ms=e.expires_ms)
        if self.ts.s3_bucket:
            from .object_store import ObjectTier

            self.s3 = ObjectTier(self.ts, on_durable=self._on_durable, is_wanted=self._wanted, on_gone=self._on_s3_gone)
            await self.s3.start()
            try:
                async for o in self.s3.list_objects(self.tenant):
                    self.index.add(o.key, "s3", o.value_len, last_access=o.mtime, expires_ms=o.expires_ms)
            except TransportError as e:
                log.warning("tiering: object listing failed at start (%s); index holds NVMe only", e)
        await self.reconcile_markers()
        if background:
            self._loops.append(asyncio.create_task(self._demotion_loop(), name="lmcv-tier-demote"))
        log.info("tiering: started (%d chunks indexed: %s)", len(self.index), self.index.stats())

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

    # --- markers and index callbacks --------------------------------------------------------
    async def _sync_marker(self, key: bytes) -> None:
        tiers = self.index.tiers_of(key)
        mk = marker_of(key)
        try:
            if tiers:
                e = self.index.get(key)
                args: list[Any] = [b"SET", mk, marker_value(tiers)]
                if e is not None and e.expires_ms:
                    args += [b"PXAT", e.expires_ms]
                await self.valkey.command(*args, key=mk, timeout=self.timeout)
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

    def _on_durable(self, key: bytes, value_len: int, expires_ms: int) -> None:
        self._s3_pending.discard(key)
        if not self._wanted(key):
            return
        self.index.add(key, "s3", value_len, expires_ms=expires_ms)
        self._spawn(self._sync_marker(key))

    def _wanted(self, key: bytes) -> bool:
        return key not in self._tombstones

    # --- admission (put/hit hints) ---------------------------------------------------------
    def note_put(self, key: bytes, nbytes: int = 0) -> None:
        """A chunk was written to RAM. Cheap; the copy to lower tiers runs in the background."""
        self._tombstones.pop(key, None)
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
            _metrics.record_admission("nvme" if self.nvme else "s3", True)
            self._copying[key] = t = asyncio.ensure_future(self._copy_down(key))
            t.add_done_callback(lambda _t, k=key: self._copying.pop(k, None))
        elif self.admission.count(key) == 1:
            self.stats_counters["rejected"] += 1
            _metrics.record_admission("nvme" if self.nvme else "s3", False)

    def _has_all_copies(self, key: bytes) -> bool:
        e = self.index.get(key)
        if e is None:
            return False
        return (self.nvme is None or "nvme" in e.tiers) and (self.s3 is None or "s3" in e.tiers or key in self._s3_pending)

    async def _copy_down(self, key: bytes, value: memoryview | None = None, pttl_ms: int | None = None) -> bool:
        """Copy one chunk from RAM to NVMe (now) and the object tier (write-behind)."""
        async with self._copy_sem:
            try:
                if value is None:
                    raw, pttl = await asyncio.gather(
                        self.valkey.command(b"GET", key, key=key, timeout=self.timeout),
                        self.valkey.command(b"PTTL", key, key=key, timeout=self.timeout),
                    )
                    if raw is None:
                        return False
                    value, pttl_ms = memoryview(raw), int(pttl)
            except TransportError as e:
                log.debug("tiering: could not read %r from RAM for demotion: %s", key, e)
                return False
            expires_ms = int(time.time() * 1000) + pttl_ms if pttl_ms and pttl_ms > 0 else 0
            e = self.index.get(key)
            have = e.tiers if e is not None else set()
            changed = False
            if self.nvme is not None and "nvme" not in have:
                if await self.nvme.write(key, [value], expires_ms=expires_ms):
                    if not self._wanted(key):
                        await self.nvme.remove(key)
                        return False
                    self.index.add(key, "nvme", value.nbytes, expires_ms=expires_ms)
                    _metrics.record_demotion("nvme", value.nbytes)
                    changed = True
            if self.s3 is not None and "s3" not in have and key not in self._s3_pending:
                if self.s3.enqueue(key, value, expires_ms=expires_ms):
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
            _metrics.record_miss("nvme" if self.index.tiers_of(key)[:1] == ["nvme"] else "s3", "deadline")
            return False

    async def _promote_one(self, key: bytes, deadline: float) -> bool:
        t0 = time.perf_counter()
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
            budget = min(self.ts.recompute_budget_s, remaining)
            if not self.cost.affordable(tier, e.value_len, budget):
                self.stats_counters["skipped_cost"] += 1
                _metrics.record_miss(tier, "deadline")
                continue
            r0 = time.perf_counter()
            got = await self._read_tier(tier, key, e.value_len)
            if got is None:
                continue
            self.cost.observe(tier, e.value_len, time.perf_counter() - r0)
            hdr, payload = got
            if not self._compatible(key, hdr):
                got.release()
                await self._remove_lower([key], (tier,))
                continue
            if not self._wanted(key) or self.index.get(key) is None:
                got.release()  # deleted or expired while we read: never resurrect it
                self.stats_counters["promotion_misses"] += 1
                return False
            try:
                staged = await self._stage(key, [hdr, payload], e.expires_ms)
                if staged and not self._wanted(key):  # deleted while staging
                    await self.valkey.delete([key], timeout=self.timeout)
                    staged = False
                if staged and tier == "s3" and self.nvme is not None and self.ts.promote_to_nvme and key not in self.nvme:
                    value = memoryview(bytes(hdr) + bytes(payload))
                    ttl = max(0, e.expires_ms - int(time.time() * 1000)) if e.expires_ms else 0
                    self._spawn(self._copy_down(key, value, ttl))
            finally:
                got.release()
            if not staged:
                continue
            self.stats_counters["promotions"] += 1
            self.index.touch(key)
            _metrics.record_promotion(tier, e.value_len)
            _metrics.record_hit(tier, e.value_len - codec.HEADER_SIZE)
            _metrics.observe_latency("promote", tier, time.perf_counter() - t0)
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
        _metrics.record_miss("nvme", "foreign")
        return False

    async def _read_tier(self, tier: str, key: bytes, value_len: int) -> ChunkRead | None:
        if tier == "nvme" and self.nvme is not None:
            return await self.nvme.read_value(key)
        if tier == "s3" and self.s3 is not None:
            return await self.s3.read_value(key, value_len)
        return None

    async def _stage(self, key: bytes, parts: Sequence[memoryview], expires_ms: int) -> bool:
        nbytes = sum(p.nbytes for p in parts)
        ttl_s = None
        if expires_ms:
            ttl_s = (expires_ms - time.time() * 1000) / 1000
            if ttl_s <= 0:
                return False
        try:
            mem = await self._memory()
            need = self.demotion.room_for(mem, nbytes)
            if need:
                await self._free(need, exclude=key)
            await self.valkey.set(key, list(parts), ttl_s=ttl_s, timeout=self.timeout)
            if self._mem is not None:
                self._mem = MemoryState(self._mem.used + nbytes, self._mem.maxmemory)
            return True
        except TransportError as e:
            log.warning("tiering: staging %r into RAM failed: %s", key, e)
            _metrics.record_error("promote", getattr(e, "cause", "error"))
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
        """One demotion pass. Returns the number of RAM copies removed."""
        mem = await self._memory(max_age=0.0)
        need = self.demotion.bytes_to_free(mem)
        if not need and self.demotion.idle_s is None:
            return 0
        return await self._free(need, idle_only=not need)

    async def _free(self, need: int, *, exclude: bytes | None = None, idle_only: bool = False) -> int:
        freed = removed = 0
        for idle, key in await self._candidates():
            if key == exclude or key in self._promoting:
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
        """Re-create markers that Valkey lost (eviction under allkeys-* policies, restart)."""
        keys = self.index.keys()
        restored = 0
        for i in range(0, len(keys), 1024):
            batch = keys[i : i + 1024]
            present = await self.valkey.exists_many([marker_of(k) for k in batch], timeout=self.timeout)
            missing = [k for k, p in zip(batch, present) if not p]
            await asyncio.gather(*(self._sync_marker(k) for k in missing))
            restored += len(missing)
        self.stats_counters["markers_restored"] += restored
        return restored

    async def _demotion_loop(self) -> None:
        last_repair = time.monotonic()
        while True:
            await asyncio.sleep(self.ts.demote_interval_s)
            try:
                await self.expire_once()
                await self.demote_once()
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
        keys = self.index.expired_keys()
        if keys:
            await self._remove_lower(keys)
            self.stats_counters["expired"] += len(keys)
        return len(keys)

    # --- delete / evict --------------------------------------------------------------------
    async def delete(self, keys: Sequence[bytes]) -> int:
        """Coordinated delete: RAM value, marker, index entries and every lower-tier copy.
        Queued or in-flight uploads of these keys are dropped/undone."""
        for k in keys:
            self._tombstones[k] = None
            self._tombstones.move_to_end(k)
            self.admission.forget(k)
            self._s3_pending.discard(k)
        while len(self._tombstones) > _TOMBSTONES_MAX:
            self._tombstones.popitem(last=False)
        n = await self.valkey.delete([*keys, *(marker_of(k) for k in keys)], timeout=self.timeout)
        await self._remove_lower(keys)
        self.stats_counters["deleted"] += len(keys)
        return n

    async def _remove_lower(self, keys: Sequence[bytes], tiers: Sequence[str] = LOWER_TIERS) -> int:
        removed = 0
        for k in keys:
            had = set(self.index.tiers_of(k)) | {t for t in tiers if t in self.index._e.get(k, _NO).tiers}
            if "nvme" in tiers and self.nvme is not None and (await self.nvme.remove(k) or "nvme" in had):
                removed += 1
            if "s3" in tiers and self.s3 is not None and "s3" in had:
                await self.s3.delete(k)
                removed += 1
            for t in tiers:
                self.index.discard(k, t)
            await self._sync_marker(k)
        return removed

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
        return await self._remove_lower(list(keys), (tier,))

    # --- stats -----------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"manager": dict(self.stats_counters), "index": self.index.stats(),
                               "cost": self.cost.snapshot(), "chunks_indexed": len(self.index)}
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
            self._spawn(self._handle(r[1]))
            # Drain what is already queued without blocking (one round trip).
            try:
                more = await self.valkey.command(b"LPOP", req, 128, key=req, timeout=self.timeout)
            except TransportError:
                more = None
            for m in more or ():
                self._spawn(self._handle(m))

    async def _handle(self, raw: bytes) -> None:
        self.stats_counters["requests"] += 1
        try:
            msg = protocol.unpack(raw)
            op = msg["op"]
        except Exception:  # noqa: BLE001
            self.stats_counters["bad_requests"] += 1
            log.warning("tierd: unreadable request dropped")
            return
        result: Any = None
        ok = True
        try:
            if op == "hint":
                for k, n in msg.get("put", ()):
                    self.note_put(bytes(k), int(n))
                for k in msg.get("hit", ()):
                    self.note_hit(bytes(k))
                return
            ttl_ms = int(msg.get("ttl_ms", 1000))
            waited = int(time.time() * 1000) - int(msg.get("sent_ms", 0) or 0)
            if msg.get("sent_ms") and 0 < waited:  # time spent in the list (clocks may differ: never negative)
                ttl_ms -= waited
            ttl = ttl_ms / 1000
            if op == "promote":
                result = await self.promote(bytes(msg["key"]), timeout=ttl) if ttl > 0 else False
            elif op == "stats":
                result = self.stats()
            elif op == "evict":
                keys = [bytes(k) for k in msg["keys"]] if msg.get("keys") is not None else None
                pfx = bytes(msg["prefix"]) if msg.get("prefix") is not None else None
                result = await self.evict(str(msg["tier"]), keys=keys, prefix=pfx)
            elif op == "drain":
                result = await self.flush(float(msg.get("timeout_s", max(ttl, 0.001))))
            elif op == "delete":
                result = await self.delete([bytes(k) for k in msg["keys"]])
            else:
                ok, result = False, f"unknown op {op!r}"
        except Exception as e:  # noqa: BLE001 - the reply carries it
            ok, result = False, f"{type(e).__name__}: {e}"
        reply = msg.get("reply")
        if not reply:
            return
        reply = bytes(reply)
        try:
            await self.valkey.command(b"RPUSH", reply, protocol.pack({"id": msg.get("id"), "ok": ok, "result": result}),
                                      key=reply, timeout=self.timeout)
            await self.valkey.command(b"PEXPIRE", reply, protocol.REPLY_TTL_MS, key=reply, timeout=self.timeout)
        except TransportError as e:
            log.debug("tierd: reply failed: %s", e)


class _No:
    tiers: set[str] = set()


_NO = _No()


def new_worker_id() -> str:
    return uuid.uuid4().hex
