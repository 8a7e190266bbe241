"""Tier index: which tiers hold which chunk, its size, last access, expiry; pins; markers.

The index is in memory and rebuildable: the NVMe tier's file headers and the object tier's
listing (object key + metadata) repopulate it after a restart (see ``TierManager.start``).
Tier markers in Valkey (``<ns>:t:{<id>}``, same Cluster slot as the data key) mirror
"some lower tier holds this chunk", so a worker's one-round-trip ``EXISTS data marker``
sees lower-tier presence. Marker value: the tier letters (``n`` NVMe, ``s`` object store).

Never imports: aiobotocore, valkey-py, the store or the integrations.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

from ..keys import DATA, TIER_MARKER, parse_data_key

TIER_LETTERS = {"nvme": "n", "s3": "s"}
LOWER_TIERS = ("nvme", "s3")  # fastest first


def marker_of(data_key: bytes) -> bytes:
    """The tier-marker key of a data key (``...:c:{id}`` -> ``...:t:{id}``)."""
    head, sep, tail = data_key.rpartition(f":{DATA}:{{".encode())
    if not sep:
        raise ValueError(f"not a data key: {data_key!r}")
    return head + f":{TIER_MARKER}:{{".encode() + tail


def data_of(marker_key: bytes) -> bytes:
    head, sep, tail = marker_key.rpartition(f":{TIER_MARKER}:{{".encode())
    if not sep:
        raise ValueError(f"not a marker key: {marker_key!r}")
    return head + f":{DATA}:{{".encode() + tail


def split_data_key(data_key: bytes) -> tuple[str, str, str, str]:
    """``<prefix>:<tenant>:<ns digest>:c:{<id>}`` -> (prefix, tenant, digest, id), every
    segment checked against the key grammar (ValueError otherwise): what reaches an object
    key or a file name never holds '/', '..' or another tenant's path."""
    return tuple(parse_data_key(data_key))  # type: ignore[return-value]


@dataclass
class Entry:
    value_len: int
    tiers: set[str] = field(default_factory=set)
    last_access: float = 0.0
    expires_ms: int = 0  # 0 = never

    def expired(self, now_ms: int | None = None) -> bool:
        return bool(self.expires_ms) and (now_ms if now_ms is not None else int(time.time() * 1000)) >= self.expires_ms


class TierIndex:
    """Presence of chunks in the lower tiers (RAM presence is Valkey's own business)."""

    def __init__(self) -> None:
        self._e: dict[bytes, Entry] = {}

    def __len__(self) -> int:
        return len(self._e)

    def __contains__(self, key: bytes) -> bool:
        return key in self._e

    def add(self, key: bytes, tier: str, value_len: int, *, last_access: float | None = None, expires_ms: int = 0) -> Entry:
        e = self._e.get(key)
        if e is None:
            e = self._e[key] = Entry(value_len, set(), last_access or time.time(), expires_ms)
        e.tiers.add(tier)
        e.value_len = value_len
        if last_access is not None:
            e.last_access = max(e.last_access, last_access)
        if expires_ms:
            e.expires_ms = max(e.expires_ms, expires_ms)
        return e

    def discard(self, key: bytes, tier: str) -> set[str]:
        """Forget ``tier``'s copy; returns the tiers still holding the chunk."""
        e = self._e.get(key)
        if e is None:
            return set()
        e.tiers.discard(tier)
        if not e.tiers:
            del self._e[key]
            return set()
        return set(e.tiers)

    def remove(self, key: bytes) -> Entry | None:
        return self._e.pop(key, None)

    def get(self, key: bytes) -> Entry | None:
        e = self._e.get(key)
        if e is not None and e.expired():
            return None
        return e

    def tiers_of(self, key: bytes) -> list[str]:
        e = self.get(key)
        return [t for t in LOWER_TIERS if e is not None and t in e.tiers]

    def touch(self, key: bytes) -> None:
        e = self._e.get(key)
        if e is not None:
            e.last_access = time.time()

    def keys(self, *, tier: str | None = None, prefix: bytes = b"") -> list[bytes]:
        return [k for k, e in self._e.items() if k.startswith(prefix) and (tier is None or tier in e.tiers)]

    def expired_keys(self) -> list[bytes]:
        now = int(time.time() * 1000)
        return [k for k, e in self._e.items() if e.expired(now)]

    def stats(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {t: {"chunks": 0, "bytes": 0} for t in LOWER_TIERS}
        for e in self._e.values():
            for t in e.tiers:
                out[t]["chunks"] += 1
                out[t]["bytes"] += e.value_len
        return out


class ChunkRead:
    """A verified chunk read from a lower tier: ``header`` (codec header) and ``payload``
    are views of one buffer that may be pooled; call :meth:`release` when done with them
    (after which the views must not be used)."""

    __slots__ = ("header", "payload", "_release", "expires_ms")

    def __init__(self, header: memoryview, payload: memoryview, release: Callable[[], None] | None = None,
                 *, expires_ms: int = 0) -> None:
        self.header, self.payload, self._release = header, payload, release
        self.expires_ms = expires_ms  # the copy's own record of the chunk's expiry (Unix ms, 0 = never)

    def release(self) -> None:
        r, self._release = self._release, None
        if r is not None:
            r()

    def __iter__(self):  # (header, payload) unpacking
        return iter((self.header, self.payload))


def marker_value(tiers: set[str] | list[str]) -> bytes:
    return "".join(TIER_LETTERS[t] for t in LOWER_TIERS if t in tiers).encode()


class Pins:
    """Leases on one tier's copies: a copy pinned by an in-flight read is not removed until
    the read finishes; a removal asked meanwhile runs at the last unpin."""

    def __init__(self) -> None:
        self._n: Counter[bytes] = Counter()
        self._deferred: dict[bytes, list[Callable[[], object]]] = {}
        self._tasks: set[asyncio.Task[object]] = set()

    def pinned(self, key: bytes) -> bool:
        return self._n[key] > 0

    @contextmanager
    def pin(self, key: bytes) -> Iterator[None]:
        self.hold(key)
        try:
            yield
        finally:
            self.drop(key)

    def hold(self, key: bytes) -> None:
        """Take a pin that outlives one read (a lookup-and-lock lease); :meth:`drop` ends it."""
        self._n[key] += 1

    def drop(self, key: bytes) -> None:
        """End one pin; at the last one, removals deferred meanwhile run."""
        if self._n[key] <= 0:
            del self._n[key]
            return
        self._n[key] -= 1
        if self._n[key] <= 0:
            del self._n[key]
            for fn in self._deferred.pop(key, []):
                r = fn()
                if asyncio.iscoroutine(r):
                    t = asyncio.ensure_future(r)
                    self._tasks.add(t)  # referenced until done (the loop keeps only weak refs)
                    t.add_done_callback(self._tasks.discard)

    def defer(self, key: bytes, fn: Callable[[], object]) -> bool:
        """Run ``fn`` now (returns False) or at the last unpin (returns True)."""
        if self._n[key] > 0:
            self._deferred.setdefault(key, []).append(fn)
            return True
        if key in self._n:
            del self._n[key]
        return False
