"""tierd's own indexes: which of the tenant's keys it has reason to look at, kept in one
sorted set of its own (inside the tenant's ACL pattern), so that tierd never lists the
keyspace (docs/tiering-index.md).

``SCAN`` would do, were it not that a user allowed ``SCAN`` sees every tenant's key names
(ACL key patterns do not filter its replies). So tierd remembers what it was told or did:

- ``<prefix>:<tenant>:_tierd:ram``: chunk values in RAM (put and hit hints of workers, the
  promotions tierd staged); the demotion pass and ``evict ram --prefix`` read it;
- ``<prefix>:<tenant>:_tierd:mk``: the tier markers tierd wrote; the marker repair reads it
  to remove markers no tier backs.

Members are data keys, scores the Unix ms tierd last heard of them (oldest first). An entry
may outlive its key (an expiry, an eviction, a worker's UNLINK): whoever reads the index
checks each key and removes the stale ones. The index lives in Valkey, so a restarted tierd
finds it as it was; read page by page (``ZRANGE`` by rank), never in one reply.

Never imports: aiobotocore, valkey-py, the store, the integrations.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Any, Callable, Sequence

from ..errors import TransportError

log = logging.getLogger(__name__)

__all__ = ["KeyIndex", "PAGE", "INDEX_MAX"]

PAGE = 1000  # members per ZADD/ZREM/ZRANGE
INDEX_MAX = 1 << 22  # members read at most in one pass (as SCAN_MAX_KEYS: more chunks than RAM holds)


class KeyIndex:
    def __init__(self, valkey: Any, key: bytes, *, timeout: float,
                 spawn: Callable[[Any], "asyncio.Task[Any]"] | None = None) -> None:
        self.valkey, self.key, self.timeout = valkey, key, timeout
        self._spawn = spawn
        self._pending: dict[bytes, None] = {}  # ordered set: members to add in the background
        self._flusher: asyncio.Task[Any] | None = None
        self.errors = 0

    async def add(self, members: Sequence[bytes]) -> None:
        """Add (or refresh) ``members`` now. A failure is logged and counted, not raised: the
        key is then unknown to tierd until it hears of it again."""
        now = int(time.time() * 1000)
        for i in range(0, len(members), PAGE):
            args: list[Any] = [b"ZADD", self.key]
            for m in members[i : i + PAGE]:
                args += [now, m]
            try:
                await self.valkey.command(*args, key=self.key, timeout=self.timeout)
            except TransportError as e:
                self.errors += 1
                log.debug("tiering: index %r not updated: %s", self.key, e)

    def add_soon(self, member: bytes) -> None:
        """Add it in the background, coalesced (one ZADD per batch of hints)."""
        self._pending[member] = None
        if self._spawn is not None and (self._flusher is None or self._flusher.done()):
            self._flusher = self._spawn(self._flush())

    async def _flush(self) -> None:
        await asyncio.sleep(0)  # let the rest of a batch of hints arrive
        while self._pending:
            batch = list(itertools.islice(self._pending, PAGE))
            for m in batch:
                self._pending.pop(m, None)
            await self.add(batch)

    async def settle(self) -> None:
        """Wait until what :meth:`add_soon` queued is written."""
        while self._flusher is not None and not self._flusher.done():
            await asyncio.shield(self._flusher)
        if self._pending:  # no spawner, or queued after the flusher ended
            await self._flush()

    async def remove(self, members: Sequence[bytes]) -> None:
        for i in range(0, len(members), PAGE):
            try:
                await self.valkey.command(b"ZREM", self.key, *members[i : i + PAGE], key=self.key,
                                          timeout=self.timeout)
            except TransportError as e:
                self.errors += 1
                log.debug("tiering: index %r not updated: %s", self.key, e)

    async def members(self) -> list[bytes]:
        """Every member, oldest first, page by page (a member added meanwhile may be missed
        until the next read). Raises TransportError."""
        await self.settle()
        out: dict[bytes, None] = {}
        start = 0
        while start < INDEX_MAX:
            page = await self.valkey.command(b"ZRANGE", self.key, start, start + PAGE - 1, key=self.key,
                                             timeout=self.timeout)
            if not isinstance(page, (list, tuple)):
                break
            out.update((m, None) for m in page if type(m) is bytes)
            if len(page) < PAGE:
                break
            start += PAGE
        return list(out)
