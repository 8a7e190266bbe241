"""``ValkeySecondaryTier``: the class vLLM's ``SecondaryTierFactory`` loads by name.

Thin by design: it turns vLLM's types into ours and back (``OffloadKey`` → :class:`ChunkRef`,
``TransferJob`` → a job on :class:`JobRunner`, outcomes → ``JobResult``) and keeps the lookup
verdicts in a :class:`LookupBook`. Every method runs in vLLM's scheduler process under the
tiering manager's lock and returns at once: the I/O runs on the store's private loop
(docs/private-io-loop.md), lookups are batched once per step (docs/vllm-tier.md).

Keys: ``<prefix>:<tenant>:<fingerprint>:c:{blake2b(OffloadKey hex)}``; the fingerprint
covers model, KV dtype, cache groups, block size and bytes, parallel layout (world size,
rank, TP/PP/PCP/DCP) and ``model_revision``, so a block is never served across layouts.
"""

from __future__ import annotations

import ctypes
import logging
import queue
import time
from typing import Any, ClassVar, Iterable

from ... import metrics
from ...session import StoreSession, namespace_for
from ...store import ChunkRef
from .compat import (
    DEFERRED_RELEASE,
    CacheHitSource,
    ConfigInfoMapping,
    JobResult,
    Locality,
    LookupResult,
    Medium,
    OffloadingConnectorStats,
    OffloadingMetricMetadata,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
    SecondaryTierManager,
    TransferJob,
    job_result,
)
from .events import TierEvents
from .jobs import JobRunner
from .lookups import LookupBook
from .settings import TierSettings, namespace_fields, parse_tier_settings
from .stats import TierStats, definitions

log = logging.getLogger(__name__)


def _address_of(view: memoryview) -> int:
    """Where a writable, contiguous view starts (for registering it with the fabric once)."""
    holder = ctypes.c_char.from_buffer(view)
    try:
        return ctypes.addressof(holder)
    finally:
        del holder  # drop the export at once: vLLM unmaps the region at shutdown


