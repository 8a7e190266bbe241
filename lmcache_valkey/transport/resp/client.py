"""RespClient: the RESP transport the store uses (standalone Valkey or Valkey Cluster).

Every operation takes a deadline (``timeout``, seconds) covering the whole call
or batch, including connecting, waiting for a free connection and following
cluster redirections. Past it a single operation raises
:class:`~lmcache_valkey.errors.DeadlineExceeded`; a batch returns
``DeadlineExceeded`` in the slots that did not finish. Batch results carry
per-item errors as values (``TransportError`` instances), so one bad key does
not fail the others. Buffer ownership: see :mod:`.connection`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from itertools import compress
from operator import itemgetter
from typing import Any, AsyncIterator, Sequence

from ...timeouts import timeout as deadline
from ...codec import HEADER_SIZE, PayloadSink
from ...config import Node, Settings
from ...errors import (
    AuthError,
    ConnectionLost,
    DeadlineExceeded,
    Loading,
    NotReplicated,
    ProtocolError,
    ReadOnly,
    Redirect,
    ServerError,
    TransportError,
    TryAgain,
)
from ..scan import scan_walk
from .blocking import BlockingLookups
from .cluster import SlotMap, cluster_enabled, key_slot, parse_cluster_slots, parse_redirect
from .connection import SMALL_JOIN, make_ssl_context
from .parser import FlagRun, SimpleString, as_byte_view, describe, encode_command
from .pool import PENDING, NodePool, Op, run_ops
from .prefix import MIN_KEYS as PREFIX_MIN_KEYS
from .prefix import block_counts_request, leading, settle, with_block

__all__ = ["RespClient"]

log = logging.getLogger(__name__)

MAX_REDIRECTS = 5
TRYAGAIN_SLEEP_S = 0.02
SLOT_CACHE_MAX = 200_000
# Most nodes a client keeps a pool for; a redirection to yet another one is refused
# (a real cluster has at most ~1000 nodes; a lying one could name a new port per reply).
MAX_NODES = 1024
# Bound of a control command's reply (INFO, CLUSTER SLOTS, SCAN, the tiering manager's
# GET of a whole chunk): one chunk and its header, plus room for the rest.
CONTROL_SLACK = 1 << 20


def _set_op(index: int, key: bytes, parts: Sequence[bytes | memoryview], ttl_s: float | None,
            verb: bytes = b"SET") -> Op:
    data, size = _set_parts(key, parts, ttl_s, verb)
    return Op(index, data, None, key, size)


def _get_op(index: int, key: bytes, bufs: Sequence[Any], verb: bytes = b"GET") -> Op:
    sink = _sink(bufs)
    return Op(index, (b"*2\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(verb), verb, len(key), key),), sink, key,
              sum(len(b) for b in sink))


def _set_parts(key: bytes, parts: Sequence[bytes | memoryview], ttl_s: float | None,
               verb: bytes = b"SET") -> tuple[list[Any], int]:
    views = [p if isinstance(p, bytes) else as_byte_view(p) for p in parts]
    total = sum(len(v) for v in views)
    if ttl_s:
        ms = b"%d" % max(1, int(ttl_s * 1000))
        trailer = b"\r\n$2\r\nPX\r\n$%d\r\n%s\r\n" % (len(ms), ms)
        n = 5
    else:
        trailer = b"\r\n"
        n = 3
    header = b"*%d\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n$%d\r\n" % (n, len(verb), verb, len(key), key, total)
    if total < SMALL_JOIN:
        return [b"".join([header, *views, trailer])], total
    # Small leading parts (the store's 512-byte chunk header) are copied into the RESP header:
    # the connection joins only its own bytes, so a part left as a view would be a write of
    # its own. The payload's parts go out in place.
    lead = 0
    size = len(header)
    while lead < len(views) and size + len(views[lead]) <= SMALL_JOIN:
        size += len(views[lead])
        lead += 1
    if lead:
        header = b"".join([header, *views[:lead]])
    return [header, *(v for v in views[lead:] if len(v)), trailer], total


def _sink(bufs: Any) -> list[memoryview]:
    if isinstance(bufs, (memoryview, bytearray)):  # one buffer given bare
        return [as_byte_view(bufs, writable=True)]
    if isinstance(bufs, PayloadSink):  # keep the caller's object: the parser fills in its crc
        bufs[:] = [as_byte_view(b, writable=True) for b in bufs]
        return bufs
    return [as_byte_view(b, writable=True) for b in bufs]


def _exists_pipeline(keys: Sequence[bytes]) -> bytes:
    """``EXISTS key`` for each key, back to back. Keys of one namespace have one length:
    then the commands are one join around a shared prefix, not a format per key."""
    lengths = set(map(len, keys))
    if len(lengths) == 1:
        head = b"*2\r\n$6\r\nEXISTS\r\n$%d\r\n" % lengths.pop()
        return b"".join((head, (b"\r\n" + head).join(keys), b"\r\n"))
    return b"".join([b"*2\r\n$6\r\nEXISTS\r\n$%d\r\n%s\r\n" % (len(k), k) for k in keys])


def _lane_requests(plan: "_LookupPlan") -> list[tuple[Node, bytes, int]]:
    """One EXISTS pipeline per node of ``plan``, for the blocking lane."""
    return [(node, _exists_pipeline(ks), len(ks)) for node, _, ks in plan.parts]


def _passing(err: ServerError) -> bool:
    """An error reply that says "not now" (a failover, a load, a busy script), not "never"."""
    return isinstance(err, (Loading, ReadOnly, TryAgain)) or err.prefix in ("BUSY", "MASTERDOWN", "CLUSTERDOWN")


def _lane_found(plan: "_LookupPlan", runs: Any) -> list[bool] | None:
    """The lane's answer, or None where anything but plain 0/1 came back (the loop's path decides)."""
    return None if runs is None or plan.odd(runs) else list(map(bool, plan.found(runs)))


REFRESH_MIN_INTERVAL_S = 1.0


async def _detect_cluster(conn: Any, node: Node, bound: int) -> bool:
    """``INFO cluster``; where the ACL refuses INFO (the recommended worker line does,
    docs/security.md), ``CLUSTER SLOTS``: a cluster's workers are granted it, a standalone
    server answers it with an error, and a standalone worker's line does not grant it."""
    try:
        return cluster_enabled(await conn.call("INFO", "cluster", bound=bound))
    except ServerError as e:
        if isinstance(e, AuthError) and e.prefix != "NOPERM":
            raise
        first = e
    try:
        await conn.call("CLUSTER", "SLOTS", bound=bound)
        return True
    except ServerError as e:
        if isinstance(e, AuthError) and e.prefix != "NOPERM":
            raise
        log.debug("%s: INFO refused (%s), CLUSTER SLOTS refused (%s): standalone", node.name, first, e)
        return False


