"""Tier markers: the ledger's "some lower tier holds this chunk", mirrored into Valkey.

A worker's one-round-trip lookup asks ``EXISTS data marker`` per chunk (same Cluster slot:
``<ns>:c:{<id>}`` and ``<ns>:t:{<id>}``), so a chunk demoted out of RAM stays visible.
The marker's value names the tiers (``n`` NVMe, ``s`` object store), its ``PXAT`` the
chunk's expiry. :class:`Markers` writes them when the ledger's durable tiers change
(coalesced, in the background, or at once where a caller needs it), re-asserts them all
after a restart, re-creates the ones Valkey lost (eviction under ``allkeys-*``, a restart)
periodically and as soon as a lookup misses a chunk a tier holds (Valkey evicted its marker:
then every lost marker is restored), and removes markers no tier backs: those it finds in
its own index of the markers it wrote (:mod:`.key_index`), never by listing the keyspace.

Never imports: aiobotocore, valkey-py, the store or the integrations.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any, Callable, Sequence

from ..errors import TransportError
from ..keys import DATA, TIER_MARKER, parse_data_key
from . import protocol
from .key_index import KeyIndex
from .ledger import Ledger

log = logging.getLogger(__name__)

TIER_LETTERS = {"nvme": "n", "s3": "s"}
_BATCH = 256  # markers written concurrently
_EXISTS_BATCH = 1024  # markers checked per round trip
SWEEP_AFTER_MISS_S = 10.0  # at most one restore of every marker this often, triggered by misses


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


def marker_value(tiers: Sequence[str]) -> bytes:
    return "".join(TIER_LETTERS[t] for t in tiers).encode()


class Markers:
    def __init__(self, valkey: Any, ledger: Ledger, *, key_prefix: str, tenant: str, timeout: float,
                 spawn: Callable[[Any], asyncio.Task[Any]], counters: dict[str, int]) -> None:
        self.valkey = valkey
        self.ledger = ledger
        self.key_prefix, self.tenant = key_prefix, tenant
        self.timeout = timeout
        self._spawn = spawn
        self.counters = counters
        self._dirty: dict[bytes, None] = {}  # ordered set: markers to write in the background
        self._flusher: asyncio.Task[Any] | None = None
        self._sweeper: asyncio.Task[Any] | None = None
        self._swept_at = -SWEEP_AFTER_MISS_S
        self.closing = False
        # The markers written (members: data keys): added before a marker's SET, removed
        # after its DEL, so a marker exists only while its index entry does.
        self.index = KeyIndex(valkey, protocol.marker_index_key(key_prefix, tenant), timeout=timeout)

    # --- one marker --------------------------------------------------------------------------
    async def _sync_one(self, key: bytes) -> bool:
        """True when the marker stands (or may: a failed write), False once it was removed."""
        tiers = self.ledger.tiers_of(key)
        mk = marker_of(key)
        gen = self.ledger.gen(key)
        try:
            if tiers:
                r = self.ledger.get(key)
                args: list[Any] = [b"SET", mk, marker_value(tiers)]
                if r is not None and r.expires_ms:
                    args += [b"PXAT", r.expires_ms]
                await self.valkey.command(*args, key=mk, timeout=self.timeout)
                # A delete/expiry that ran while the SET was in flight may have sent its DEL
                # first: re-check, and take the marker back if the chunk is gone now.
                if not self.ledger.tiers_of(key) or not self.ledger.current(key, gen):
                    await self.valkey.delete([mk], timeout=self.timeout)
                    return False
                return True
            await self.valkey.delete([mk], timeout=self.timeout)
            return False
        except TransportError as e:
            log.debug("tiering: marker update for %r failed: %s", key, e)
            return True

    async def sync(self, keys: Sequence[bytes]) -> None:
        """Mirror the ledger into these keys' markers now."""
        for k in keys:
            self._dirty.pop(k, None)
        for i in range(0, len(keys), _BATCH):
            batch = keys[i : i + _BATCH]
            await self.index.add([k for k in batch if self.ledger.tiers_of(k)])
            stands = await asyncio.gather(*(self._sync_one(k) for k in batch))
            await self.index.remove([k for k, s in zip(batch, stands) if not s and not self.ledger.tiers_of(k)])

    def sync_soon(self, key: bytes) -> None:
        """Mirror it in the background (the ledger's ``on_change``); coalesced."""
        if self.closing:
            return
        self._dirty[key] = None
        if self._flusher is None or self._flusher.done():
            self._flusher = self._spawn(self._flush())

    async def _flush(self) -> None:
        while self._dirty:
            await self.sync(list(itertools.islice(self._dirty, _BATCH)))

    async def settle(self) -> None:
        """Wait until the markers queued by :meth:`sync_soon` are written."""
        while self._flusher is not None and not self._flusher.done():
            await asyncio.shield(self._flusher)

    # --- all of them -------------------------------------------------------------------------
    async def reconcile(self) -> int:
        """(Re)write the marker of every indexed chunk (after a restart, or a Valkey restart)."""
        keys = self.ledger.keys()
        await self.sync(keys)
        return len(keys)

    async def restore(self, keys: Sequence[bytes]) -> int:
        """Re-create the markers Valkey lost among ``keys`` (chunks a tier holds); returns how many."""
        restored = 0
        for i in range(0, len(keys), _EXISTS_BATCH):
            batch = keys[i : i + _EXISTS_BATCH]
            present = await self.valkey.exists_many([marker_of(k) for k in batch], timeout=self.timeout)
            missing = [k for k, p in zip(batch, present) if not p]
            await self.sync(missing)
            restored += len(missing)
        self.counters["markers_restored"] += restored
        return restored

    def missed(self, keys: Sequence[bytes]) -> None:
        """A lookup missed ``keys``. Those a tier holds lost their marker (Valkey evicted it
        under an ``allkeys-*`` policy): re-create them now, and, since an eviction rarely takes
        one marker, restore every lost one (at most every ``SWEEP_AFTER_MISS_S``)."""
        held = [k for k in keys if self.ledger.tiers_of(k)]
        if held and not self.closing:
            self._spawn(self._repair_missed(held))

    async def _repair_missed(self, keys: Sequence[bytes]) -> None:
        try:
            if not await self.restore(keys):
                return  # the markers were there (written since the lookup)
            now = asyncio.get_running_loop().time()
            if now - self._swept_at >= SWEEP_AFTER_MISS_S and (self._sweeper is None or self._sweeper.done()):
                self._swept_at = now
                self._sweeper = self._spawn(self.restore(self.ledger.keys()))
        except TransportError as e:
            log.debug("tiering: marker repair after a miss failed: %s", e)

    async def repair(self, *, complete: bool, copying: Callable[[bytes], bool]) -> int:
        """Re-create markers Valkey lost, and (``complete``: the ledger lists every tier's
        copies) remove markers of chunks no tier holds: a phantom prefix hit otherwise.
        ``copying(key)``: a copy-down is in flight (its marker is about to be right)."""
        restored = await self.restore(self.ledger.keys())
        if not complete:
            return restored  # the ledger is incomplete: a marker it lacks may be valid
        # The markers tierd wrote (its own index; never a listing of the keyspace) that no
        # tier backs now: removed, marker and entry.
        stray = [k for k in await self.index.members() if not self.ledger.tiers_of(k) and not copying(k)]
        for i in range(0, len(stray), _EXISTS_BATCH):
            batch = stray[i : i + _EXISTS_BATCH]
            self.counters["stale_markers_removed"] += await self.valkey.delete([marker_of(k) for k in batch],
                                                                               timeout=self.timeout)
        await self.index.remove([k for k in stray if not self.ledger.tiers_of(k)])
        await self.sync([k for k in stray if self.ledger.tiers_of(k)])  # indexed meanwhile: put it back
        return restored


__all__ = ["Markers", "TIER_LETTERS", "data_of", "marker_of", "marker_value", "split_data_key"]
