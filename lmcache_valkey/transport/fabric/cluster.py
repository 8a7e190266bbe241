"""The fabric transport over a Valkey Cluster: one FabricTransport per primary (its own
link: endpoint, registrations, HELLO'd sessions), keys routed by hash slot.

Every operation is split by node (deletes by slot: ``UNLINK`` of keys in several slots is a
CROSSSLOT error) and run on the nodes concurrently. A ``MOVED`` reply updates the slot map
and the item is retried once on its new node within the same deadline; an ``ASK`` (a slot
in migration) is a miss for that item -- the next topology refresh routes it. Buffers of a
retried GET go back to the caller only when both attempts let go of them.

Registrations are repeated on every node's link (and on nodes that appear later), so each
node's RMA reaches the same arena under its own keys; a stalled node revokes only its own
link (docs/fabric-buffer-ownership.md). Knows nothing of chunks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any

from lmcache_valkey.config import Node
from lmcache_valkey.errors import ConnectionLost, Redirect, TransportError

from ..resp.cluster import SlotMap, key_slot, parse_cluster_slots
from .. import read_window
from .transport import FabricTransport, ReleaseBarrier

log = logging.getLogger(__name__)


class ClusterFabricTransport:
    supports_release_callbacks = True

    def __init__(self, seeds: Sequence[Node], make_node: Callable[[Node], FabricTransport], *,
                 connect_timeout: float = 5.0) -> None:
        self._seeds = list(seeds)
        self._make_node = make_node
        self._connect_timeout = connect_timeout
        self._nodes: dict[Node, FabricTransport] = {}
        self._map = SlotMap()
        self._ranges: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []  # (method, args, kwargs)
        self._refreshing: asyncio.Task | None = None
        self._closed = False

    # -- topology -------------------------------------------------------------------------

    def _node(self, node: Node) -> FabricTransport:
        t = self._nodes.get(node)
        if t is None:
            if self._closed:
                raise ConnectionLost("the fabric transport is closed")
            t = self._nodes[node] = self._make_node(node)
            for method, args, kwargs in self._ranges:
                getattr(t, method)(*args, **kwargs)
        return t

    async def connect(self) -> None:
        """Loads the slot map from the first seed that answers, then opens a session on
        every primary (HELLO, and the address proof where the module takes it)."""
        await self._refresh()
        await asyncio.gather(*(self._node(n).connect() for n in self._map.primaries))

    async def _refresh(self) -> None:
        errors = []
        for seed in [*self._map.primaries, *self._seeds]:
            try:
                reply = await self._node(seed).control("CLUSTER", "SLOTS", timeout=self._connect_timeout)
                ranges = parse_cluster_slots(reply, seed.host)
            except TransportError as e:
                errors.append(f"{seed.name}: {e}")
                continue
            if ranges:
                self._map.load(ranges)
                return
        raise ConnectionLost("no cluster node answered CLUSTER SLOTS: " + "; ".join(errors))

    def _refresh_soon(self) -> None:
        if self._closed or (self._refreshing is not None and not self._refreshing.done()):
            return

        async def run() -> None:
            try:
                await self._refresh()
            except TransportError as e:
                log.warning("fabric cluster: topology refresh failed: %s", e)

        self._refreshing = asyncio.get_running_loop().create_task(run())

    def _route(self, key: bytes) -> FabricTransport:
        node = self._map.node_for(key_slot(key)) or (self._map.primaries or self._seeds)[0]
        return self._node(node)

    def _groups(self, keys: Sequence[bytes], by_slot: bool = False) -> dict[Any, list[int]]:
        groups: dict[Any, list[int]] = {}
        for i, k in enumerate(keys):
            t = self._route(k)
            groups.setdefault((t, key_slot(k)) if by_slot else t, []).append(i)
        return groups

    def _moved(self, result: Any) -> FabricTransport | None:
        """The node a MOVED result points at (and the slot map updated), else None."""
        if isinstance(result, Redirect) and result.kind == "MOVED":
            node = Node(result.host, result.port)
            self._map.set(result.slot, node)
            self._refresh_soon()
            return self._node(node)
        return None

    async def _run(self, items: Sequence[tuple[bytes, Any]], results: list[Any],
                   attempt: Callable[[FabricTransport, list[int]], Any], deadline: float) -> None:
        """Each node's share concurrently, then the items a MOVED sent elsewhere once more."""
        loop = asyncio.get_running_loop()
        groups = self._groups([k for k, _ in items])
        await asyncio.gather(*(attempt(t, idxs) for t, idxs in groups.items()))
        retry: dict[FabricTransport, list[int]] = {}
        for i, r in enumerate(results):
            target = self._moved(r)
            if target is not None and deadline - loop.time() > 0:
                retry.setdefault(target, []).append(i)
        if retry:
            await asyncio.gather(*(attempt(t, idxs) for t, idxs in retry.items()))

    # -- registration ------------------------------------------------------------------------

    def register(self, addr: int, length: int, *, cuda_device: int | None = None) -> bool:
        self._ranges.append(("register", (addr, length), {"cuda_device": cuda_device}))
        for t in self._nodes.values():
            t.register(addr, length, cuda_device=cuda_device)
        return True

    def register_buffer(self, buf: Any) -> None:
        self._ranges.append(("register_buffer", (buf,), {}))
        for t in self._nodes.values():
            t.register_buffer(buf)

    # -- the store's ChunkTransport protocol ----------------------------------------------------

    async def get_many_into(
        self, items: Sequence[tuple[bytes, Sequence[memoryview]]], *, timeout: float,
        on_release: Sequence[Callable[[], None]] | None = None,
    ) -> list[int | None | TransportError]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        callbacks = list(on_release) if on_release is not None else [None] * len(items)
        releases = [ReleaseBarrier(cb) for cb in callbacks]
        results: list[Any] = [None] * len(items)

        async def attempt(t: FabricTransport, idxs: list[int]) -> None:
            for i in idxs:
                releases[i].hold()
            got = await t.get_many_into([items[i] for i in idxs], timeout=max(0.001, deadline - loop.time()),
                                        on_release=[releases[i].drop for i in idxs])
            for i, g in zip(idxs, got):
                results[i] = g

        try:
            await self._run(items, results, attempt, deadline)
        finally:
            for r in releases:
                r.drop()  # the call's own hold
        return results

    async def getrange_into(self, key: bytes, start: int, buf: memoryview, *, timeout: float) -> int | None:
        """The start of a value through a window of ``len(buf)`` bytes (``start`` 0 only)."""
        return await read_window(self, key, start, buf, timeout)

    async def set_many(
        self, items: Sequence[tuple[bytes, Sequence[Any]]], *, ttl_s: float | None, timeout: float
    ) -> list[TransportError | None]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        results: list[Any] = [None] * len(items)

        async def attempt(t: FabricTransport, idxs: list[int]) -> None:
            got = await t.set_many([items[i] for i in idxs], ttl_s=ttl_s, timeout=max(0.001, deadline - loop.time()))
            for i, g in zip(idxs, got):
                results[i] = g

        await self._run(items, results, attempt, deadline)
        return results

    async def exists_many(self, keys: Sequence[bytes], *, timeout: float, prefix: bool = False) -> list[bool]:
        """One pipelined round trip per node, concurrently."""
        out: list[bool] = [False] * len(keys)

        async def one(t: FabricTransport, idxs: list[int]) -> None:
            for i, v in zip(idxs, await t.exists_many([keys[i] for i in idxs], timeout=timeout)):
                out[i] = v

        await asyncio.gather(*(one(t, idxs) for t, idxs in self._groups(keys).items()))
        return out

    def exists_many_blocking(self, keys: Sequence[bytes], *, timeout: float,
                             prefix: bool = False) -> list[bool] | None:
        return None  # each node's control connection belongs to the loop: lookups run there

    async def exists_many_on_caller_loop(self, keys: Sequence[bytes], *, timeout: float,
                                         prefix: bool = False) -> list[bool] | None:
        return None

    async def delete(self, keys: Iterable[bytes], timeout: float = 5.0) -> int:
        keys = list(keys)
        counts = await asyncio.gather(*(t.delete([keys[i] for i in idxs], timeout=timeout)
                                        for (t, _slot), idxs in self._groups(keys, by_slot=True).items()))
        return sum(counts)

    async def scan_iter(self, match: bytes, count: int = 1000) -> AsyncIterator[bytes]:
        for node in list(self._map.primaries):
            async for k in self._node(node).scan_iter(match, count):
                yield k

    async def ping(self, *, timeout: float) -> None:
        await asyncio.gather(*(self._node(n).ping(timeout=timeout) for n in self._map.primaries))

    async def info(self, key: bytes, timeout: float = 5.0) -> tuple[int, int] | None:
        return await self._route(key).info(key, timeout)

    @property
    def peer_proof(self) -> bool | None:
        proofs = [t.peer_proof for t in self._nodes.values() if t.peer_proof is not None]
        return None if not proofs else all(proofs)

    @property
    def stats(self) -> dict[str, int]:
        total: dict[str, int] = {"nodes": len(self._nodes)}
        for t in self._nodes.values():
            for k, v in t.stats.items():
                total[k] = total.get(k, 0) + v
        return total

    @property
    def pending_ops(self) -> int:
        return sum(t.pending_ops for t in self._nodes.values())

    @property
    def nodes(self) -> dict[Node, FabricTransport]:
        return dict(self._nodes)

    async def close(self) -> None:
        self._closed = True
        if self._refreshing is not None:
            self._refreshing.cancel()
        nodes, self._nodes = list(self._nodes.values()), {}
        await asyncio.gather(*(t.close() for t in nodes), return_exceptions=True)

    async def __aenter__(self) -> "ClusterFabricTransport":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


__all__ = ["ClusterFabricTransport"]
