"""The scheduler side of vLLM's OffloadingConnector (0.32 to 0.34), built from vLLM's own classes.

``Engine`` is what one vLLM server's scheduler holds: ``TieringOffloadingSpec(...)
.get_manager()`` — the real ``TieringOffloadingManager`` with its CPU primary tier in
``/dev/shm`` and our tier as its secondary tier — driven the way vLLM's offloading
scheduler drives it (``on_new_request`` → ``prepare_store``/``complete_store`` →
``lookup`` until resolved → ``prepare_load``/``complete_load`` → ``on_request_finished``,
``on_schedule_end`` once per step). Only the GPU is missing: the test writes a block's bytes
into the primary slot vLLM's GPU worker would fill, and reads back the slot it would copy
to the GPU.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from vllm.v1.kv_offload.base import LookupResult, OffloadKey, ReqContext, ScheduleEndContext, make_offload_key
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.tiering.base import JobResult, TransferJob
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

TIER = {"type": "ValkeySecondaryTier", "module_path": "lmcache_valkey.integrations.vllm.tier"}
STEP = ScheduleEndContext(new_req_ids=(), preempted_req_ids=())


@dataclass(frozen=True)
class Layout:
    """What shapes a block: a small model by default (64 KiB per block)."""

    model: str = "test/tiny-model"
    dtype: str = "bfloat16"
    tokens_per_block: int = 16
    layers: tuple[str, ...] = ("model.layers.0.self_attn", "model.layers.1.self_attn")
    worker_block_bytes: int = 64 << 10
    world_size: int = 1

    def with_(self, **kw: Any) -> "Layout":
        return replace(self, **kw)


def offloading_config(layout: Layout, tiers: Sequence[dict], *, cpu_blocks: int = 64,
                      engine_id: str | None = None, events: bool = False) -> OffloadingConfig:
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=layout.tokens_per_block, layer_names=layout.layers, group_id=0),),
        worker_kv_bytes_per_block=layout.worker_block_bytes,
        enable_kv_cache_events=events,
        extra_config={"cpu_bytes_to_use": cpu_blocks * layout.worker_block_bytes * layout.world_size,
                      "secondary_tiers": [dict(t) for t in tiers]},
        engine_id=engine_id or f"lmcv-test-{uuid.uuid4().hex[:12]}",
        model=OffloadingModelConfig(name=layout.model, dtype=layout.dtype),
        cache=OffloadingCacheConfig(tokens_per_hash=layout.tokens_per_block, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0, world_size=layout.world_size, tp_size=layout.world_size, pp_size=1, pcp_size=1, dcp_size=1,
            data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
            is_parallelism_agnostic=False,
        ),
    )


def tier_entry(url: str, **settings: Any) -> dict:
    return {**TIER, "url": url, **settings}


def keys(seed: str, n: int) -> list[OffloadKey]:
    """Block keys of one prompt: vLLM's block hashes are 32-byte digests, group 0."""
    import hashlib

    return [make_offload_key(hashlib.sha256(f"{seed}/{i}".encode()).digest(), 0) for i in range(n)]


