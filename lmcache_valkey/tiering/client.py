"""Tier clients: the worker side of tiering, behind the store's ``TierHints``.

The store calls (see ``lmcache_valkey.store.TierHints``)::

    ok = await tiers.promote(data_key, timeout=remaining)   # True: the chunk is in RAM now
    await tiers.note_put(data_key, nbytes)                  # after a successful put (cheap)
    await tiers.note_hit(data_key)                          # after a RAM hit (cheap)

and, for a coordinated delete across every tier, ``await tiers.delete(keys)``; for an
engine's lookup-and-lock, ``await tiers.lease(keys, ttl_s)`` / ``await tiers.release(keys)``.

Two placements, two classes:

- :class:`EmbeddedTierClient` calls an in-process :class:`~.manager.TierManager`;
- :class:`RemoteTierClient` talks to ``tierd`` through Valkey lists
  (docs/tiering-promotion.md), with the op table of :mod:`.service`: requests are RPUSHed to
  the tenant's request list; one listener task per worker BLPOPs the worker's reply list
  and resolves waiters; hints (puts, hits, lookup misses, leases, releases) are batched (one RPUSH per
  ~50 ms or 256 hints), bounded, and dropped (counted) when Valkey is unreachable.

Never imports: aiobotocore, the store, the integrations.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from typing import Any, Sequence

from ..config import Settings
from ..errors import TransportError
from . import protocol, requests, service
from .deletion import record_intents
from .manager import TierManager

log = logging.getLogger(__name__)

HINT_BATCH = 256
HINT_DELAY_S = 0.05
HINT_MAX = 16384


def new_worker_id() -> str:
    return uuid.uuid4().hex


def _client_stats() -> dict[str, int]:
    return {"promote_requests": 0, "promote_ok": 0, "promote_miss": 0, "hints_sent": 0, "hints_dropped": 0,
            "requests_trimmed": 0, "delete_failures": 0}


class EmbeddedTierClient:
    """The tier manager runs in this process (``tiering: embedded``)."""

    def __init__(self, manager: TierManager) -> None:
        self.manager = manager
        self.stats = _client_stats()

    async def promote(self, data_key: bytes, *, timeout: float) -> bool:
        """True once the chunk is back in Valkey RAM; False = miss (absent, corrupt, deadline)."""
        self.stats["promote_requests"] += 1
        ok = timeout > 0 and await self.manager.promote(data_key, timeout=timeout)
        self.stats["promote_ok" if ok else "promote_miss"] += 1
        return ok

    async def note_put(self, data_key: bytes, nbytes: int) -> None:
        self.manager.note_put(data_key, nbytes)

    async def note_hit(self, data_key: bytes) -> None:
        self.manager.note_hit(data_key)

    async def note_miss(self, data_keys: Sequence[bytes]) -> None:
        self.manager.note_miss(data_keys)

    async def lease(self, data_keys: Sequence[bytes], ttl_s: float) -> None:
        self.manager.lease(data_keys, ttl_s)

    async def release(self, data_keys: Sequence[bytes]) -> None:
        self.manager.release(data_keys)

    async def flush_hints(self) -> None:
        """Nothing is batched in process."""

    async def delete(self, data_keys: Sequence[bytes], *, timeout: float = 5.0) -> int:
        """Coordinated delete: RAM value, marker, and every lower-tier copy, within ``timeout``."""
        return await self.manager.delete(list(data_keys), timeout=timeout)

    async def control(self, op: str, args: dict[str, Any] | None = None, *, timeout: float = 10.0) -> Any:
        """Run a control op (stats, evict, drain) as tierd would: same check, same call."""
        return await service.run_in_process(self.manager, op, dict(args or {}), max(1, int(timeout * 1000)))

    async def close(self) -> None:
        """The manager is closed by whoever started it."""


class RemoteTierClient:
    """The tier manager is ``tierd`` next to Valkey (``tiering: service``)."""

    def __init__(self, valkey: Any, settings: Settings, *, tenant: str | None = None) -> None:
        self.valkey = valkey
        self.settings = settings
        self.tenant = tenant or settings.tenant
        self.key_prefix = settings.key_prefix
        self.worker_id = new_worker_id()
        self._req = protocol.request_key(self.key_prefix, self.tenant)
        self._rep = protocol.reply_key(self.key_prefix, self.tenant, self.worker_id)
        self._del_key = protocol.delete_key(self.key_prefix, self.tenant)
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._listener: asyncio.Task[None] | None = None
        self._puts: list[tuple[bytes, int]] = []
        self._hits: list[bytes] = []
        self._misses: list[bytes] = []
        self._leases: list[tuple[bytes, int]] = []
        self._releases: list[bytes] = []
        self._hint_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()  # hint sends in flight (referenced until done)
        self.stats = _client_stats()

    # --- the store's API -------------------------------------------------------------------
    async def promote(self, data_key: bytes, *, timeout: float) -> bool:
        """True once the chunk is back in Valkey RAM; False = miss (absent, corrupt, deadline)."""
        self.stats["promote_requests"] += 1
        ok = False
        if timeout > 0:
            try:
                ok = bool(await self._call("promote", {"key": data_key}, timeout))
            except (TransportError, asyncio.TimeoutError, RuntimeError):
                ok = False
        self.stats["promote_ok" if ok else "promote_miss"] += 1
        return ok

    async def note_put(self, data_key: bytes, nbytes: int) -> None:
        self._puts.append((data_key, int(nbytes)))
        self._hint_soon()

    async def note_hit(self, data_key: bytes) -> None:
        self._hits.append(data_key)
        self._hint_soon()

    async def note_miss(self, data_keys: Sequence[bytes]) -> None:
        """A lookup missed these (tierd re-creates the markers of those a tier holds)."""
        self._misses.extend(data_keys)
        self._hint_soon()

    async def lease(self, data_keys: Sequence[bytes], ttl_s: float) -> None:
        """Batched like hints: best effort, bounded by the lease's TTL."""
        ms = max(1, int(ttl_s * 1000))
        self._leases.extend((k, ms) for k in data_keys)
        self._hint_soon()

    async def release(self, data_keys: Sequence[bytes]) -> None:
        self._releases.extend(data_keys)
        self._hint_soon()

    async def flush_hints(self) -> None:
        """Send batched hints now."""
        await self._send_hints()

    async def delete(self, data_keys: Sequence[bytes], *, timeout: float = 5.0) -> int:
        """Coordinated delete: RAM value, marker, and every lower-tier copy, within ``timeout``.

        The delete intent is recorded in Valkey first (tierd applies it even if this request
        is lost or tierd is down now); returns 0 when tierd does not answer in time."""
        keys = list(data_keys)
        if not keys:
            return 0
        t0 = time.monotonic()
        try:
            await record_intents(self.valkey, self._del_key, keys, timeout)
            return int(await self._call("delete", {"keys": keys}, timeout - (time.monotonic() - t0)) or 0)
        except (TransportError, asyncio.TimeoutError, RuntimeError) as e:
            self.stats["delete_failures"] += 1
            log.warning("tier client: delete of %d chunk(s) not confirmed by tierd (%s)", len(keys), e)
            return 0

    # --- control (CLI) ---------------------------------------------------------------------
    async def control(self, op: str, args: dict[str, Any] | None = None, *, timeout: float = 10.0) -> Any:
        """Run a control op (stats, evict, drain) on tierd."""
        return await self._call(op, args or {}, timeout)

    async def close(self) -> None:
        await self._send_hints()
        for t in (self._listener, self._hint_task, *self._tasks):
            if t is not None:
                t.cancel()
                await asyncio.gather(t, return_exceptions=True)
        for f in self._waiting.values():
            if not f.done():
                f.cancel()
        self._waiting.clear()

    # --- requests and replies --------------------------------------------------------------
    async def _call(self, op: str, args: dict[str, Any], timeout: float) -> Any:
        if not service.OPS[op].replies:
            raise ValueError(f"{op!r} is not answered: send it as a hint")
        rid = next(self._ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[rid] = fut
        try:
            msg = {"op": op, "id": rid, "reply": self._rep, "ttl_ms": max(1, int(timeout * 1000)),
                   "sent_ms": int(time.time() * 1000), **args}
            t0 = time.monotonic()
            if timeout <= 0:
                raise asyncio.TimeoutError
            await self._push(protocol.pack(msg), timeout)
            if self._listener is None or self._listener.done():
                self._listener = asyncio.create_task(self._listen(), name="lmcv-tier-replies")
            left = timeout - (time.monotonic() - t0)
            if left <= 0:
                raise asyncio.TimeoutError
            ok, result = await asyncio.wait_for(fut, left)
            if not ok:
                raise RuntimeError(f"tierd: {op} failed: {result}")
            return result
        finally:
            self._waiting.pop(rid, None)

    async def _listen(self) -> None:
        """One BLPOP loop per worker process: resolve waiters by request id."""
        timeout = self.settings.op_timeout_s
        while self._waiting:
            try:
                r = await self.valkey.command(b"BLPOP", self._rep, 0.5, key=self._rep, timeout=0.5 + timeout)
            except TransportError as e:
                log.debug("tier client: reply list unavailable: %s", e)
                await asyncio.sleep(0.05)
                continue
            if not r:
                continue
            try:
                msg = protocol.unpack(r[1])
            except Exception:  # noqa: BLE001
                continue
            fut = self._waiting.get(msg.get("id"))
            if fut is not None and not fut.done():
                fut.set_result((bool(msg.get("ok")), msg.get("result")))

    def _pending_hints(self) -> int:
        return len(self._puts) + len(self._hits) + len(self._misses) + len(self._leases) + len(self._releases)

    def _hint_soon(self) -> None:
        # over the bound, misses and hits go first: a lost one costs a little, a lost lease more
        for pending in (self._misses, self._hits):
            over = min(self._pending_hints() - HINT_MAX, len(pending))
            if over > 0:
                self.stats["hints_dropped"] += over
                del pending[:over]
        if self._pending_hints() >= HINT_BATCH:
            t = asyncio.ensure_future(self._send_hints())
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)
        elif self._hint_task is None or self._hint_task.done():
            self._hint_task = asyncio.ensure_future(self._hint_later())

    async def _hint_later(self) -> None:
        await asyncio.sleep(HINT_DELAY_S)
        await self._send_hints()

    async def _send_hints(self) -> None:
        if not self._pending_hints():
            return
        lists = [self._puts, self._hits, self._misses, self._leases, self._releases]
        self._puts, self._hits, self._misses, self._leases, self._releases = [], [], [], [], []
        while any(lists):
            # at most MAX_KEYS hints per message: tierd refuses a longer one (requests.py)
            room, part = requests.MAX_KEYS, []
            for i, items in enumerate(lists):
                part.append(items[:room])
                lists[i] = items[room:]
                room -= len(part[-1])
            puts, hits, misses, leases, releases = part
            msg = {"op": "hint", "put": [[k, n] for k, n in puts], "hit": hits, "miss": misses,
                   "lease": [[k, ms] for k, ms in leases], "release": releases}
            n = sum(len(p) for p in part)
            try:
                await self._push(protocol.pack(msg), self.settings.op_timeout_s)
                self.stats["hints_sent"] += n
            except TransportError as e:
                self.stats["hints_dropped"] += n
                log.debug("tier client: hints dropped: %s", e)

    async def _push(self, payload: bytes, timeout: float) -> None:
        """RPUSH a request; while tierd is down the list is kept to ``protocol.REQUEST_MAX``
        (the oldest requests are trimmed: their waiters have long given up)."""
        n = await self.valkey.command(b"RPUSH", self._req, payload, key=self._req, timeout=timeout)
        cap = protocol.REQUEST_MAX
        if isinstance(n, int) and n > cap:
            try:
                await self.valkey.command(b"LTRIM", self._req, -cap, -1, key=self._req, timeout=timeout)
                self.stats["requests_trimmed"] += n - cap
            except TransportError as e:
                log.debug("tier client: request list not trimmed: %s", e)


__all__ = ["EmbeddedTierClient", "RemoteTierClient", "new_worker_id"]
