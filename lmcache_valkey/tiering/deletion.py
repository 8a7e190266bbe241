"""Deletion, expiry and evict: copies go from RAM, marker, ledger and every lower tier.

Delete, step by step (docs/tiering-tiers.md, "Delete, step by step"), each bounded by the
caller's deadline:

1. the key's generation changes (ledger): copies and promotions started under the old one
   are dropped, so a late put hint can never resurrect the chunk;
2. with a remote tier, a *delete intent* goes into the hash ``<prefix>:<tenant>:_tierd:del``
   before anything is removed (workers write it themselves before asking tierd); a restart
   never indexes a copy with a pending intent;
3. RAM value and marker: DEL; the generation changes again (a copy that read the value just
   before the DEL is dropped too);
4. every tier's copy is doomed in the ledger; a local tier removes it now, a remote tier's
   removal is sent within the deadline when the tier takes requests, else it stays pending
   and the background pass (:meth:`Deleter.retry`) resends it; the intent is cleared once
   every remote tier confirmed.

Expiry and evict use the same removal, so a dead or slow object store never holds up the
demotion loop.

Never imports: aiobotocore, valkey-py, the store, the integrations.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable, Sequence

from ..errors import TransportError
from . import protocol, requests
from .context import Wing
from .ledger import ABSENT, DOOMED, DURABLE
from .markers import TIER_LETTERS, marker_of
from .tiers import LowerTier, Removal

log = logging.getLogger(__name__)

RETRY_BATCH = 256  # pending removals resent per background pass
_CONCURRENT = 32  # removals and HEADs in flight at once


async def record_intents(valkey: Any, del_key: bytes, keys: Sequence[bytes], timeout: float) -> None:
    """Record delete intents (data key -> Unix ms) in the tenant's hash, before any copy is
    removed: a delete a remote tier cannot take yet survives a restart of tierd or the worker.
    Workers call it before asking tierd to delete; raises TransportError."""
    now = int(time.time() * 1000)
    args: list[Any] = [b"HSET", del_key]
    for k in keys:
        args += [k, now]
    await valkey.command(*args, key=del_key, timeout=max(0.001, timeout))


class Deleter:
    def __init__(self, wing: Wing, *, forget: Callable[[Sequence[bytes]], None]) -> None:
        self.w = wing
        self.ledger = wing.ledger
        self._forget = forget  # admission forgets deleted keys
        self._del_key = protocol.delete_key(wing.key_prefix, wing.tenant)
        self.scope = requests.TenantScope(wing.key_prefix, wing.tenant)  # whose intents we apply
        self.bad_log = requests.RateLimitedLog(log, "tierd: bad request refused")
        self._chores: asyncio.Task[Any] | None = None

    # --- delete intents (Valkey) ---------------------------------------------------------------
    async def load_intents(self, *, quiet: bool = False) -> set[bytes]:
        """Delete intents recorded in Valkey (by this manager before a restart, or by workers)."""
        w = self.w
        try:
            r = await w.valkey.command(b"HKEYS", self._del_key, key=self._del_key, timeout=w.timeout)
        except TransportError as e:
            (log.debug if quiet else log.warning)("tiering: delete intents unreadable (%s); retried in the background", e)
            return set()
        keys = {bytes(k) for k in r or ()}
        # Workers write this hash: an intent naming anything but this tenant's chunks is
        # never applied (tierd may run with a wider account), and is removed.
        foreign = {k for k in keys if not self.scope.owns(k)}
        if foreign:
            keys -= foreign
            w.counters["bad_requests"] += len(foreign)
            self.bad_log.note(f"{len(foreign)} delete intent(s) outside tenant {w.tenant!r} ignored")
            await self._clear_intents(foreign)
        return keys

    async def record_intents(self, keys: Sequence[bytes], timeout: float) -> bool:
        try:
            await record_intents(self.w.valkey, self._del_key, keys, timeout)
            return True
        except TransportError as e:
            log.warning("tiering: delete intent not recorded (%s); a restart before the object store "
                        "takes the delete may serve the chunk again", e)
            return False

    async def _clear_intents(self, keys: Sequence[bytes] | set[bytes]) -> bool:
        if not keys:
            return True
        try:
            await self.w.valkey.command(b"HDEL", self._del_key, *keys, key=self._del_key, timeout=self.w.timeout)
            return True
        except TransportError as e:
            log.debug("tiering: delete intents not cleared: %s", e)
            return False

    # --- delete --------------------------------------------------------------------------------
    async def delete(self, keys: Sequence[bytes], *, timeout: float | None = None) -> int:
        """Coordinated delete: RAM value, marker, ledger and every lower-tier copy, within
        ``timeout`` (default ``op_timeout_s``); queued or in-flight uploads are dropped or undone."""
        w = self.w
        keys = list(keys)
        deadline = time.monotonic() + (w.timeout if timeout is None else timeout)
        self.ledger.bump(keys)
        self._forget(keys)
        intent = bool(keys) and bool(w.remote_tiers) and await self.record_intents(keys, deadline - time.monotonic())
        err: TransportError | None = None
        n = 0
        try:
            left = max(0.001, deadline - time.monotonic())
            n, _ = await asyncio.gather(w.valkey.delete(keys, timeout=left),
                                        w.valkey.delete([marker_of(k) for k in keys], timeout=left))
        except TransportError as e:
            err = e
        # Again: a copy that read the generation while the DEL was in flight may have read
        # the value before it went; it now carries a stale generation and is dropped.
        self.ledger.bump(keys)
        await self.remove_copies(keys, always=True, intent=intent, wait_s=max(0.0, deadline - time.monotonic()))
        w.counters["deleted"] += len(keys)
        if err is not None:
            raise err
        return n

    async def remove_copies(self, keys: Sequence[bytes], tiers: Sequence[str] | None = None, *,
                            always: bool = False, intent: bool = False, wait_s: float | None = 0.0) -> int:
        """Remove ``keys``' copies from ``tiers`` (default: every tier). A local tier's go
        now; a remote tier's removal runs in the background (``wait_s``: how long to wait for
        it; None: until done). ``always``: also where the ledger knows of no copy (a delete:
        the listing may be incomplete). Returns copies removed."""
        w = self.w
        chosen = [t for t in w.tiers if tiers is None or t.name in tiers]
        removed = 0
        remote: list[tuple[bytes, LowerTier]] = []
        for k in keys:
            for t in chosen:
                before = self.ledger.state(k, t.name)
                if t.remote:
                    if before == ABSENT and not always:
                        continue
                    self.ledger.doom(k, t.name)
                    remote.append((k, t))
                else:
                    self.ledger.doom(k, t.name)  # and, with no await between, the tier's removal starts
                    gone = await t.remove(k)
                    self.ledger.removed(k, t.name)
                    before = DURABLE if gone is Removal.GONE else before
                removed += before == DURABLE
        if intent:
            self.ledger.record_intent({k for k, _ in remote})
        await w.markers.sync(list(keys))
        self._count_pending()
        if remote:
            tasks = [w.spawn(self.finish(k, t)) for k, t in remote]
            if wait_s is None or wait_s > 0:
                await asyncio.wait(tasks, timeout=wait_s)
        return removed

    async def finish(self, key: bytes, tier: LowerTier) -> bool:
        """Send one pending remote removal; True when the tier confirmed (the key's intent is
        cleared once no remote tier has one pending)."""
        if self.ledger.state(key, tier.name) != DOOMED:
            return True
        try:
            if await tier.remove(key) is Removal.PENDING:
                return False  # a read holds it: the tier removes it when the read ends; confirmed later
        except TransportError as e:
            log.debug("tiering: removal of %r from %s deferred: %s", key, tier.name, e)
            return False
        if self.ledger.state(key, tier.name) != DOOMED:
            return True  # confirmed meanwhile by another pass
        intent = self.ledger.intent(key)
        self.ledger.removed(key, tier.name)
        self._count_pending()
        if intent and not any(self.ledger.state(key, t.name) == DOOMED for t in self.w.remote_tiers):
            if not await self._clear_intents([key]):
                self.ledger.record_intent([key])
        return True

    def _count_pending(self) -> None:
        self.w.counters["s3_deletes_pending"] = sum(len(self.ledger.doomed(t.name)) for t in self.w.remote_tiers)

    async def retry(self) -> int:
        """Background pass: pick up delete intents recorded in Valkey (by workers, or before a
        restart), apply them, and resend pending remote removals while the tiers take
        requests. Returns removals confirmed."""
        w = self.w
        recorded = await self.load_intents(quiet=True)
        fresh = [k for k in recorded if not any(self.ledger.state(k, t.name) == DOOMED for t in w.remote_tiers)]
        if fresh:
            self.ledger.bump(fresh)
            self._forget(fresh)
            await self.remove_copies(fresh, always=True, intent=True, wait_s=0.0)
        if not w.remote_tiers:  # nothing remote: the local removal was all of it
            await self._clear_intents(recorded)
            return 0
        skip = set(fresh)
        todo = [(k, t) for t in w.remote_tiers for k in self.ledger.doomed(t.name) if k not in skip][:RETRY_BATCH]
        ok = 0
        for i in range(0, len(todo), _CONCURRENT):
            part = todo[i : i + _CONCURRENT]
            if not all(t.available() for _, t in part):
                break
            ok += sum(await asyncio.gather(*(self.finish(k, t) for k, t in part)))
        return ok

    def kick(self) -> None:
        """Run :meth:`retry` (then :meth:`learn_expiry`) in the background, one at a time: a
        slow remote tier never holds up the demotion loop."""
        if self._chores is None or self._chores.done():
            self._chores = self.w.spawn(self._run_chores())

    async def _run_chores(self) -> int:
        n = await self.retry()
        await self.learn_expiry()
        return n

    # --- expiry --------------------------------------------------------------------------------
    async def expire(self) -> int:
        """Remove expired copies from every tier (remote removals in the background)."""
        keys = self.ledger.expired_keys()
        if keys:
            await self.remove_copies(keys)
            self.w.counters["expired"] += len(keys)
        return len(keys)

    async def learn_expiry(self, limit: int = 256) -> int:
        """Ask the tiers for the expiry of up to ``limit`` copies their listing could not tell
        (a HEAD per object): the ledger and the marker take it (PXAT); expired ones are
        removed. Returns copies asked about."""
        gone: list[bytes] = []
        seen = 0
        asked: list[tuple[bytes, LowerTier]] = []
        for k in self.ledger.expiry_unknown(limit):
            t = next((t for t in self.w.remote_tiers if self.ledger.state(k, t.name) == DURABLE), None)
            if t is None:  # only copies that record their expiry are left
                self.ledger.set_expiry(k, 0)
            else:
                asked.append((k, t))
        now_ms = int(time.time() * 1000)
        for i in range(0, len(asked), _CONCURRENT):
            part = asked[i : i + _CONCURRENT]
            if not all(t.available() for _, t in part):
                break
            infos = await asyncio.gather(*(t.expiry_of(k) for k, t in part), return_exceptions=True)
            for (k, t), info in zip(part, infos):
                if isinstance(info, BaseException):
                    continue  # still unknown: the next pass asks again
                seen += 1
                if self.ledger.state(k, t.name) != DURABLE:
                    continue
                if info is None:
                    self.ledger.lost(k, t.name)
                    continue
                self.ledger.set_expiry(k, info.expires_ms or 0)
                if info.expires_ms and info.expires_ms <= now_ms:
                    gone.append(k)
        if gone:
            await self.remove_copies(gone)
            self.w.counters["expired"] += len(gone)
        return seen

    # --- evict ---------------------------------------------------------------------------------
    async def evict(self, tier: str, *, keys: Sequence[bytes] | None = None, prefix: bytes | None = None) -> int:
        """Remove copies from one tier only (``ram``, ``nvme`` or ``s3``), by keys or key prefix
        (e.g. ``<prefix>:<tenant>:<namespace digest>:c:``). Returns copies removed."""
        w = self.w
        if tier not in ("ram", *TIER_LETTERS):
            raise ValueError(f"unknown tier {tier!r}: ram, {', '.join(TIER_LETTERS)}")
        if keys is None:
            if prefix is None:
                raise ValueError("evict needs keys or a prefix")
            if tier == "ram":
                # The chunks tierd knows to be in RAM (its index) or holds below: never a
                # listing of the keyspace (docs/tiering-index.md).
                known = dict.fromkeys(await w.ram.members())
                known.update(dict.fromkeys(self.ledger.keys(prefix=prefix)))
                keys = [k for k in known if k.startswith(prefix) and b":c:{" in k]
            else:
                keys = self.ledger.keys(tier=tier, prefix=prefix)
        if tier == "ram":
            n = await w.valkey.delete(list(keys), timeout=w.timeout) if keys else 0
            await w.ram.remove(list(keys))
            w.counters["ram_evicted"] += n
            return n
        return await self.remove_copies(list(keys), (tier,), wait_s=w.timeout)


__all__ = ["Deleter", "record_intents"]