def block_bytes(key: OffloadKey, size: int) -> bytes:
    """Recognisable, key-dependent contents for a block."""
    import hashlib

    seed = hashlib.blake2b(bytes(key), digest_size=64).digest()
    return (seed * (size // len(seed) + 1))[:size]


def expire_everything(valkey_server) -> None:
    """What a TTL or ``maxmemory`` eviction does to every chunk, silently: gone at once."""
    for key in valkey_server.cmd("KEYS", "lmcv:default:*"):
        valkey_server.cmd("PEXPIRE", key, 1)
    deadline = time.monotonic() + 10
    while [k for k in valkey_server.cmd("KEYS", "lmcv:default:*") if valkey_server.cmd("EXISTS", k)]:
        assert time.monotonic() < deadline, "the keys did not expire"
        time.sleep(0.01)


@dataclass
class Engine:
    """One vLLM server's scheduler-side offloading state (real vLLM classes)."""

    url: str
    layout: Layout = field(default_factory=Layout)
    tier_settings: dict = field(default_factory=dict)
    cpu_blocks: int = 64
    events: bool = False

    def __post_init__(self) -> None:
        self.spec = TieringOffloadingSpec(
            offloading_config(self.layout, [tier_entry(self.url, **self.tier_settings)],
                              cpu_blocks=self.cpu_blocks, events=self.events))
        self.manager = self.spec.get_manager()
        # What vLLM's scheduler holds around manager calls (0.33+: the tier-poll thread
        # shares the manager); vLLM 0.32's manager has no lock, one thread drives it.
        self.lock = getattr(self.manager, "lock", contextlib.nullcontext())
        self.tier = self.manager.secondary_tiers[0]
        self.view = self.manager.primary_tier.get_kv_memoryview()
        self.block_size = self.view.strides[0]
        self._requests = 0

    # ------------------------------------------------------------------ steps

    def step(self) -> None:
        with self.lock:
            self.manager.on_schedule_end(STEP)

    def ctx(self, name: str | None = None) -> ReqContext:
        self._requests += 1
        return ReqContext(req_id=name or f"req-{self._requests}")

    def wait_idle(self, timeout: float = 60.0) -> None:
        """Step until every transfer of the tier has been reported to the manager."""
        deadline = time.monotonic() + timeout
        while True:
            self.step()
            with self.lock:
                if not self.manager.has_pending_work():
                    return
            if time.monotonic() > deadline:
                raise TimeoutError("the tiering manager still has pending work")
            time.sleep(0.005)

    # ------------------------------------------------------------ user stories

    def offload(self, ks: Sequence[OffloadKey], data: Sequence[bytes] | None = None, *, wait: bool = True) -> ReqContext:
        """A request computed these blocks: the GPU worker fills their primary slots, vLLM
        completes the store, and the manager cascades them to the secondary tier."""
        data = data if data is not None else [block_bytes(k, self.block_size) for k in ks]
        ctx = self.ctx()
        with self.lock:
            self.manager.on_new_request(ctx)
            out = self.manager.prepare_store(list(ks), ctx)
            assert out is not None, "the primary tier refused the store"
            slots = {k: int(c) for k, c in zip(out.keys_to_store, out.store_spec.chunk_ids)}
        with self.view.cast("B") as flat:
            for k, d in zip(ks, data):
                if k in slots:
                    c = slots[k]
                    flat[c * self.block_size:(c + 1) * self.block_size] = d
        with self.lock:
            self.manager.complete_store(list(ks), ctx, success=True)
            self.manager.on_request_finished(ctx)
        if wait:
            self.wait_idle()
        return ctx

    def lookup_all(self, ctx: ReqContext, ks: Sequence[OffloadKey]) -> list[LookupResult]:
        with self.lock:
            return [self.manager.lookup(k, ctx) for k in ks]

    def resolve(self, ctx: ReqContext, ks: Sequence[OffloadKey], timeout: float = 60.0) -> int:
        """What vLLM's scheduler does each step for a new request: look the blocks up in
        order until a miss, step while any answer is deferred; the number of leading hits."""
        deadline = time.monotonic() + timeout
        while True:
            hits, deferred = 0, False
            with self.lock:
                for k in ks:
                    r = self.manager.lookup(k, ctx)
                    if r is LookupResult.MISS:
                        break
                    if r is LookupResult.HIT:
                        hits += 1
                    else:  # RETRY or HIT_PENDING: keep scanning, as vLLM does, then step
                        hits += 1
                        deferred = True
            if not deferred:
                return hits
            if time.monotonic() > deadline:
                raise TimeoutError("lookups stayed deferred")
            self.step()
            time.sleep(0.002)

    def fetch(self, ks: Sequence[OffloadKey], timeout: float = 60.0) -> list[bytes]:
        """A new request with this prefix: the leading blocks found in any tier, read from
        the primary slots vLLM would copy to the GPU."""
        ctx = self.ctx()
        with self.lock:
            self.manager.on_new_request(ctx)
        try:
            n = self.resolve(ctx, ks, timeout)
            if n == 0:
                return []
            with self.lock:
                spec = self.manager.prepare_load(list(ks[:n]), ctx)
            out = []
            with self.view.cast("B") as flat:
                for c in spec.chunk_ids:
                    c = int(c)
                    out.append(bytes(flat[c * self.block_size:(c + 1) * self.block_size]))
            with self.lock:
                self.manager.complete_load(list(ks[:n]), ctx)
            return out
        finally:
            with self.lock:
                self.manager.on_request_finished(ctx)

    def close(self) -> None:
        self.manager.shutdown()


SLOTS = 8
BLOCK = 256 << 10


class Harness:
    """One tier alone, built the way vLLM builds it (``SecondaryTierFactory`` from a
    ``secondary_tiers`` entry) over a primary view shaped like vLLM's ``(slots, block
    bytes)``, and the calls vLLM's tiering manager would make on it."""

    def __init__(self, url: str, *, events: bool = False, **settings) -> None:
        entry = {**TIER, "url": url, **settings}
        self.spec = TieringOffloadingSpec(offloading_config(Layout(worker_block_bytes=BLOCK), [entry], events=events))
        self.primary = bytearray(SLOTS * BLOCK)
        self.view = memoryview(self.primary).cast("B", (SLOTS, BLOCK))
        self.tier = SecondaryTierFactory.create_secondary_tier(entry, self.view, self.spec)
        self.ctx = ReqContext(req_id="test")
        self._next_job = 0

    def slot(self, i: int) -> bytes:
        return bytes(self.primary[i * BLOCK:(i + 1) * BLOCK])

    def fill(self, i: int, data: bytes) -> None:
        self.primary[i * BLOCK:(i + 1) * BLOCK] = data

    def job(self, ks: list[OffloadKey], slots: list[int], promotion: bool = False) -> TransferJob:
        import numpy as np

        self._next_job += 1
        return TransferJob(job_id=self._next_job, keys=ks, chunk_ids=np.array(slots, dtype=np.int32),
                           is_promotion=promotion, req_context=self.ctx)

    def store(self, ks: list[OffloadKey], slots: list[int]) -> list[JobResult]:
        for k, s in zip(ks, slots):
            self.fill(s, block_bytes(k, BLOCK))
        self.tier.submit_store(self.job(ks, slots))
        return self.drain()

    def load(self, ks: list[OffloadKey], slots: list[int]) -> list[JobResult]:
        self.tier.submit_load(self.job(ks, slots, promotion=True))
        return self.drain()

    def drain(self) -> list[JobResult]:
        self.tier.drain_jobs()
        return list(self.tier.get_finished_jobs())

    def lookup_and_wait(self, ks: list[OffloadKey], ctx: ReqContext | None = None) -> list[LookupResult]:
        ctx = ctx or self.ctx
        deadline = time.monotonic() + 30
        while True:
            results = [self.tier.lookup(k, ctx) for k in ks]
            if LookupResult.RETRY not in results or time.monotonic() > deadline:
                return results
            self.tier.on_schedule_end(STEP)
            time.sleep(0.005)

    def close(self) -> None:
        self.tier.shutdown()

