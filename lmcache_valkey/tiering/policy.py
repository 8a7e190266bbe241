"""Tiering policies: admission, demotion, retrieval cost, circuit breaker.

Pure logic with an injectable clock; no I/O. Never imports aiobotocore or a transport.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Sequence

Clock = Callable[[], float]


class Admission:
    """Admit a chunk to the lower tiers on its ``min_touches``-th touch (put or hit).

    ``min_touches`` 1 = always, 2 = second touch; higher = frequency. The counter remembers
    at most ``window`` chunks (LRU), so one-time prompts age out without growing memory.
    """

    def __init__(self, min_touches: int = 2, window: int = 1 << 20) -> None:
        self.min_touches = max(1, min_touches)
        self.window = window
        self._counts: OrderedDict[bytes, int] = OrderedDict()

    def touch(self, key: bytes, n: int = 1) -> int:
        c = self._counts.pop(key, 0) + n
        self._counts[key] = c
        while len(self._counts) > self.window:
            self._counts.popitem(last=False)
        return c

    def count(self, key: bytes) -> int:
        return self._counts.get(key, 0)

    def admit(self, key: bytes) -> bool:
        return self.min_touches <= 1 or self._counts.get(key, 0) >= self.min_touches

    def forget(self, key: bytes) -> None:
        self._counts.pop(key, None)


@dataclass(frozen=True)
class MemoryState:
    used: int
    maxmemory: int  # 0 = unlimited

    @property
    def ratio(self) -> float:
        return self.used / self.maxmemory if self.maxmemory else 0.0


def parse_info_memory(text: str | bytes) -> MemoryState:
    """``INFO memory`` reply -> used_memory / maxmemory."""
    if isinstance(text, (bytes, bytearray)):
        text = text.decode()
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line and not line.startswith("#"))
    return MemoryState(int(fields.get("used_memory", 0)), int(fields.get("maxmemory", 0)))


@dataclass(frozen=True)
class Candidate:
    """A chunk value in Valkey RAM, as the demotion pass sees it (plain facts, no I/O)."""

    key: bytes
    idle_s: float  # OBJECT IDLETIME
    lower: bool = False  # some lower tier holds a durable copy (its RAM copy can simply go)
    admitted: bool = False  # admission would copy it down first (matters only without ``lower``)
    promoting: bool = False  # a promotion is staging it
    awaiting_reader: bool = False  # promoted for a worker that has not read it yet
    leased: bool = False  # an engine's lookup-and-lock holds it


class Demotion:
    """Which RAM copies move out, and when a pass has done enough.

    Above the high watermark of ``maxmemory`` a pass frees down to the low one, most idle
    first; with ``idle_s``, copies idle longer than that go whatever the memory. A copy being
    promoted, promoted for a worker that has not read it yet (until ``promote_hold_s``), or
    under a lease stays; one no lower tier holds goes only if admission lets it be copied down
    first (one-time prompts are left to Valkey's own eviction policy).
    """

    def __init__(self, high: float = 0.85, low: float = 0.70, idle_s: float | None = None) -> None:
        self.high, self.low, self.idle_s = high, low, idle_s

    def bytes_to_free(self, mem: MemoryState) -> int:
        if not mem.maxmemory or mem.used < self.high * mem.maxmemory:
            return 0
        return int(mem.used - self.low * mem.maxmemory)

    def room_for(self, mem: MemoryState, nbytes: int) -> int:
        """Bytes to free before staging ``nbytes`` more (promotion)."""
        if not mem.maxmemory:
            return 0
        over = mem.used + nbytes - self.high * mem.maxmemory
        return int(mem.used + nbytes - self.low * mem.maxmemory) if over > 0 else 0

    def idle_enough(self, idle_s: float) -> bool:
        return self.idle_s is not None and idle_s >= self.idle_s

    def eligible(self, c: Candidate) -> bool:
        return not (c.promoting or c.awaiting_reader or c.leased) and (c.lower or c.admitted)

    def plan(self, candidates: Sequence[Candidate]) -> list[Candidate]:
        """The copies a pass may remove, in the order it tries them (most idle first)."""
        return sorted((c for c in candidates if self.eligible(c)), key=lambda c: -c.idle_s)

    def enough(self, freed: int, need: int, idle_s: float) -> bool:
        """Stop before a copy idle for ``idle_s``: ``need`` bytes are freed and it is not idle
        enough to go anyway (``need`` 0: an idle-only pass)."""
        return freed >= need and not self.idle_enough(idle_s)


class CostModel:
    """Expected retrieval time per tier: latency + bytes * seconds-per-byte, both EWMA-measured.

    A tier whose expected time exceeds the recompute budget (or what is left of the
    caller's deadline) is skipped: a slow hit must never cost more than recompute.

    - Seconds per byte (not bytes per second) is averaged, so one slow read weighs as much
      as it costs (averaging bandwidth underweights slow reads).
    - Without a measured first-byte latency, each sample is split against the current
      estimates (``seconds - nbytes * spb`` for the latency, the rest for the transfer), so
      both can rise and fall.
    - A skipped tier is never read, so it could never be re-measured: every
      ``probe_interval_s`` one read is allowed anyway (a probe, :meth:`admit`), and reads the
      tier answered without a usable copy are observed as well (:meth:`failure`).
    - A probe that answers faster than the estimate restarts the estimate at that sample
      (everything the estimate holds is older than the probe): a tier whose estimate was
      pushed up by reads that waited out an outage (a black hole lets them through when it
      lifts, and they are timed as very slow reads) is read again one probe after the store
      answers, not once EWMA steps at ``probe_interval_s`` each have worn it down (that took
      minutes, issue 28). A probe slower than the estimate is an ordinary sample.
    - Reads the tier did not answer (a timeout, an outage) are no samples: they would keep a
      tier that is back "too slow" until probes wear the estimate down (docs/tiering-promotion.md).
    """

    READ, PROBE, SKIP = "read", "probe", "skip"

    def __init__(self, alpha: float = 0.2, prior: dict[str, tuple[float, float]] | None = None, *,
                 probe_interval_s: float = 1.0, clock: Clock = time.monotonic) -> None:
        self.alpha = alpha
        self.probe_interval_s = probe_interval_s
        self._clock = clock
        # tier -> (latency s, seconds per byte); optimistic priors until measured.
        prior = prior or {"nvme": (0.0005, 1.0e9), "s3": (0.02, 2.0e8)}
        self._prior: dict[str, tuple[float, float]] = {t: (lat, 1.0 / max(bw, 1.0)) for t, (lat, bw) in prior.items()}
        self._est: dict[str, tuple[float, float]] = dict(self._prior)
        self._last_try: dict[str, float] = {}
        self.probes = 0

    def observe(self, tier: str, nbytes: int, seconds: float, *, latency_s: float | None = None,
                probe: bool = False) -> None:
        """A read the tier answered in ``seconds``. ``probe``: the read :meth:`admit` allowed
        although the estimate said too slow; faster than the estimate, it restarts it."""
        lat0, spb0 = self._est.get(tier, (0.0, 1.0e-9))
        seconds = max(0.0, seconds)
        if probe and latency_s is None and seconds < self.expected(tier, nbytes):
            # the estimate is stale: start again from this sample (the prior's transfer rate,
            # the rest latency), so expected() for this size is what the probe just took
            spb = self._prior.get(tier, (0.0, spb0))[1]
            if nbytes > 0:
                spb = min(spb, seconds / nbytes)
            self._est[tier] = (max(0.0, seconds - max(nbytes, 0) * spb), spb)
            self._last_try[tier] = self._clock()
            return
        if latency_s is not None:
            lat = latency_s
            spb = max(seconds - lat, 0.0) / nbytes if nbytes > 0 else spb0
        elif nbytes <= 0:
            lat, spb = seconds, spb0
        else:
            lat = max(0.0, seconds - nbytes * spb0)
            spb = max(seconds - lat0, 0.0) / nbytes
        a = self.alpha
        self._est[tier] = ((1 - a) * lat0 + a * lat, (1 - a) * spb0 + a * spb)
        self._last_try[tier] = self._clock()

    def failure(self, tier: str, nbytes: int, seconds: float, *, probe: bool = False) -> None:
        """A read the tier answered after ``seconds`` without a usable copy (absent, corrupt):
        it counts as at least that slow (a probe: as that fast, too)."""
        if seconds > self.expected(tier, nbytes) or probe:
            self.observe(tier, nbytes, seconds, probe=probe)
        else:
            self._last_try[tier] = self._clock()

    def expected(self, tier: str, nbytes: int) -> float:
        lat, spb = self._est.get(tier, (0.0, 1.0e-9))
        return lat + nbytes * spb

    def admit(self, tier: str, nbytes: int, budget_s: float) -> str:
        """READ (expected within ``budget_s``), PROBE (too slow, but ``probe_interval_s``
        passed since the tier was last tried: this read re-measures it; pass ``probe=True``
        with its sample) or SKIP."""
        if self.expected(tier, nbytes) <= budget_s:
            return self.READ
        now = self._clock()
        last = self._last_try.setdefault(tier, now)
        if budget_s > 0 and now - last >= self.probe_interval_s:
            self._last_try[tier] = now  # one probe read re-measures the tier
            self.probes += 1
            return self.PROBE
        return self.SKIP

    def affordable(self, tier: str, nbytes: int, budget_s: float) -> bool:
        return self.admit(tier, nbytes, budget_s) != self.SKIP

    def snapshot(self) -> dict[str, dict[str, float]]:
        return {t: {"latency_s": lat, "bandwidth_Bps": 1.0 / spb if spb > 0 else float("inf")}
                for t, (lat, spb) in self._est.items()}


class CircuitBreaker:
    """closed -> (``failures`` consecutive failures) -> open -> (``reset_s``) -> half_open
    -> one probe: success closes, failure re-opens."""

    CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"

    def __init__(self, failures: int = 5, reset_s: float = 5.0, clock: Clock = time.monotonic,
                 on_change: Callable[[str], None] | None = None) -> None:
        self.failures, self.reset_s, self._clock = failures, reset_s, clock
        self._state = self.CLOSED
        self._consecutive = 0
        self._opened_at = 0.0
        self._probing = False
        self._on_change = on_change
        self.opened_count = 0

    @property
    def state(self) -> str:
        if self._state == self.OPEN and self._clock() - self._opened_at >= self.reset_s:
            self._set(self.HALF_OPEN)
        return self._state

    def _set(self, state: str) -> None:
        if state != self._state:
            self._state = state
            if state == self.OPEN:
                self.opened_count += 1
            if self._on_change:
                self._on_change(state)

    def allow(self) -> bool:
        """May a request go now? In half_open only one probe at a time."""
        s = self.state
        if s == self.CLOSED:
            return True
        if s == self.HALF_OPEN and not self._probing:
            self._probing = True
            return True
        return False

    def retry_in(self) -> float:
        if self._state != self.OPEN:
            return 0.05
        return max(0.0, self.reset_s - (self._clock() - self._opened_at)) + 0.01

    @property
    def probing(self) -> bool:
        """A half-open probe is in flight (the caller that just got ``allow()`` owns it)."""
        return self._probing

    def release_probe(self) -> None:
        """The probe ended without a verdict (cancelled, or a refusal that says nothing
        about the store's health): let the next request probe."""
        self._probing = False

    def success(self) -> None:
        self._consecutive = 0
        self._probing = False
        self._set(self.CLOSED)

    def failure(self) -> None:
        self._consecutive += 1
        self._probing = False
        if self._state == self.HALF_OPEN or self._consecutive >= self.failures:
            self._opened_at = self._clock()
            self._set(self.OPEN)
