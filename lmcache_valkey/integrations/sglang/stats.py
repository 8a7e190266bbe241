"""What the backend reports to SGLang's storage metrics (``--enable-cache-report`` /
``enable_storage_metrics``): pages per prefetch and backup call and their bandwidth in GB/s,
the fields of SGLang's ``StorageMetrics``, which ``get_stats`` hands over and resets.

Hits, misses (by cause), bytes and latencies per tier also go to our own Prometheus series
(``lmcache_valkey_*``, docs/metrics.md), recorded by the store.
"""

from __future__ import annotations

import threading
from typing import Any

_GB = float(1 << 30)


class BackendStats:
    """Thread-safe: SGLang's prefetch and backup threads record, its scheduler takes."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled  # nothing is kept when SGLang never asks (no unbounded lists)
        self._lock = threading.Lock()
        self._prefetch_pgs: list[int] = []
        self._backup_pgs: list[int] = []
        self._prefetch_bw: list[float] = []
        self._backup_bw: list[float] = []
        self.skipped_pages = 0  # MLA non-writer ranks: pages left to the shard's writer

    def prefetch(self, pages: int, page_bytes: int, seconds: float) -> None:
        self._record(self._prefetch_pgs, self._prefetch_bw, pages, page_bytes, seconds)

    def backup(self, pages: int, page_bytes: int, seconds: float) -> None:
        self._record(self._backup_pgs, self._backup_bw, pages, page_bytes, seconds)

    def skipped(self, pages: int) -> None:
        with self._lock:
            self.skipped_pages += pages

    def _record(self, pgs: list[int], bw: list[float], pages: int, page_bytes: int, seconds: float) -> None:
        if not self.enabled or pages <= 0:
            return
        with self._lock:
            pgs.append(pages)
            bw.append(pages * page_bytes / _GB / max(seconds, 1e-9))

    def take(self) -> Any:
        """SGLang's ``StorageMetrics`` with everything recorded since the last call."""
        from sglang.srt.observability.metrics_collector import StorageMetrics

        with self._lock:
            out = StorageMetrics(prefetch_pgs=self._prefetch_pgs, backup_pgs=self._backup_pgs,
                                 prefetch_bandwidth=self._prefetch_bw, backup_bandwidth=self._backup_bw)
            self._prefetch_pgs, self._backup_pgs, self._prefetch_bw, self._backup_bw = [], [], [], []
        return out


__all__ = ["BackendStats"]
