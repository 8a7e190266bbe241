"""The tierd request protocol: one op table (:data:`OPS`) for the server and its clients.

Workers (:class:`~.client.RemoteTierClient`) and the CLI push requests to the tenant's
request list in Valkey; ``tierd`` serves them with :class:`RequestServer`
(docs/tiering-promotion.md). For every op, the table says whether the sender waits for an
answer, which check (:mod:`.requests`) the server runs on the op's own fields before acting,
and what the server does with the checked request (a :class:`~.manager.TierManager` call).
An embedded client runs the same check and the same call in process.

Never imports: aiobotocore, valkey-py, the store, the integrations.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from ..errors import ServerError, TransportError
from . import protocol, requests
from .requests import Request

if TYPE_CHECKING:
    from .manager import TierManager

log = logging.getLogger(__name__)

SERVE_MAX = 256  # requests handled at once by a RequestServer (then BLPOP waits)
LPOP_BATCH = 128  # requests drained without blocking after a BLPOP (one round trip)


@dataclass(frozen=True)
class Op:
    name: str
    replies: bool  # the sender waits for {"id", "ok", "result"}
    check: requests.Check  # the op's own fields, checked by the server before anything acts
    run: Callable[["TierManager", Request], Awaitable[Any]]


async def _hint(m: "TierManager", req: Request) -> None:
    for k, n in req.puts:
        m.note_put(k, n)
    for k in req.hits:
        m.note_hit(k)
    m.note_miss(req.misses)
    for k, ms in req.leases:  # leases before releases: a batch never ends a lease it has not begun
        m.lease([k], ms / 1000)
    m.release(req.releases)


async def _promote(m: "TierManager", req: Request) -> bool:
    ttl = req.ttl_ms / 1000
    return await m.promote(req.key, timeout=ttl) if ttl > 0 else False


async def _stats(m: "TierManager", req: Request) -> dict[str, Any]:
    return m.stats()


async def _evict(m: "TierManager", req: Request) -> int:
    return await m.evict(req.tier, keys=req.keys, prefix=req.prefix)


async def _drain(m: "TierManager", req: Request) -> dict[str, Any]:
    return await m.drain(min(req.timeout_s, max(req.ttl_ms / 1000, 0.001)))


async def _delete(m: "TierManager", req: Request) -> int:
    return await m.delete(req.keys, timeout=max(req.ttl_ms / 1000, 0.001))


OPS: dict[str, Op] = {op.name: op for op in (
    Op("promote", True, requests.check_promote, _promote),
    Op("hint", False, requests.check_hint, _hint),
    Op("stats", True, requests.check_stats, _stats),
    Op("evict", True, requests.check_evict, _evict),
    Op("drain", True, requests.check_drain, _drain),
    Op("delete", True, requests.check_delete, _delete),
)}
CHECKS: dict[str, requests.Check] = {name: op.check for name, op in OPS.items()}


def parse(raw: Any, scope: requests.TenantScope) -> Request:
    """A request as the server takes it: bounded, typed, confined (BadRequest otherwise)."""
    return requests.parse_request(raw, scope, CHECKS)


async def run_in_process(manager: "TierManager", op: str, fields: dict[str, Any], ttl_ms: int) -> Any:
    """Run ``op`` on an in-process manager: the same check and the same call as tierd's."""
    scope = requests.TenantScope(manager.settings.key_prefix, manager.tenant)
    o = OPS.get(op)
    if o is None:
        raise ValueError(f"unknown op {op!r}: {'|'.join(OPS)}")
    return await o.run(manager, Request(op=op, ttl_ms=ttl_ms, **o.check(scope, fields, ttl_ms)))