# A lookup touching at most this many nodes picks each node's keys with one C-level pass per
# node; touching more, with one sort.
_MASK_PASSES_MAX = 8


@functools.lru_cache(maxsize=256)
def _node_mask(j: int) -> bytes:
    """A ``bytes.translate`` table: byte ``j`` becomes 1, every other byte 0."""
    return bytes(int(b == j) for b in range(256))


class _LookupPlan:
    """A lookup's keys per node, and how the nodes' answers go back into the lookup's order.

    ``parts``: ``(node, j, keys)`` per node asked, ``j`` its place among the primaries;
    ``owner[i]``: the ``j`` of key i's node (``None`` on a standalone server: one part)."""

    __slots__ = ("parts", "owner")

    def __init__(self, parts: list[tuple[Node, int, Sequence[bytes]]], owner: list[int] | None) -> None:
        self.parts = parts
        self.owner = owner

    def found(self, runs: Sequence[FlagRun]) -> bytes | bytearray:
        """One flag per key, in the lookup's order: each node's flags taken in turn as its
        keys come up (C-level iteration, not a Python step per key)."""
        if self.owner is None:
            return runs[0].flags
        n = len(self.owner)
        if all(run.flags.count(0) == 0 for run in runs):  # the usual answers: all there, none there
            return b"\x01" * n
        if all(run.flags.count(1) == 0 for run in runs):
            return bytes(n)
        flags: list[Any] = [None] * (max(j for _, j, _ in self.parts) + 1)
        for (_, j, _), run in zip(self.parts, runs):
            flags[j] = iter(run.flags)
        out = bytes(map(next, map(flags.__getitem__, self.owner)))
        if len(out) != len(self.owner):  # (a node answered fewer flags than it was asked for)
            raise ProtocolError("a node's EXISTS replies ran short")
        return out

    def odd(self, runs: Sequence[FlagRun]) -> dict[int, Any]:
        """The replies that were not a plain 0 or 1, by the lookup's key position (rare:
        redirections and errors)."""
        if self.owner is None:
            return runs[0].odd
        out: dict[int, Any] = {}
        for (_, j, _), run in zip(self.parts, runs):
            if run.odd:
                positions = [i for i, o in enumerate(self.owner) if o == j]
                out.update((positions[k], v) for k, v in run.odd.items())
        return out


