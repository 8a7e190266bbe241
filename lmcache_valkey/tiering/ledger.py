"""The ledger: every state of a chunk in the lower tiers, and what keeps its RAM copy
(docs/tiering-ledger.md).

Everything that affects these states lives here (the layout of python-hyper/h11's
``_state.py``); the engines (promotion, demotion, deletion) do the I/O and report each step
as an event. An event that makes no sense in the current state raises :class:`LedgerError`
instead of quietly leaving a set out of step with the others.

Per lower tier, a chunk's copy is in one state (:data:`COPY_TRANSITIONS`)::

    ABSENT  --write-->   WRITING  --landed-->  DURABLE        (a copy-down: NVMe now, S3 write-behind)
    WRITING --dropped--> ABSENT                               (refused, retries exhausted, closed)
    ABSENT  --found-->   DURABLE                              (the tier's inventory at a restart)
    DURABLE --lost-->    ABSENT                               (evicted for space, corrupt, absent, expired)
    any     --doom-->    DOOMED   --removed--> ABSENT         (delete, evict, expiry; the tier confirmed)

A write carries a *ticket*: a copy that lands after its write was superseded (a delete
doomed it, another write started) is stale, and the tier removes it again when the copy
state says nothing else will (``landed`` answers). Per key, besides its copies:

- a *generation*, changed by every delete: work that started under another one (a copy
  that read the RAM value, a promotion that read a lower copy) is dropped, so a late put
  hint or a slow read never resurrects a deleted chunk;
- whether a *delete intent* is recorded in Valkey (kept until every remote tier confirmed);
- whether its *expiry* is known (an object listing cannot tell it);
- *holds* on its RAM copy, which demotion respects (``policy.Demotion``): a promotion in
  flight, readers a promotion was made for (until they read it or ``promote_hold_s``
  passes), an engine's lease (lookup-and-lock; bounded in number: ``max_leases``).

A change of a chunk's durable tiers or expiry is reported to ``on_change`` (the manager
mirrors it into the chunk's tier marker in Valkey).

Sans-I/O: no tier, no Valkey, no clock of its own (times are passed in).
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

ABSENT, WRITING, DURABLE, DOOMED = "absent", "writing", "durable", "doomed"

# state -> event -> next state. Anything else is a LedgerError.
COPY_TRANSITIONS: dict[str, dict[str, str]] = {
    ABSENT: {"write": WRITING, "found": DURABLE, "doom": DOOMED, "removed": ABSENT},
    WRITING: {"landed": DURABLE, "dropped": ABSENT, "found": DURABLE, "doom": DOOMED},
    DURABLE: {"lost": ABSENT, "found": DURABLE, "doom": DOOMED},
    # a read in flight when the removal began may still report the copy gone
    DOOMED: {"removed": ABSENT, "doom": DOOMED, "lost": DOOMED},
}

TOMBSTONES_MAX = 100_000  # keys whose generation is remembered after their copies are gone


class LedgerError(RuntimeError):
    """An event the chunk's current state does not allow (a bug in the caller)."""


@dataclass(slots=True)
class Record:
    """What the ledger knows about one chunk with a copy in some state other than ABSENT."""

    value_len: int = 0
    copies: dict[str, str] = field(default_factory=dict)  # tier -> state (ABSENT: not listed)
    tickets: dict[str, int] = field(default_factory=dict)  # tier -> the write in flight
    last_access: float = 0.0  # Unix seconds
    expires_ms: int = 0  # Unix ms; 0 = never
    expiry_known: bool = True
    intent: bool = False  # a delete intent for it is recorded in Valkey

    def expired(self, now_ms: int | None = None) -> bool:
        return bool(self.expires_ms) and (now_ms if now_ms is not None else _now_ms()) >= self.expires_ms


@dataclass(slots=True)
class Holds:
    """What keeps a chunk's RAM copy from demotion."""

    promoting: int = 0
    readers: int = 0  # callers a promotion returned True to, not read yet
    readers_until: float = 0.0  # monotonic; past it the readers no longer hold it
    lease_holders: int = 0
    lease_until: float = 0.0  # monotonic

    def empty(self) -> bool:
        return not (self.promoting or self.readers or self.lease_holders)


