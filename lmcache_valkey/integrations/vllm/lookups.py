"""Lookup verdicts for vLLM's scheduler thread, answered by batched existence checks.

vLLM asks a tier about one key at a time, under its manager lock, and nothing there may
block. So a key's first ``lookup`` answers "not known yet" (the tier says RETRY); at the end
of the step the tier takes every key asked about as one batch, checks them all in one round
trip on its I/O loop, and the answers are applied on the scheduler thread before the next
step's lookups read them. Everything that moves a key between states lives here:

    (none) --lookup--> PENDING --take_batch--> IN_FLIGHT --resolve--> RESOLVED
    RESOLVED --lookup by a new request, verdict older than reuse_s--> PENDING (asked again)
    RESOLVED --mark(found)--> RESOLVED           a load failed / a store landed
    PENDING | RESOLVED --release of its last request--> (none)
    IN_FLIGHT --release of its last request--> IN_FLIGHT, dropped when its answer arrives

A request keeps the verdict it saw until it finishes (vLLM calls ``on_request_finished``);
requests that arrive together share one probe. A request that arrives later reuses a verdict
only while it is fresh (``reuse_s``): a block another server stored since, or a server that
answers again after a failed lookup, is seen by the next request even while an older,
long-running request still refers to the key. Each probe has a generation: an answer for a
probe that was superseded is ignored.

Never imports: ``vllm``; any I/O. Keys are opaque bytes, requests opaque strings.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Iterable, Sequence

# How long a verdict serves requests that did not ask for it: long enough for the requests
# scheduled in the same step (and the next) to share one probe, short enough that Valkey's
# state of now, not of a minute ago, answers a new request.
REUSE_S = 1.0


class Phase(Enum):
    PENDING = "pending"  # asked about; not sent yet
    IN_FLIGHT = "in_flight"  # in a batch on its way to Valkey
    RESOLVED = "resolved"  # answered


@dataclass(slots=True)
class _Entry:
    generation: int
    phase: Phase = Phase.PENDING
    found: bool | None = None
    requests: set[str] = field(default_factory=set)
    resolved_at: float = 0.0


class LookupBook:
    """Owned by the scheduler thread (vLLM's manager lock); not thread-safe by itself."""

    def __init__(self, reuse_s: float = REUSE_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._reuse_s = reuse_s
        self._clock = clock
        self._entries: dict[bytes, _Entry] = {}
        self._by_request: dict[str, set[bytes]] = {}
        self._pending: list[tuple[bytes, int]] = []
        self._next_generation = 0

    def lookup(self, key: bytes, request_id: str) -> bool | None:
        """The verdict for ``key``: True/False, or None while it is not known yet."""
        entry = self._entries.get(key)
        if entry is None:
            entry = _Entry(self._next_generation)
            self._next_generation += 1
            self._entries[key] = entry
            self._pending.append((key, entry.generation))
        elif request_id not in entry.requests and not self._fresh(entry):
            # A new request, an old verdict: ask Valkey again (superseding the old probe).
            entry.generation = self._next_generation
            self._next_generation += 1
            entry.phase, entry.found = Phase.PENDING, None
            self._pending.append((key, entry.generation))
        entry.requests.add(request_id)
        self._by_request.setdefault(request_id, set()).add(key)
        return entry.found

    def take_batch(self) -> list[tuple[bytes, int]]:
        """Every key asked about since the last batch, as (key, generation): now IN_FLIGHT."""
        batch = []
        for key, generation in self._pending:
            entry = self._entries.get(key)
            if entry is None or entry.generation != generation or entry.phase is not Phase.PENDING:
                continue  # released before it was sent
            entry.phase = Phase.IN_FLIGHT
            batch.append((key, generation))
        self._pending = []
        return batch

    def resolve(self, answers: Iterable[tuple[bytes, int, bool]]) -> None:
        """Apply a batch's answers (key, generation, found)."""
        for key, generation, found in answers:
            entry = self._entries.get(key)
            if entry is None or entry.generation != generation or entry.phase is not Phase.IN_FLIGHT:
                continue
            if not entry.requests:  # every request let go while it was in flight
                del self._entries[key]
                continue
            entry.phase = Phase.RESOLVED
            entry.found = found
            entry.resolved_at = self._clock()

    def mark(self, keys: Sequence[bytes], found: bool) -> None:
        """Replace answered verdicts: False after a failed load (the scheduler must not
        promote it again and again), True after this tier stored the block. A key still
        pending or in flight keeps its own answer."""
        for key in keys:
            entry = self._entries.get(key)
            if entry is not None and entry.phase is Phase.RESOLVED:
                entry.found = found
                entry.resolved_at = self._clock()

    def known_present(self, key: bytes) -> bool:
        """Valkey answered (or this tier stored) the block lately: no need to send it again."""
        entry = self._entries.get(key)
        return entry is not None and entry.phase is Phase.RESOLVED and bool(entry.found) and self._fresh(entry)

    def _fresh(self, entry: _Entry) -> bool:
        return entry.phase is not Phase.RESOLVED or self._clock() - entry.resolved_at <= self._reuse_s

    def release(self, request_id: str) -> None:
        """The request finished: drop the verdicts no other request refers to."""
        for key in self._by_request.pop(request_id, ()):
            entry = self._entries.get(key)
            if entry is None:
                continue
            entry.requests.discard(request_id)
            if not entry.requests and entry.phase is not Phase.IN_FLIGHT:
                del self._entries[key]

    def in_flight(self) -> int:
        return sum(1 for e in self._entries.values() if e.phase is Phase.IN_FLIGHT)

    def __len__(self) -> int:
        return len(self._entries)


__all__ = ["LookupBook", "Phase"]