class RespClient:
    # The commands values move with: Valkey strings. A subclass may store values as another
    # type with the same shapes (transport/blob_tcp.py: valkey-large-object's TCP commands).
    GET_VERB = b"GET"
    SET_VERB = b"SET"
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._ssl = make_ssl_context(settings.tls) if settings.tls is not None else None
        self._pools: dict[Node, NodePool] = {}
        self._retiring: list[NodePool] = []  # pools of departed nodes, until drained (see _prune)
        self._cluster = False
        self._map = SlotMap()
        self._last_refresh = -REFRESH_MIN_INTERVAL_S
        self._primary: Node = settings.nodes[0]
        self._refresh_task: asyncio.Task[None] | None = None
        self._slot_cache: dict[bytes, int] = {}  # key -> slot; lookups re-ask the same keys
        self._control_bound = settings.max_chunk_bytes + HEADER_SIZE + CONTROL_SLACK
        self._blocking = BlockingLookups(settings, self._ssl, address_of=self._resolved)
        self._blocks_refused = False  # (see _block_step)
        self._started = False
        self._closed = False
        self.retried = 0  # ops sent again after an unanswered ConnectionLost (see _run)

    # --- lifecycle -------------------------------------------------------------

    @property
    def is_cluster(self) -> bool:
        return self._cluster

    def _resolved(self, node: Node) -> tuple[int, Any] | None:
        """Where the loop's pool last reached ``node`` (any thread: one dict read)."""
        p = self._pools.get(node)
        return None if p is None else p.address

    def _pool(self, node: Node) -> NodePool:
        p = self._pools.get(node)
        if p is None:
            if self._closed:
                raise ConnectionLost("client is closed")
            p = self._pools[node] = NodePool(node, self.settings, self._ssl)
        return p

    async def start(self) -> None:
        """Connect to the first reachable seed, detect cluster mode, open the pools."""
        if self._started:
            return
        s = self.settings
        errors: list[str] = []
        for node in s.nodes:
            pool = self._pool(node)
            try:
                conn = await pool.acquire()
            except AuthError:
                raise
            except TransportError as e:
                errors.append(str(e))
                continue
            try:
                async with deadline(s.connect_timeout_s):
                    if s.cluster == "yes":
                        self._cluster = True
                    elif s.cluster == "auto" and not node.path:
                        self._cluster = await _detect_cluster(conn, node, self._control_bound)
                    if self._cluster:
                        reply = await conn.call("CLUSTER", "SLOTS", bound=self._control_bound)
                        self._map.load(parse_cluster_slots(reply, node.host))
                        if not self._map.primaries:
                            raise ServerError(f"cluster at {node.name} has no slots assigned")
            except TimeoutError:
                raise DeadlineExceeded(f"{node.name} did not answer within {s.connect_timeout_s:g}s") from None
            finally:
                pool.release(conn)
            self._primary = node
            break
        else:
            raise ConnectionLost("cannot reach any Valkey node: " + "; ".join(errors))
        primaries = self._map.primaries if self._cluster else [self._primary]
        results = await asyncio.gather(*(self._pool(n).fill() for n in primaries), return_exceptions=True)
        for n, r in zip(primaries, results):
            if isinstance(r, AuthError):
                raise r
            if isinstance(r, BaseException):
                log.warning("could not open all connections to %s: %s", n.name, r)
        self._started = True

    async def close(self) -> None:
        """Drop every connection now; in-flight operations fail with ConnectionLost. Idempotent."""
        self._closed = True
        self._blocking.close()
        t, self._refresh_task = self._refresh_task, None
        if t is not None and not t.done():
            t.cancel()
        pools, self._pools = [*self._pools.values(), *self._retiring], {}
        self._retiring = []
        for p in pools:
            await p.close()

    # --- routing -----------------------------------------------------------------

    def _route(self, key: bytes | None) -> Node:
        if not self._cluster:
            return self._primary
        if key is None:
            return self._map.primaries[0] if self._map.primaries else self._primary
        cache = self._slot_cache
        slot = cache.get(key)
        if slot is None:
            if len(cache) >= SLOT_CACHE_MAX:
                cache.clear()
            slot = cache[key] = key_slot(key)
        return self._map.node_for(slot) or (self._map.primaries or [self._primary])[0]

    def _lookup_plan(self, keys: Sequence[bytes]) -> "_LookupPlan":
        """Which node is asked which of ``keys``: the primary that owns each one's slot (what
        :meth:`_route` says key by key, for a whole lookup at C speed)."""
        if not self._cluster:
            return _LookupPlan([(self._primary, 0, keys)], None)
        cache = self._slot_cache
        slots = list(map(cache.get, keys))
        if None in slots:
            if len(cache) + len(keys) > SLOT_CACHE_MAX:
                cache.clear()
            for i, s in enumerate(slots):
                if s is None:
                    slots[i] = cache[keys[i]] = key_slot(keys[i])
        primaries = self._map.primaries
        if not primaries:
            return _LookupPlan([(self._primary, 0, keys)], None)
        owner = list(map(self._map.index.__getitem__, slots))  # unclaimed slots: the first primary
        parts = []
        if len(primaries) <= 255:
            # owner as bytes: which nodes are asked, and each one's keys, by C-level passes
            by_byte = bytes(owner)
            asked = sorted(set(by_byte))
            if len(asked) <= _MASK_PASSES_MAX:
                for j in asked:
                    parts.append((primaries[j], j, list(compress(keys, by_byte.translate(_node_mask(j))))))
                return _LookupPlan(parts, owner)
        in_order = itemgetter(*sorted(range(len(keys)), key=owner.__getitem__))(keys) if len(keys) > 1 else keys
        at = 0
        for j, node in enumerate(primaries):
            n = owner.count(j)
            if n:
                parts.append((node, j, in_order[at:at + n]))
                at += n
        return _LookupPlan(parts, owner)

    def _schedule_refresh(self) -> None:
        if self._closed or (self._refresh_task is not None and not self._refresh_task.done()):
            return
        # At most one refresh per interval: while a primary is down and not yet failed over,
        # every failing batch asks for one; a fleet of workers must not storm the cluster.
        now = time.monotonic()
        if now - self._last_refresh < REFRESH_MIN_INTERVAL_S:
            return
        self._last_refresh = now
        self._refresh_task = asyncio.get_running_loop().create_task(self._refresh())

    async def _refresh(self) -> None:
        """Reload the slot map from the first primary (or seed) that answers."""
        candidates = list(dict.fromkeys([*self._map.primaries, *self.settings.nodes]))
        for node in candidates:
            try:
                reply = await self._node_call(node, ("CLUSTER", "SLOTS"), self.settings.op_timeout_s)
                ranges = parse_cluster_slots(reply, node.host)
            except ProtocolError as e:  # a malformed reply is that node's problem
                log.warning("topology refresh via %s: unreadable CLUSTER SLOTS reply: %s", node.name, e)
                continue
            except TransportError as e:
                log.debug("topology refresh via %s failed: %s", node.name, e)
                continue
            if ranges:
                self._map.load(ranges)
                self._prune()
                return

    def _prune(self) -> None:
        """Let go of the nodes the slot map no longer names (seeds excepted): a node replaced
        in a rolling restart or a failover comes back under a new address, and the old one's
        pool and lookup sockets would otherwise stay open for the client's lifetime, and
        count against MAX_NODES until redirections to new nodes were refused."""
        keep = {*self._map.primaries, *self.settings.nodes}
        for p in self._retiring:
            p.retire()  # (again: closes what a waiter that gave up left idle)
        self._retiring = [p for p in self._retiring if not p.drained]
        for node in [n for n in self._pools if n not in keep]:
            log.info("node %s left the cluster's slot map: its connections are closed", node.name)
            pool = self._pools.pop(node)
            pool.retire()
            if not pool.drained:
                self._retiring.append(pool)  # (client.close() still aborts what runs there)
        self._blocking.retire_all_but(keep)

    async def refresh_topology(self) -> None:
        """Reload the slot map now (cluster only)."""
        if self._cluster:
            await self._refresh()

    # --- the batch engine -----------------------------------------------------------

    async def _run(self, ops: list[Op], *, large: bool, timeout: float, idempotent: bool = False) -> list[Any]:
        """Route, run, follow MOVED/ASK; results hold values or exception objects.

        ``idempotent``: ops whose connection the server closed before answering anything of
        their round trip (``ConnectionLost.unanswered``: typically an idle connection dropped
        at that moment by the server's ``timeout``, a proxy or a NAT) are sent once more, on
        another connection, within the same deadline.
        """
        if self._closed:
            err = ConnectionLost("client is closed")
            return [err] * len(ops)
        results: list[Any] = [PENDING] * len(ops)
        try:
            async with deadline(timeout):
                await self._run_routed(ops, results, large)
                if idempotent:
                    again = [op for op in ops if type(r := results[op.index]) is ConnectionLost and r.unanswered]
                    if again:
                        self.retried += len(again)
                        for op in again:
                            results[op.index] = PENDING
                            op.asking = False
                            if self._cluster and op.key is not None:
                                op.node = None  # the node may have failed over: route afresh
                        await self._run_routed(again, results, large)
        except TimeoutError:
            pass
        for i, r in enumerate(results):
            if r is PENDING:
                results[i] = DeadlineExceeded(f"deadline of {timeout:g}s passed")
        return results

    async def _run_routed(self, ops: list[Op], results: list[Any], large: bool) -> None:
        """One try of ``ops``, following MOVED/ASK/TRYAGAIN up to MAX_REDIRECTS times."""
        todo = ops
        for attempt in range(MAX_REDIRECTS + 1):
            groups: dict[Node, list[Op]] = {}
            for op in todo:
                if op.node is None:
                    op.node = self._route(op.key)
                groups.setdefault(op.node, []).append(op)
            try:
                await run_ops(groups, self._pool, results, large=large)
            except TransportError as e:  # the client was closed under us
                for i, r in enumerate(results):
                    if r is PENDING:
                        results[i] = e
                break
            if not self._cluster:
                break
            redo: list[Op] = []
            moved = tryagain = False
            for op in todo:
                r = results[op.index]
                if not isinstance(r, TransportError):
                    op.asking = False
                    continue
                if isinstance(r, ConnectionLost):
                    moved = True  # a node may have failed over
                    continue
                red = parse_redirect(r)
                if red is not None and attempt < MAX_REDIRECTS:
                    kind, slot, node = red
                    if not node.host and op.node is not None:  # "MOVED 12 :6380": same host
                        node = Node(op.node.host, node.port)
                    if node not in self._pools and len(self._pools) >= MAX_NODES:
                        results[op.index] = ProtocolError(
                            f"redirected to {node.name}, past {MAX_NODES} known nodes")
                        continue
                    op.node, op.asking = node, kind == "ASK"
                    if kind == "MOVED":
                        self._map.set(slot, node)
                        moved = True
                    results[op.index] = PENDING
                    redo.append(op)
                elif isinstance(r, TryAgain) and attempt < MAX_REDIRECTS:
                    op.asking = False
                    op.node = None
                    results[op.index] = PENDING
                    redo.append(op)
                    tryagain = True
            if moved:
                self._schedule_refresh()
            if not redo:
                break
            if tryagain:
                await asyncio.sleep(TRYAGAIN_SLEEP_S)
            todo = redo

    async def _node_call(self, node: Node, args: Sequence[Any], timeout: float) -> Any:
        op = Op(0, (encode_command(args),), None, bound=self._control_bound)
        op.node = node
        (r,) = await self._run([op], large=False, timeout=timeout)
        if isinstance(r, BaseException):
            raise r
        return r

    # --- data path ---------------------------------------------------------------

    async def get_into(self, key: bytes, bufs: Sequence[memoryview], *, timeout: float) -> int | None:
        """GET ``key`` into ``bufs`` (in order); returns the value's true length, or None if absent.

        Bytes beyond the buffers' total capacity are dropped; a shorter value
        fills only the start. Raises TransportError (incl. DeadlineExceeded).
        """
        (r,) = await self._run([_get_op(0, key, bufs, self.GET_VERB)], large=True, timeout=timeout, idempotent=True)
        return self._get_result(r, raise_=True)

    @staticmethod
    def _get_result(r: Any, raise_: bool = False) -> Any:
        # With a sink the parser only lets a bulk (its length), nil or an error through.
        if r is None or (type(r) is int and r >= 0):
            return r
        if not isinstance(r, BaseException):
            r = ProtocolError(f"unexpected GET reply: {describe(r)}")
        if raise_:
            raise r
        return r

    async def get_many_into(
        self, items: Sequence[tuple[bytes, Sequence[memoryview]]], *, timeout: float
    ) -> list[int | None | TransportError]:
        ops = [_get_op(i, k, bufs, self.GET_VERB) for i, (k, bufs) in enumerate(items)]
        return [self._get_result(r) for r in await self._run(ops, large=True, timeout=timeout, idempotent=True)]

    # The store's transport contract (store.ChunkTransport): the client reads replies into
    # the caller's buffers itself, so a buffer is free once a call returned or raised, and
    # there is nothing to register.
    supports_release_callbacks = False

    def register(self, addr: int, length: int) -> bool:
        return False

    async def getrange_into(self, key: bytes, start: int, buf: memoryview, *, timeout: float) -> int | None:
        """GETRANGE into ``buf`` (for reading a header); bytes read, None if the key is absent or shorter than ``start``."""
        mv = as_byte_view(buf, writable=True)
        if not len(mv):
            return None
        args = (b"GETRANGE", key, start, start + len(mv) - 1)
        (r,) = await self._run([Op(0, (encode_command(args),), [mv], key)], large=False, timeout=timeout,
                               idempotent=True)
        n = self._get_result(r, raise_=True)
        return n or None

    def _set_ops(self, items: Sequence[tuple[bytes, Sequence[bytes | memoryview]]], ttl_s: float | None,
                 timeout: float) -> list[Op]:
        ops = [_set_op(i, k, parts, ttl_s, self.SET_VERB) for i, (k, parts) in enumerate(items)]
        wanted = self.settings.put_replicas
        if wanted:
            # WAIT counts the replicas that have this connection's writes so far: sent right
            # after each SET on its connection, it answers for that SET (and the ones before).
            # Its own timeout ends inside the put's deadline, so the count comes back before
            # the client gives up on the connection. (WAIT 0 would wait for ever.)
            wait_ms = max(1, int(timeout * 900))
            follow = encode_command((b"WAIT", wanted, wait_ms))
            for op in ops:
                op.follow = follow
        return ops

    def _set_result(self, r: Any) -> TransportError | None:
        if isinstance(r, TransportError):
            return r
        if type(r) is SimpleString and r == b"OK":  # a status, not a bulk "OK"
            return None
        if type(r) is int and self.settings.put_replicas:  # WAIT's count, after an OK
            return None if r >= self.settings.put_replicas else NotReplicated(self.settings.put_replicas, r)
        return ProtocolError(f"unexpected SET reply: {describe(r)}")

    async def set(
        self, key: bytes, parts: Sequence[bytes | memoryview], *, ttl_s: float | None, timeout: float
    ) -> None:
        """SET ``key`` to the concatenation of ``parts`` (sent as separate buffers, never joined)."""
        (r,) = await self._run(self._set_ops([(key, parts)], ttl_s, timeout), large=True, timeout=timeout,
                               idempotent=True)
        err = self._set_result(r)
        if err is not None:
            raise err

    async def set_many(
        self, items: Sequence[tuple[bytes, Sequence[bytes | memoryview]]], *, ttl_s: float | None, timeout: float
    ) -> list[TransportError | None]:
        ops = self._set_ops(items, ttl_s, timeout)
        return [self._set_result(r) for r in await self._run(ops, large=True, timeout=timeout, idempotent=True)]

    async def exists_many(self, keys: Sequence[bytes], *, timeout: float, prefix: bool = False) -> list[bool]:
        """Which keys exist: pipelined EXISTS, one write and one round trip per node.

        Raises the first error if any key could not be checked (DeadlineExceeded
        past the deadline). Keys that answer MOVED/ASK are re-asked at their new node.
        The replies come back as one :class:`~.parser.FlagRun` per node: a lookup of many
        keys costs a few byte-string operations, not a Python call per key.

        ``prefix``: only the leading run of present keys must be right (every key after the
        first absent one may read absent); on a standalone server that is asked by counts
        of blocks of keys (:mod:`.prefix`).
        """
        if not keys:
            return []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if prefix and self._by_blocks(keys):
            data, sizes = block_counts_request(keys)
            op = Op(0, (data,), None)
            op.node, op.nreplies = self._primary, len(sizes)
            (run,) = await self._run([op], large=False, timeout=timeout, idempotent=True)
            if isinstance(run, BaseException):
                raise run
            step = self._block_step(run, sizes)
            if step is not None:
                a, b = step
                if a == b:
                    return leading(a, len(keys))
                part = await self.exists_many(keys[a:b], timeout=max(0.0, deadline - loop.time()))
                return with_block(a, part, len(keys))
            timeout = max(0.0, deadline - loop.time())  # (per key in what is left)
        plan = self._lookup_plan(keys)
        ops = []
        for k, (node, _, ks) in enumerate(plan.parts):
            op = Op(k, (_exists_pipeline(ks),), None)
            op.node, op.nreplies, op.flags = node, len(ks), True
            ops.append(op)
        runs = await self._run(ops, large=False, timeout=timeout, idempotent=True)
        for run in runs:
            if isinstance(run, BaseException):
                raise run
            if type(run) is not FlagRun:
                raise ProtocolError(f"unexpected EXISTS replies: {describe(run)}")
        found = plan.found(runs)
        odd = plan.odd(runs)
        if odd:
            found = bytearray(found)
            redirected = [i for i, v in odd.items() if isinstance(v, (Redirect, TryAgain))]
            if redirected:  # slots moved under us: per key, following redirections
                ops = [Op(j, (encode_command((b"EXISTS", keys[i])),), None, keys[i]) for j, i in enumerate(redirected)]
                left = max(0.0, deadline - loop.time())
                for i, v in zip(redirected, await self._run(ops, large=False, timeout=left, idempotent=True)):
                    odd[i] = v
            for v in odd.values():
                if isinstance(v, BaseException):
                    raise v
                if type(v) is not int or not 0 <= v <= 1:  # EXISTS of one key: 0 or 1, nothing else
                    raise ProtocolError(f"unexpected EXISTS reply: {describe(v)}")
            for i, v in odd.items():
                found[i] = v
        return list(map(bool, found))

    def exists_many_blocking(self, keys: Sequence[bytes], *, timeout: float,
                             prefix: bool = False) -> list[bool] | None:
        """:meth:`exists_many` on the calling thread, which blocks (never an event loop's):
        no hop to the I/O loop and back (blocking.py says why). ``None`` when this lookup
        needs the loop after all: not started or closed, every blocking connection in use,
        a topology changing under us, or any reply that is not a plain 0 or 1 (a
        redirection, an error reply): the loop's path follows or raises those."""
        if not keys:
            return []
        plan = self._lane_plan(keys)
        if plan is None:
            return None
        if prefix and self._by_blocks(keys):
            ends = time.monotonic() + timeout
            data, sizes = block_counts_request(keys)
            runs = self._blocking.exists([(self._primary, data, len(sizes))], timeout, flags=False)
            got = self._lane_counted(keys, runs, sizes)
            if not isinstance(got, tuple):
                return got
            a, b = got
            part = self.exists_many_blocking(keys[a:b], timeout=max(0.0, ends - time.monotonic()))
            return None if part is None else with_block(a, part, len(keys))
        return _lane_found(plan, self._blocking.exists(_lane_requests(plan), timeout))

    async def exists_many_on_caller_loop(self, keys: Sequence[bytes], *, timeout: float,
                                         prefix: bool = False) -> list[bool] | None:
        """:meth:`exists_many` awaited on the caller's own event loop, over the blocking
        lane's sockets (none of this client's pool, which belongs to its loop). ``None``
        where :meth:`exists_many_blocking` says, and when the lane has no idle plain-TCP
        connection to every node asked."""
        if not keys:
            return []
        plan = self._lane_plan(keys)
        if plan is None:
            return None
        if prefix and self._by_blocks(keys):
            ends = time.monotonic() + timeout
            data, sizes = block_counts_request(keys)
            runs = await self._blocking.exists_on_caller_loop([(self._primary, data, len(sizes))], timeout,
                                                              flags=False)
            got = self._lane_counted(keys, runs, sizes)
            if not isinstance(got, tuple):
                return got
            a, b = got
            part = await self.exists_many_on_caller_loop(keys[a:b], timeout=max(0.0, ends - time.monotonic()))
            return None if part is None else with_block(a, part, len(keys))
        return _lane_found(plan, await self._blocking.exists_on_caller_loop(_lane_requests(plan), timeout))

    def _by_blocks(self, keys: Sequence[bytes]) -> bool:
        """A prefix lookup of these keys goes by block counts (:mod:`.prefix`)."""
        return (not self._cluster and not self._blocks_refused and len(keys) >= PREFIX_MIN_KEYS
                and self.settings.prefix_lookup == "counts")

    def _lane_counted(self, keys: Sequence[bytes], runs: list[Any] | None,
                      sizes: Sequence[int]) -> list[bool] | tuple[int, int] | None:
        """After the lane's block counts: the answer, or the ``(start, end)`` of the block
        still to ask per key, or None (the loop's path decides)."""
        step = None if runs is None else self._block_step(runs[0], sizes)
        if step is not None and step[0] == step[1]:
            return leading(step[0], len(keys))
        return step

    def _block_step(self, run: Any, sizes: Sequence[int]) -> tuple[int, int] | None:
        """:func:`.prefix.settle`; ``None``: ask per key instead, which reports what the
        server said. A server that refuses multi-key EXISTS (a cluster node addressed as
        standalone: CROSSSLOT or MOVED; a proxy or an old server: wrong number of arguments;
        an ACL: NOPERM) is remembered: later lookups ask per key at once. Errors that pass
        (a failover's READONLY, LOADING, TRYAGAIN, BUSY) are not."""
        step = settle(run, sizes)
        if step is None:
            err = next(v for v in run if isinstance(v, BaseException))
            if isinstance(err, ServerError) and not _passing(err):
                self._blocks_refused = True
                log.info("%s refused EXISTS of several keys (%s): prefix lookups ask per key",
                         self._primary.name, describe(err))
        return step

    def _lane_plan(self, keys: Sequence[bytes]) -> "_LookupPlan | None":
        """The plan of a lookup off the loop's thread, or None (then the loop's path)."""
        if not self._started or self._closed:
            return None
        try:
            plan = self._lookup_plan(keys)
        except (KeyError, IndexError, ValueError):  # the slot map being replaced on the loop's thread
            return None
        if sum(len(ks) for _, _, ks in plan.parts) != len(keys):  # (that, caught half-way)
            return None
        return plan

    async def delete(self, keys: Sequence[bytes], *, timeout: float) -> int:
        """UNLINK keys; returns how many existed. One command per slot (cluster) or one in all."""
        if not keys:
            return 0
        if self._cluster:
            by_slot: dict[int, list[bytes]] = {}
            for k in keys:
                by_slot.setdefault(key_slot(k), []).append(k)
            groups = list(by_slot.values())
        else:
            groups = [list(keys)]
        ops = [Op(i, (encode_command((b"UNLINK", *g)),), None, g[0]) for i, g in enumerate(groups)]
        total = 0
        # (not sent again: an UNLINK that ran before its reply was lost would count 0 the second time)
        for g, r in zip(groups, await self._run(ops, large=False, timeout=timeout)):
            if isinstance(r, BaseException):
                raise r
            if type(r) is not int or not 0 <= r <= len(g):
                raise ProtocolError(f"unexpected UNLINK reply: {describe(r)}")
            total += r
        return total

    # --- control --------------------------------------------------------------------

    async def command(self, *args: bytes | str | int | float, key: bytes | None = None, timeout: float) -> Any:
        """Run one control command on the node that owns ``key`` (any node if None)."""
        op = Op(0, (encode_command(args),), None, key, bound=self._control_bound)
        (r,) = await self._run([op], large=False, timeout=timeout)
        if isinstance(r, BaseException):
            raise r
        return r

    async def transaction(self, *commands: Sequence[bytes | str | int | float], key: bytes,
                          timeout: float) -> list[Any]:
        """``MULTI``, ``commands``, ``EXEC`` in one write on the node that owns ``key`` (every
        command on that key's slot): all of them run, or none. Returns EXEC's replies; raises
        the first error (a refused command aborts the whole transaction)."""
        data = b"".join([encode_command((b"MULTI",)), *(encode_command(c) for c in commands),
                         encode_command((b"EXEC",))])
        op = Op(0, (data,), None, key, bound=self._control_bound)
        op.node, op.nreplies = self._route(key), len(commands) + 2
        (r,) = await self._run([op], large=False, timeout=timeout)
        if isinstance(r, BaseException):
            raise r
        if isinstance(r[0], ServerError):  # MULTI refused (ACL): the commands ran one by one
            r[0].commands_ran = all(not isinstance(v, BaseException) for v in r[1:-1])
            raise r[0]
        for v in r:
            if isinstance(v, BaseException):
                raise v
        if not isinstance(r[-1], list) or len(r[-1]) != len(commands):
            raise ProtocolError(f"unexpected EXEC reply: {describe(r[-1])}")
        return r[-1]

    def primaries(self) -> list[Node]:
        return list(self._map.primaries) if self._cluster else [self._primary]

    async def command_all_primaries(self, *args: bytes | str | int | float, timeout: float) -> list[Any]:
        """Run a command on every primary in parallel; raises the first error."""
        data = encode_command(args)
        ops = []
        for i, node in enumerate(self.primaries()):
            op = Op(i, (data,), None, bound=self._control_bound)
            op.node = node
            ops.append(op)
        results = await self._run(ops, large=False, timeout=timeout)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return results

    async def scan_iter(self, match: bytes, count: int = 1000) -> AsyncIterator[bytes]:
        """SCAN every primary for keys matching ``match``; each node's walk is bounded
        (:func:`~lmcache_valkey.transport.scan.scan_walk`)."""
        for node in self.primaries():
            async def call(cursor: bytes, wait: float, node: Node = node) -> Any:
                return await self._node_call(node, (b"SCAN", cursor, b"MATCH", match, b"COUNT", count), wait)

            async for k in scan_walk(node.name, call, self.settings.op_timeout_s):
                yield k

    async def ping(self, *, timeout: float) -> None:
        if self._cluster:
            await self.command_all_primaries("PING", timeout=timeout)
        else:
            await self.command("PING", timeout=timeout)

    # --- stats (tests, metrics) -------------------------------------------------

    def round_trips(self) -> dict[str, int]:
        """Requests sent while the connection had no reply pending, per node."""
        return {n.name: p.round_trips for n, p in self._pools.items()}
