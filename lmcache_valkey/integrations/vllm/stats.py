"""The tier's own series on vLLM's ``/metrics``, through vLLM's offloading stats payload.

vLLM already counts what every tier shares (bytes and time per job, lookups, hits, failed
jobs, promotion latency) from the ``JobResult``s a tier reports. These add what only this
tier knows: blocks by outcome (stored, skipped as already present, failed), and how long
its batched existence checks take. The store's own Prometheus series (``lmcache_valkey_*``:
misses by cause, errors, latency per transport) live in vLLM's engine process and reach its
``/metrics`` only through a multi-process directory: vLLM creates one with
``--api-server-count`` > 1, otherwise the operator sets ``PROMETHEUS_MULTIPROC_DIR``
(docs/metrics.md; the tier warns at start-up when it is unset).
"""

from __future__ import annotations

from .compat import (
    OffloadingConnectorStats,
    OffloadingCounterMetadata,
    OffloadingHistogramMetadata,
    OffloadingMetricMetadata,
)

BLOCKS = "vllm:kv_offload_valkey_blocks"
LOOKUP_BATCH_SECONDS = "vllm:kv_offload_valkey_lookup_batch_seconds"
LOOKUP_KEYS = "vllm:kv_offload_valkey_lookup_keys"

OPS = ("store", "load")
OUTCOMES = ("ok", "skipped", "failed")


def definitions() -> dict[str, OffloadingMetricMetadata]:
    return {
        BLOCKS: OffloadingCounterMetadata(
            documentation=(
                "Blocks moved between vLLM's primary tier and Valkey, by operation and outcome "
                "(skipped: a store of a block Valkey already holds)."
            ),
            labelnames=("tier_type", "op", "outcome"),
        ),
        LOOKUP_BATCH_SECONDS: OffloadingHistogramMetadata(
            documentation="Round trip of one batched existence check against Valkey, in seconds.",
            labelnames=("tier_type",),
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
        ),
        LOOKUP_KEYS: OffloadingCounterMetadata(
            documentation="Keys answered by Valkey's batched existence checks, by result.",
            labelnames=("tier_type", "result"),
        ),
    }


class TierStats:
    """Observations since the last :meth:`take`; scheduler thread only."""

    def __init__(self, tier_type: str) -> None:
        self._tier = tier_type
        self._stats = OffloadingConnectorStats()

    def blocks(self, op: str, outcome: str, n: int) -> None:
        if n:
            self._stats.increase_counter(BLOCKS, n, (self._tier, op, outcome))

    def lookup_batch(self, seconds: float, found: int, missing: int) -> None:
        self._stats.observe_histogram(LOOKUP_BATCH_SECONDS, seconds, (self._tier,))
        if found:
            self._stats.increase_counter(LOOKUP_KEYS, found, (self._tier, "hit"))
        if missing:
            self._stats.increase_counter(LOOKUP_KEYS, missing, (self._tier, "miss"))

    def take(self) -> OffloadingConnectorStats | None:
        stats, self._stats = self._stats, OffloadingConnectorStats()
        return None if stats.is_empty() else stats


__all__ = ["BLOCKS", "LOOKUP_BATCH_SECONDS", "LOOKUP_KEYS", "TierStats", "definitions"]
