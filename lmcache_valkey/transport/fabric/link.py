"""One generation of this client's presence on the fabric: an open endpoint, every memory
range registered with it, the scratch slots, and the control connections whose sessions
are bound to this endpoint's address.

A link can be revoked. Revoking closes its connections and then its endpoint (keys and
provider connections with them): from then on no peer can reach memory registered through
it, however long it was paused and whatever it still had queued. That -- not a deadline the
server promises to honour -- is what lets the transport give a buffer back after a transfer
whose end it could not confirm (docs/fabric-buffer-ownership.md). The transport opens a new
link (new address, new random keys) for the operations that follow.

Knows nothing of keys or values; speaks the handshake of its dialect (``BLOB.*`` or ``DMA.*``;
docs/security.md, "Server module and fabric peers").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from lmcache_valkey.errors import ProtocolError

from . import commands
from .endpoint import FabricEndpoint, MemoryRegion
from .errors import UnregisteredBuffer
from .scratch import BouncePool, ScratchPool
from .sessions import ErrorReply, Send, SessionPool

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EndpointSpec:
    provider: str
    bind_addr: str | None
    hmem: bool


@dataclass(frozen=True)
class Range:
    """A registration to repeat on every new link: raw memory, or a Python buffer."""

    addr: int = 0
    length: int = 0
    cuda_device: int | None = None
    buffer: Any = None


@dataclass(frozen=True)
class RawSpan:
    """Registered memory with no Python buffer over it -- a CUDA allocation registered
    with ``register(addr, length, cuda_device=N)`` -- named by address. The server moves
    its bytes in place by RMA; this process never reads or writes it, so it is never
    staged, never CRC-checked here, and has no bulk fallback (docs/gpu-check.md).
    ``owner`` (a torch tensor, say) stays referenced for as long as the transfer may touch it."""

    addr: int
    length: int
    owner: Any = None

    def __post_init__(self) -> None:
        if self.length < 0:
            raise ValueError("a RawSpan's length cannot be negative")


def has_raw_spans(bufs: Sequence[Any]) -> bool:
    return any(isinstance(b, RawSpan) for b in bufs)


class NoSlot(Exception):
    """No scratch slot free for a small unregistered buffer: use the bulk path."""


class Plan:
    __slots__ = ("triples", "keep", "staged", "slots", "bounce")

    def __init__(self) -> None:
        self.triples: list[commands.Triple] = []
        self.keep: list[Any] = []  # the caller's views (and RawSpans), referenced until the transfer is over
        self.staged: list[tuple[memoryview, memoryview]] = []  # (caller's view, scratch slot)
        self.slots: list[int] = []
        self.bounce: int | None = None  # offset of the bounce extent holding the whole value


class FabricLink:
    def __init__(self, spec: EndpointSpec, ranges: Sequence[Range], conn_kwargs: dict[str, Any], max_conns: int,
                 scratch_bytes: int, generation: int, reply_bound: int, dialect: Any = commands.LARGE_OBJECT,
                 bounce_bytes: int = 0) -> None:
        self.generation = generation
        self.dialect = dialect
        self.endpoint = FabricEndpoint(spec.provider, spec.bind_addr, hmem=spec.hmem)
        self.scratch: ScratchPool | None = None
        self.bounce: BouncePool | None = None
        try:
            for r in ranges:
                self.register(r)
            if scratch_bytes > 0:
                self.scratch = ScratchPool(self.endpoint, scratch_bytes)
            if bounce_bytes > 0:
                self.bounce = BouncePool(self.endpoint, bounce_bytes)
        except BaseException:  # e.g. RLIMIT_MEMLOCK: do not leak the endpoint's thread
            self.endpoint.close()
            raise
        self.pool = SessionPool(conn_kwargs, max_conns, self._handshake, reply_bound)
        self.revoked = False  # no new operation may start on it
        self.closed = False  # its endpoint is closed: nothing can reach its memory any more
        self.parked: list[tuple[Any, Callable[[], None]]] = []  # waiting for ``closed``
        # Whether the server took our HELLO extensions (address proof, regions): None until
        # the first session; False for a server that speaks only the upstream dialect.
        self.peer_proof: bool | None = None

    # -- memory -------------------------------------------------------------------------

    def register(self, r: Range) -> MemoryRegion:
        if r.buffer is not None:
            region = self.endpoint.register_buffer(r.buffer)
        else:
            region = self.endpoint.register(r.addr, r.length, cuda_device=r.cuda_device)
        # Sessions opened so far declared the old set of regions.
        pool = getattr(self, "pool", None)
        if pool is not None:
            pool.invalidate()
        return region

    def plan(self, bufs: Sequence[Any], writable: bool) -> Plan:
        """Maps buffers to (rkey, addr, len) triples. Registered buffers (and RawSpans) are
        used in place; a small unregistered one (the store's header) is staged through a
        scratch slot; anything else raises UnregisteredBuffer, or NoSlot when scratch is
        exhausted. A one-region dialect gets one triple: the buffers in place when they are
        one registered range, else the whole value staged through the bounce area."""
        try:
            plan = self._plan(bufs, writable)
        except NoSlot:  # no scratch slot for the header: the bounce area takes the whole value
            if not self.dialect.one_region:
                raise
            return self._plan_bounce(bufs, writable)
        if not self.dialect.one_region or (len(plan.triples) <= 1 and not plan.staged):
            return plan
        self.give_slots(plan)
        return self._plan_bounce(bufs, writable)

    def _plan_bounce(self, bufs: Sequence[Any], writable: bool) -> Plan:
        if has_raw_spans(bufs):
            raise UnregisteredBuffer("a one-region dialect moves GPU memory (RawSpans) only as one registered span")
        views = [v for v in (byte_view(b) for b in bufs) if len(v)]
        total = sum(len(v) for v in views)
        got = self.bounce.take(total) if self.bounce is not None else None
        if got is None:
            raise NoSlot()
        plan = Plan()
        plan.bounce, target = got
        at = 0
        for v in views:
            piece = target[at : at + len(v)]
            if not writable:
                piece[:] = v
            plan.staged.append((v, piece))
            plan.keep.append(v)
            at += len(v)
        addr, _ = self.endpoint.address_of(target)
        plan.triples.append((self.bounce.region.key, self.bounce.region.remote_addr(addr), total))
        return plan

    def _plan(self, bufs: Sequence[Any], writable: bool) -> Plan:
        ep = self.endpoint
        plan = Plan()
        try:
            for b in bufs:
                if isinstance(b, RawSpan):
                    if b.length == 0:
                        continue
                    span_region = ep.find_region(b.addr, b.length)
                    if span_region is None:
                        raise UnregisteredBuffer(
                            f"RawSpan at {b.addr:#x} (+{b.length}) lies outside every registered region: "
                            "register the allocation first (register(addr, length, cuda_device=N))")
                    plan.triples.append((span_region.key, span_region.remote_addr(b.addr), b.length))
                    plan.keep.append(b)
                    continue
                mv = byte_view(b)
                if len(mv) == 0:
                    continue
                if writable and mv.readonly:
                    raise UnregisteredBuffer("get_into needs writable buffers")
                addr, n = ep.address_of(mv)
                region = ep.find_region(addr, n)
                target = mv
                if region is None:
                    slot = self.scratch.take(n) if self.scratch is not None else None
                    if slot is None:
                        if self.scratch is not None and n <= self.scratch.slot_bytes:
                            raise NoSlot()
                        raise UnregisteredBuffer(
                            f"buffer at {addr:#x} (+{n}) lies outside every registered region; register the arena first"
                        )
                    index, target = slot
                    plan.slots.append(index)
                    plan.staged.append((mv, target))
                    if not writable:
                        target[:] = mv
                    addr, n = ep.address_of(target)
                    region = self.scratch.region
                plan.triples.append((region.key, region.remote_addr(addr), n))
                plan.keep.append(mv)
            if len(plan.triples) > commands.MAX_TRIPLES:
                raise ValueError(f"at most {commands.MAX_TRIPLES} buffers per operation")
        except BaseException:
            self.give_slots(plan)
            raise
        return plan

    def give_slots(self, plan: Plan) -> None:
        if self.scratch is not None:
            for index in plan.slots:
                self.scratch.give(index)
        plan.slots = []
        if plan.bounce is not None and self.bounce is not None:
            self.bounce.give(plan.bounce)
        plan.bounce = None

    def _declared_regions(self) -> list[commands.Triple]:
        regions = self.endpoint.regions()
        if len(regions) > commands.MAX_REGIONS:
            # More than the server tracks: declare none. A server on its default (require_proof
            # yes) then refuses the session (even its proof lies in no declared region: BADREGION);
            # one with require_proof no does not confine its triples.
            log.warning("fabric: %d registered regions, more than the %d a session can declare: "
                        "the server confines this session to none", len(regions), commands.MAX_REGIONS)
            return []
        return [(r.key, r.remote_addr(r.addr), r.length) for r in regions]

    # -- the handshake of each control connection ---------------------------------------

    async def _handshake(self, send: Send) -> None:
        """HELLO with our extensions -- PROOF (the server hands us a nonce, we put it in a
        registered scratch slot and the server reads it back from the address we claimed:
        proof that we own it) and the REGIONs this session may touch -- or, with a server
        that refuses them, the plain upstream HELLO."""
        d = self.dialect
        if self.peer_proof is not False and self.scratch is not None:
            try:
                reply = await send(d.hello(self.endpoint.name, True, self._declared_regions()))
            except ErrorReply as exc:
                if not exc.message.startswith("ERR"):
                    raise  # NOFABRIC, a refused address...: the server's answer stands
                log.info("fabric: the server refuses HELLO extensions (%s): plain HELLO, no address proof",
                         exc.message)
                self.peer_proof = False
            else:
                servers, nonce = d.parse_hello_reply(reply, proof=True)
                self._add_peers(servers)
                if nonce is None:  # a DMA server that ignores HELLO's arguments: no session, no proof
                    log.info("fabric: the server ignores %s PROOF: no address proof", d.hello_command)
                    self.peer_proof = False
                    return
                await self._prove(send, nonce)
                self.peer_proof = True
                return
        reply = await send(d.hello(self.endpoint.name))
        servers, _ = d.parse_hello_reply(reply, proof=False)
        self._add_peers(servers)
        if self.peer_proof is None:
            self.peer_proof = False

    async def _prove(self, send: Send, nonce: bytes) -> None:
        assert self.scratch is not None and nonce is not None
        slot = self.scratch.take(len(nonce))
        if slot is None:
            raise NoSlot()
        index, view = slot
        view[:] = nonce
        addr, _ = self.endpoint.address_of(view)
        try:
            await send(self.dialect.prove(self.scratch.region.key, self.scratch.region.remote_addr(addr)))
        except ErrorReply:
            self.scratch.give(index)  # answered: the server's read is over
            raise
        # (A slot whose PROVE got no answer is not given back: the server may read it later.)
        self.scratch.give(index)

    def _add_peers(self, servers: list[bytes]) -> None:
        for name in servers:
            # The provider would read an address of the wrong shape past its end.
            try:
                name = self.endpoint.peer_name(name)
            except ValueError as e:
                raise ProtocolError(f"the server sent {e}") from None
            # Lets the provider reach the server too (EFA, shm); harmless for tcp.
            self.endpoint.add_peer(name)

    # -- teardown -------------------------------------------------------------------------

    async def close(self, loop: Any) -> None:
        """Closes every connection (those in use too), then the endpoint (off the loop: it
        joins the progress thread); marks the link closed."""
        self.revoked = True
        await self.pool.close(abort=True)
        await loop.run_in_executor(None, self.endpoint.close)
        self.closed = True


def byte_view(b: Any) -> memoryview:
    mv = b if isinstance(b, memoryview) else memoryview(b)
    return mv if (mv.format == "B" and mv.ndim == 1) else mv.cast("B")