class RequestServer:
    """tierd's side: consume the tenant's request list, act on checked requests, answer."""

    def __init__(self, manager: "TierManager", *, max_at_once: int = SERVE_MAX) -> None:
        self.m = manager
        self.valkey = manager.valkey
        self.timeout = manager.settings.op_timeout_s
        self.counters = manager.counters
        self._scope = requests.TenantScope(manager.settings.key_prefix, manager.tenant)
        self._bad_log = requests.RateLimitedLog(log, "tierd: bad request refused")
        self._sem = asyncio.Semaphore(max_at_once)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._transactions = True  # MULTI/EXEC allowed (replies), until Valkey says otherwise

    async def serve(self, stop: asyncio.Event | None = None) -> None:
        """Consume the request list until ``stop`` is set (docs/tiering-promotion.md)."""
        req = protocol.request_key(self.m.settings.key_prefix, self.m.tenant)
        block = self.m.ts.request_block_s
        try:
            while stop is None or not stop.is_set():
                try:
                    r = await self.valkey.command(b"BLPOP", req, block, key=req, timeout=block + self.timeout)
                except TransportError as e:
                    log.warning("tierd: request list unavailable (%s); retrying", e)
                    await asyncio.sleep(min(1.0, block))
                    continue
                if not r:
                    continue
                await self._serve_one(r[1])
                try:  # drain what is already queued without blocking (one round trip)
                    more = await self.valkey.command(b"LPOP", req, LPOP_BATCH, key=req, timeout=self.timeout)
                except TransportError:
                    more = None
                for m in more or ():
                    await self._serve_one(m)
        finally:
            for t in list(self._tasks):
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve_one(self, raw: bytes) -> None:
        """Handle a request in the background; at most ``max_at_once`` at once (the request
        list is not read meanwhile, so a burst waits in Valkey, not in tierd's memory)."""
        await self._sem.acquire()
        t = asyncio.ensure_future(self.handle(raw))
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        t.add_done_callback(lambda _t: self._sem.release())

    async def handle(self, raw: bytes) -> None:
        """Act on one request, checked first: a malformed one, or one naming anything
        outside this tenant, is counted, logged and answered with an error."""
        self.counters["requests"] += 1
        try:
            req = parse(raw, self._scope)
        except requests.BadRequest as e:
            self.counters["bad_requests"] += 1
            self._bad_log.note(e.reason)
            if e.reply is not None:
                await self._reply(e.reply, protocol.pack({"id": e.id, "ok": False, "result": f"bad request: {e.reason}"}))
            return
        op = OPS[req.op]
        ok, result = True, None
        try:
            result = await op.run(self.m, req)
        except Exception as e:  # noqa: BLE001 - the reply carries it
            ok, result = False, f"{type(e).__name__}: {e}"
        if op.replies and req.reply is not None:
            await self._reply(req.reply, protocol.pack({"id": req.id, "ok": ok, "result": result}))

    async def _reply(self, reply: bytes, payload: bytes) -> None:
        """RPUSH + PEXPIRE in one transaction (MULTI/EXEC), so a reply list never exists
        without its TTL (a connection lost between two commands would leak it). No script:
        tierd's ACL line grants no EVAL, whose scripts may run forever (docs/tiering-index.md).
        Where a transaction fails (refused, a slot moving), the two commands one after the other."""
        try:
            transaction = getattr(self.valkey, "transaction", None)
            if transaction is not None and self._transactions:
                try:
                    await transaction((b"RPUSH", reply, payload), (b"PEXPIRE", reply, protocol.REPLY_TTL_MS),
                                      key=reply, timeout=self.timeout)
                    return
                except ServerError as e:
                    log.warning("tierd: MULTI/EXEC refused (%s); replies use RPUSH then PEXPIRE", e)
                    self._transactions = False
                    if getattr(e, "commands_ran", False):
                        return  # MULTI alone was refused: RPUSH and PEXPIRE ran without it
            await self.valkey.command(b"RPUSH", reply, payload, key=reply, timeout=self.timeout)
            await self.valkey.command(b"PEXPIRE", reply, protocol.REPLY_TTL_MS, key=reply, timeout=self.timeout)
        except TransportError as e:
            log.debug("tierd: reply failed: %s", e)

__all__ = ["CHECKS", "OPS", "Op", "RequestServer", "SERVE_MAX", "parse", "run_in_process"]