class ValkeySecondaryTier(SecondaryTierManager):
    """A vLLM secondary tier in Valkey RAM (and, with tiering, NVMe and S3 behind it),
    shared by every vLLM server that names the same Valkey, tenant and layout."""

    # Valkey RAM, over the network: a hit is neither host memory nor local disk to vLLM.
    medium: ClassVar[Medium] = Medium.CPU
    cache_hit_source: ClassVar[CacheHitSource] = CacheHitSource.EXTERNAL_UNSPECIFIED

    def __init__(
        self,
        offloading_spec: Any,  # vLLM's OffloadingSpec
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: Any = None,  # vLLM's BackpressureDetector
        **tier_config: Any,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        self.settings: TierSettings = parse_tier_settings(tier_config, tier_type)
        self.locality = Locality(self.settings.locality)
        self._flat = primary_kv_view.cast("B")  # slot i = bytes [i * stride, (i + 1) * stride)
        namespace = namespace_for(self.settings.store, namespace_fields(offloading_spec.config, self.block_size_bytes))
        try:
            self._session = StoreSession(
                self.settings.store,
                namespace,
                self.settings.tiering,
                arena=(_address_of(self._flat), self._flat.nbytes),
                name=f"lmcache-valkey-vllm-{tier_type}",
            )
        except BaseException as e:
            self._flat.release()
            log.error("lmcache-valkey vLLM tier %r could not start (%s): %s", tier_type,
                      self.settings.store.url_for_humans, e)
            raise
        # vLLM 0.34+: a failed load is reported at once, its slots held by vLLM until our I/O is
        # over (JobResult.deferred_release); before, it is reported only then (jobs.py).
        self._jobs = JobRunner(self._session, self._flat, self.block_size_bytes, defer_release=DEFERRED_RELEASE)
        self._book = LookupBook()
        # Answers of batched existence checks, from the I/O loop to the scheduler thread.
        # (batch, found or None when the check failed, announcements before it was sent, seconds)
        self._answers: queue.SimpleQueue[tuple[list[tuple[bytes, int]], list[bool] | None, int, float]] = \
            queue.SimpleQueue()
        # job -> (keys, sent, the request's context)
        self._job_keys: dict[int, tuple[list[OffloadKey], list[bool], ReqContext]] = {}
        self._events: TierEvents | None = None
        if self.settings.enable_kv_events:
            if offloading_spec.kv_events_config.enable_kv_cache_events:
                self._events = TierEvents(tier_type, self.locality)
            else:
                log.warning("enable_kv_events is set on tier %r but vLLM's KV cache events are off", tier_type)
        self._stats = TierStats(tier_type)
        self._closed = False
        log.info(
            "lmcache-valkey vLLM tier %r on %s (tenant %s, namespace %s, transport %s, %d-byte blocks)",
            tier_type, self.settings.store.url_for_humans, self.settings.store.tenant, namespace.digest,
            self._session.transport_name, self.block_size_bytes,
        )

    # ------------------------------------------------------------------ keys

    def _ref(self, key: OffloadKey) -> ChunkRef:
        s = bytes(key).hex()
        return ChunkRef(self._session.namespace.chunk_id(s), s)

    # ---------------------------------------------------------------- lookups

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        self._apply_answers()
        found = self._book.lookup(bytes(key), req_context.req_id)
        if found is None:
            return LookupResult.RETRY
        return LookupResult.HIT if found else LookupResult.MISS

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        """Send every key asked about this step as one existence check (one round trip)."""
        self._apply_answers()
        batch = self._book.take_batch()
        if batch and not self._closed:
            asked_after = self._events.announcements() if self._events is not None else 0
            self._session.io.submit(self._check(batch, asked_after))

    async def _check(self, batch: list[tuple[bytes, int]], asked_after: int) -> None:
        started = time.perf_counter()
        found: list[bool] | None = None
        try:
            found = await self._session.store.answer_each([self._ref(OffloadKey(k)).chunk_id for k, _ in batch])
        except Exception as e:  # the store answers misses itself; anything else is a bug, still a miss
            log.error("lmcache-valkey vLLM tier: existence check failed: %r", e)
        finally:
            self._answers.put((batch, found, asked_after, time.perf_counter() - started))

    def _apply_answers(self) -> None:
        while True:
            try:
                batch, answer, asked_after, seconds = self._answers.get_nowait()
            except queue.Empty:
                return
            found = answer if answer is not None else [False] * len(batch)  # a failed check: misses
            self._book.resolve((k, g, f) for (k, g), f in zip(batch, found))
            if answer is not None and self._events is not None:
                self._events.answered((k for k, _ in batch), answer, asked_after)
            hits = sum(found)
            self._stats.lookup_batch(seconds, hits, len(found) - hits)

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._book.release(req_context.req_id)

    # ------------------------------------------------------------------- jobs

    def submit_store(self, job_metadata: TransferJob) -> None:
        keys = list(job_metadata.keys)
        slots = [int(c) for c in job_metadata.chunk_ids]
        # A block this tier already answered as present is not sent again.
        send = [not self._book.known_present(bytes(k)) for k in keys]
        self._job_keys[job_metadata.job_id] = (keys, send, job_metadata.req_context)
        self._jobs.submit(
            job_metadata.job_id,
            load=False,
            refs=[self._ref(k) for k, s in zip(keys, send) if s],
            slots=[c for c, s in zip(slots, send) if s],
        )

    def submit_load(self, job_metadata: TransferJob) -> None:
        keys = list(job_metadata.keys)
        self._job_keys[job_metadata.job_id] = (keys, [True] * len(keys), job_metadata.req_context)
        self._jobs.submit(
            job_metadata.job_id,
            load=True,
            refs=[self._ref(k) for k in keys],
            slots=[int(c) for c in job_metadata.chunk_ids],
        )

    def get_finished_jobs(self) -> Iterable[JobResult]:
        results = []
        for outcome in self._jobs.take_finished():
            keys, sent, req_context = self._job_keys.pop(outcome.job_id)
            it = iter(outcome.ok)
            ok = [next(it) if s else True for s in sent]  # a skipped store is a success
            good = [k for k, o in zip(keys, ok) if o]
            bad = [k for k, o in zip(keys, ok) if not o]
            op = "load" if outcome.load else "store"
            self._stats.blocks(op, "ok", sum(outcome.ok))
            self._stats.blocks(op, "skipped", sent.count(False))
            self._stats.blocks(op, "failed", len(bad))
            if outcome.load:
                # A failed block is a miss from now on for requests that saw it as a hit,
                # so the scheduler recomputes it instead of promoting it again and again.
                self._book.mark([bytes(k) for k in bad], False)
                successful: tuple[OffloadKey, ...] | None = tuple(good) if bad and good else None
                # Only a failed load carries a hold still open (vLLM 0.34+; None otherwise).
                results.append(job_result(outcome.job_id, not bad, successful, outcome.seconds, outcome.nbytes,
                                          deferred_release=outcome.released if bad else None))
            else:
                self._book.mark([bytes(k) for k in good], True)
                stored = [k for k, o, s in zip(keys, ok, sent) if o and s]
                if self._events is not None:
                    self._events.stored(stored, req_context)
                results.append(job_result(outcome.job_id, not bad, None, outcome.seconds, outcome.nbytes))
        return results

    def has_pending_work(self) -> bool:
        return self._jobs.pending() > 0 or self._book.in_flight() > 0

    def drain_jobs(self) -> None:
        """Block until every submitted job has finished and no I/O can touch a slot of any
        job reported (so every ``deferred_release`` handed to vLLM is set); never cuts a
        transfer short. Bounded by the store's deadlines and the fabric's revocation."""
        self._jobs.drain()

    def take_events(self) -> Iterable[Any]:
        """vLLM's OffloadingEvents: blocks stored here, and announced blocks seen gone (events.py)."""
        self._apply_answers()
        if self._events is not None:
            yield from self._events.take()

    # ------------------------------------------------------------- lifecycle

    def shutdown(self) -> None:
        """Bounded: jobs in flight get ``shutdown_timeout_s``, the store's close 5 s more."""
        if self._closed:
            return
        self._closed = True
        self._jobs.close(self.settings.shutdown_timeout_s)
        self._session.close(timeout=5.0)
        self._jobs.release_all()  # the store is closed: nothing can touch the primary region
        self._flat.release()

    # ---------------------------------------------------------------- metrics

    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, OffloadingMetricMetadata]:
        # vLLM calls this in its API server at start-up, before any engine process exists:
        # the first place a malformed setting can stop the start, naming the key.
        parse_tier_settings(extra_config, str(extra_config.get("type", cls.__name__)))
        if metrics.multiprocess_dir() is None:
            # The store records in the engine process; this API server serves /metrics from
            # its own registry unless a multi-process directory joins them (vLLM creates one
            # only with --api-server-count > 1).
            log.warning(
                "PROMETHEUS_MULTIPROC_DIR is not set: the lmcache_valkey_* series (misses by cause, "
                "errors, latency) stay in vLLM's engine process and are not on /metrics; point it at "
                "an empty directory before `vllm serve` (vLLM sets it only with --api-server-count > 1; "
                "docs/metrics.md)")
        return definitions()

    def get_stats(self) -> OffloadingConnectorStats | None:
        self._apply_answers()
        return self._stats.take()

    # vllm:kv_offload_config_info's labels (vLLM 0.33+; 0.32 never calls these).
    @classmethod
    def config_info_keys(cls, tier_config: dict[str, Any]) -> tuple[str, ...]:
        return ("valkey_url", "valkey_tenant", "valkey_namespace", "valkey_transport")

    def config_info(self) -> ConfigInfoMapping:
        return {
            "valkey_url": self.settings.store.url_for_humans,
            "valkey_tenant": self.settings.store.tenant,
            "valkey_namespace": self._session.namespace.digest,
            "valkey_transport": self._session.transport_name,
        }


__all__ = ["ValkeySecondaryTier"]