class Ledger:
    def __init__(self, tiers: Sequence[str], *, max_leases: int = 1 << 16,
                 on_change: Callable[[bytes], None] | None = None) -> None:
        self.tiers = tuple(tiers)  # fastest first
        self.max_leases = max_leases
        self.on_change = on_change or (lambda key: None)
        self._records: dict[bytes, Record] = {}
        self._gens: OrderedDict[bytes, int] = OrderedDict()
        self._gen_seq = itertools.count(1)
        self._tickets = itertools.count(1)
        self._holds: dict[bytes, Holds] = {}
        self._leases = 0  # keys with a lease

    # --- copies ------------------------------------------------------------------------------
    def _tier(self, tier: str) -> None:
        if tier not in self.tiers:
            raise LedgerError(f"no tier {tier!r} (tiers: {', '.join(self.tiers)})")

    def _move(self, key: bytes, tier: str, event: str) -> Record:
        self._tier(tier)
        r = self._records.get(key)
        before = ABSENT if r is None else r.copies.get(tier, ABSENT)
        after = COPY_TRANSITIONS[before].get(event)
        if after is None:
            raise LedgerError(f"can't handle {event!r} for the {tier} copy of {key!r} in state {before!r}")
        if r is None:
            r = self._records[key] = Record(last_access=time.time())
        was = self._durable(r)
        if after == ABSENT:
            r.copies.pop(tier, None)
        else:
            r.copies[tier] = after
        if after != WRITING:
            r.tickets.pop(tier, None)
        if not r.copies:
            del self._records[key]
        if self._durable(r) != was:
            self.on_change(key)
        return r

    def state(self, key: bytes, tier: str) -> str:
        self._tier(tier)
        r = self._records.get(key)
        return ABSENT if r is None else r.copies.get(tier, ABSENT)

    def write(self, key: bytes, tier: str) -> int:
        """A copy-down to ``tier`` starts (only from ABSENT); returns its ticket."""
        r = self._move(key, tier, "write")
        r.tickets[tier] = ticket = next(self._tickets)
        return ticket

    def wanted(self, key: bytes, tier: str, ticket: int) -> bool:
        self._tier(tier)
        r = self._records.get(key)
        return r is not None and r.copies.get(tier) == WRITING and r.tickets.get(tier) == ticket

    def landed(self, key: bytes, tier: str, ticket: int, value_len: int, expires_ms: int) -> bool:
        """Write ``ticket`` is durable. False: stale, and nothing else will remove the copy it
        left (no write in flight, no durable copy): the caller removes it."""
        if not self.wanted(key, tier, ticket):
            return self.state(key, tier) in (WRITING, DURABLE)
        r = self._records[key]
        r.value_len = value_len
        if expires_ms:
            r.expires_ms = max(r.expires_ms, expires_ms)
        self._move(key, tier, "landed")
        return True

    def dropped(self, key: bytes, tier: str, ticket: int) -> None:
        if self.wanted(key, tier, ticket):
            self._move(key, tier, "dropped")

    def found(self, key: bytes, tier: str, value_len: int, *, last_access: float | None = None,
              expires_ms: int | None = 0) -> None:
        """The tier's inventory lists a copy (``expires_ms`` None: the listing cannot tell)."""
        r = self._records.get(key)
        if r is None or not r.copies:
            r = self._records[key] = Record(value_len, last_access=last_access or time.time())
        r.value_len = value_len
        if last_access is not None:
            r.last_access = max(r.last_access, last_access)
        if expires_ms is None:
            r.expiry_known = False
        elif expires_ms:
            r.expires_ms = max(r.expires_ms, expires_ms)
        self._move(key, tier, "found")

    def lost(self, key: bytes, tier: str) -> None:
        if self.state(key, tier) != ABSENT:
            self._move(key, tier, "lost")

    def doom(self, key: bytes, tier: str) -> str:
        """A removal of the copy starts; returns the state it was in."""
        before = self.state(key, tier)
        self._move(key, tier, "doom")
        return before

    def removed(self, key: bytes, tier: str) -> None:
        self._move(key, tier, "removed")

    def doomed(self, tier: str | None = None) -> list[bytes]:
        """Keys with a removal not confirmed yet (by ``tier``)."""
        return [k for k, r in self._records.items()
                if any(s == DOOMED and (tier is None or t == tier) for t, s in r.copies.items())]

    # --- per-key facts -----------------------------------------------------------------------
    def set_expiry(self, key: bytes, expires_ms: int) -> None:
        """A copy recorded this expiry (a promotion read it, or a HEAD did)."""
        r = self._records.get(key)
        if r is None:
            return
        r.expiry_known = True
        if expires_ms and expires_ms != r.expires_ms:
            r.expires_ms = max(r.expires_ms, expires_ms)
            self.on_change(key)

    def expiry_unknown(self, limit: int) -> list[bytes]:
        return list(itertools.islice((k for k, r in self._records.items() if not r.expiry_known and self._durable(r)),
                                     limit))

    def record_intent(self, keys: Iterable[bytes], recorded: bool = True) -> None:
        for k in keys:
            r = self._records.get(k)
            if r is not None:
                r.intent = recorded

    def intent(self, key: bytes) -> bool:
        r = self._records.get(key)
        return r is not None and r.intent

    def touch(self, key: bytes) -> None:
        r = self._records.get(key)
        if r is not None:
            r.last_access = time.time()

    # --- generations -------------------------------------------------------------------------
    def gen(self, key: bytes) -> int:
        return self._gens.get(key, 0)

    def current(self, key: bytes, gen: int) -> bool:
        """No delete of ``key`` happened since generation ``gen`` was read."""
        return self._gens.get(key, 0) == gen

    def bump(self, keys: Iterable[bytes]) -> None:
        """A delete: work started under the old generation is dropped."""
        for k in keys:
            self._gens[k] = next(self._gen_seq)
            self._gens.move_to_end(k)
        while len(self._gens) > TOMBSTONES_MAX:
            self._gens.popitem(last=False)

    # --- queries (durable copies only) -------------------------------------------------------
    @staticmethod
    def _durable(r: Record | None) -> tuple[str, ...]:
        return () if r is None else tuple(t for t, s in r.copies.items() if s == DURABLE)

    def get(self, key: bytes) -> Record | None:
        """The chunk's record when some tier holds a durable, unexpired copy."""
        r = self._records.get(key)
        if r is None or not self._durable(r) or r.expired():
            return None
        return r

    def tiers_of(self, key: bytes) -> list[str]:
        """The tiers holding a durable, unexpired copy, fastest first."""
        r = self.get(key)
        return [] if r is None else [t for t in self.tiers if r.copies.get(t) == DURABLE]

    def __contains__(self, key: bytes) -> bool:
        return bool(self._durable(self._records.get(key)))

    def __len__(self) -> int:
        return sum(1 for r in self._records.values() if self._durable(r))

    def keys(self, *, tier: str | None = None, prefix: bytes = b"") -> list[bytes]:
        return [k for k, r in self._records.items() if k.startswith(prefix)
                and (r.copies.get(tier) == DURABLE if tier else bool(self._durable(r)))]

    def expired_keys(self) -> list[bytes]:
        now = _now_ms()
        return [k for k, r in self._records.items() if r.expired(now) and self._durable(r)]

    def stats(self) -> dict[str, dict[str, int]]:
        out = {t: {"chunks": 0, "bytes": 0} for t in self.tiers}
        for r in self._records.values():
            for t in self._durable(r):
                out[t]["chunks"] += 1
                out[t]["bytes"] += r.value_len
        return out

    # --- holds on the RAM copy ---------------------------------------------------------------
    def _hold(self, key: bytes) -> Holds:
        h = self._holds.get(key)
        if h is None:
            h = self._holds[key] = Holds()
        return h

    def _settle(self, key: bytes, h: Holds) -> None:
        if h.empty():
            self._holds.pop(key, None)

    def promoting(self, key: bytes, on: bool) -> None:
        h = self._hold(key)
        h.promoting += 1 if on else -1
        self._settle(key, h)

    def await_reader(self, key: bytes, until: float) -> None:
        """A promotion returned True to a caller that will now read the RAM copy."""
        h = self._hold(key)
        h.readers += 1
        h.readers_until = max(h.readers_until, until)

    def reader_done(self, key: bytes) -> None:
        h = self._holds.get(key)
        if h is not None and h.readers:
            h.readers -= 1
            self._settle(key, h)

    def lease(self, key: bytes, until: float) -> bool | None:
        """One more holder of ``key``'s lease. True: a new lease (pin its copies), False: an
        extra holder, None: refused (``max_leases`` keys are leased already)."""
        h = self._holds.get(key)
        if h is not None and h.lease_holders:
            h.lease_holders += 1
            h.lease_until = max(h.lease_until, until)
            return False
        if self._leases >= self.max_leases:
            return None
        h = self._hold(key)
        h.lease_holders, h.lease_until = 1, until
        self._leases += 1
        return True

    def release(self, key: bytes) -> bool:
        """One holder fewer; True when the lease ended (unpin its copies)."""
        h = self._holds.get(key)
        if h is None or not h.lease_holders:
            return False
        h.lease_holders -= 1
        if h.lease_holders:
            return False
        self._end_lease(key, h)
        return True

    def _end_lease(self, key: bytes, h: Holds) -> None:
        h.lease_holders, h.lease_until = 0, 0.0
        self._leases -= 1
        self._settle(key, h)

    def leased(self, key: bytes, now: float) -> bool:
        h = self._holds.get(key)
        return h is not None and h.lease_holders > 0 and h.lease_until > now

    @property
    def lease_count(self) -> int:
        return self._leases

    def expire_holds(self, now: float) -> list[bytes]:
        """End leases and reader holds past their deadline; returns the keys whose lease ended."""
        ended = []
        for k, h in list(self._holds.items()):
            if h.readers and h.readers_until <= now:
                h.readers = 0
            if h.lease_holders and h.lease_until <= now:
                self._end_lease(k, h)
                ended.append(k)
            self._settle(k, h)
        return ended

    def held(self, key: bytes, now: float) -> tuple[bool, bool, bool]:
        """(promoting, awaiting its reader, leased) for the demotion policy."""
        h = self._holds.get(key)
        if h is None:
            return False, False, False
        return (h.promoting > 0, h.readers > 0 and h.readers_until > now,
                h.lease_holders > 0 and h.lease_until > now)


def _now_ms() -> int:
    return int(time.time() * 1000)


__all__ = ["ABSENT", "COPY_TRANSITIONS", "DOOMED", "DURABLE", "Ledger", "LedgerError", "Record", "WRITING"]
