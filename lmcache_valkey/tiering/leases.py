"""Leases: an engine's lookup-and-lock (LMCache MP's ``submit_lookup_and_lock_task``).

A leased chunk stays loadable: the ledger holds its RAM copy from demotion, and every lower
tier pins its copy (never evicted for space; a delete meanwhile removes it at the release)
until the last holder releases it or its deadline passes, which bounds what a worker that
died holding it can keep. At most ``max_leases`` chunks are leased at once (per tenant:
tierd serves one); past that a lease is refused, counted and logged.

Never imports: aiobotocore, valkey-py, the store, the integrations.
"""

from __future__ import annotations

import logging
import time
from typing import Sequence

from . import requests
from .context import Wing

log = logging.getLogger(__name__)


class Leases:
    def __init__(self, wing: Wing) -> None:
        self.w = wing
        self.ledger = wing.ledger
        self._log = requests.RateLimitedLog(log, "tiering: lease refused")

    def lease(self, keys: Sequence[bytes], ttl_s: float) -> None:
        """Keep ``keys`` loadable for up to ``ttl_s``. Counted: each call needs a release."""
        until = time.monotonic() + ttl_s
        for k in keys:
            new = self.ledger.lease(k, until)
            if new is None:  # max_leases chunks are leased: refused (the load may then miss)
                self.w.counters["leases_refused"] += 1
                self._log.note(f"{self.ledger.lease_count} chunks leased (max_leases)")
            elif new:
                for t in self.w.tiers:
                    t.pins.hold(k)

    def release(self, keys: Sequence[bytes]) -> None:
        """End one lease of each key (unknown or expired keys are ignored)."""
        for k in keys:
            if self.ledger.release(k):
                self._unpin(k)

    def leased(self, key: bytes) -> bool:
        return self.ledger.leased(key, time.monotonic())

    def expire(self) -> int:
        """End leases (and holds for readers) past their deadline: their holder is gone."""
        ended = self.ledger.expire_holds(time.monotonic())
        for k in ended:
            self._unpin(k)
        return len(ended)

    def _unpin(self, key: bytes) -> None:
        for t in self.w.tiers:
            t.pins.drop(key)


__all__ = ["Leases"]
