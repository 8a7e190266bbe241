"""LMCache ``RemoteConnector`` over :class:`lmcache_valkey.store.ChunkStore`.

Thin by design: it turns ``CacheEngineKey`` into a :class:`ChunkRef`, a
``MemoryObj`` into (metadata, buffer), and runs store coroutines on the
private I/O loop (see loop_thread.py for why).

Reference counts (LMCache's contract, kept here and nowhere else):

* get: we ``allocate`` the destination; on a miss, an error or a cancellation
  we release it ourselves, after the transport can no longer write into it;
  on a hit, the caller owns the one reference.
* put: the caller's reference is never dropped here (InstrumentedRemoteConnector
  does it when ``put`` returns). We take our own reference for the duration of
  the I/O, so a cancelled ``put`` never frees a buffer a socket still reads.
"""

from __future__ import annotations

import logging
from typing import Any, List, Optional, Sequence

from lmcache.utils import CacheEngineKey
from lmcache.v1.memory_management import MemoryObj
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

from ... import metrics
from ...codec import ChunkLayout, ChunkMeta
from ...config import Settings
from ...keys import ChunkIds, Namespace
from ...session import StoreSession, namespace_for
from ...store import ChunkRef, ChunkStore, GetResult
from .key_ids import EngineKeyIds

log = logging.getLogger(__name__)


def namespace_fields(config: Any, metadata: Any, conn: RemoteConnector) -> dict[str, Any]:
    """Everything that shapes the bytes of a chunk; any difference means another namespace
    (``namespace_for`` adds what every engine shares, ``model_revision``)."""
    return {
        "model": metadata.model_name,
        "kv_dtype": str(metadata.kv_dtype),
        "kv_shape": list(metadata.kv_shape),
        "use_mla": bool(metadata.use_mla),
        "shapes": [list(s) for s in conn.meta_shapes],
        "dtypes": [str(d) for d in conn.meta_dtypes],
        "fmt": int(conn.meta_fmt.value),
        # Not the rank: CacheEngineKey strings already carry it, and LMCache's MLA mode
        # has every rank read rank 0's chunks (a per-rank namespace would never hit).
        "world_size": metadata.world_size,
        "chunk_size": metadata.chunk_size,
        "serde": getattr(config, "remote_serde", None),
    }


def chunk_layout(config: Any, conn: RemoteConnector) -> ChunkLayout | None:
    """What every chunk of this connector's namespace holds (the namespace covers shapes,
    dtypes and format): a full chunk, or a partial last one with fewer tokens along LMCache's
    token dimension (2 in ``[2|1, layers, tokens, hidden]``, else 0; its
    ``reshape_partial_chunk``). With a compressing ``remote_serde`` the stored bytes have a
    layout of their own: then only the header's own consistency is checked."""
    if getattr(config, "remote_serde", None) not in (None, "naive"):
        return None
    shapes = tuple(tuple(int(d) for d in s) for s in conn.meta_shapes)
    return ChunkLayout(
        shapes=shapes,
        dtypes=tuple(str(d) for d in conn.meta_dtypes),
        fmt=int(conn.meta_fmt.value),
        token_dim=2 if shapes and len(shapes[0]) == 4 else 0,
    )


class ValkeyRemoteConnector(RemoteConnector):
    def __init__(
        self, config: Any, metadata: Any, local_cpu_backend: Any, settings: Settings, tiering: Any = None
    ) -> None:
        super().__init__(config, metadata)
        self.local_cpu_backend = local_cpu_backend
        self.settings = settings
        self.namespace: Namespace = namespace_for(settings, namespace_fields(config, metadata, self))
        self._ids = ChunkIds(self.namespace)
        self._key_ids = EngineKeyIds(self._ids)
        self._session = StoreSession(settings, self.namespace, tiering, arena=self._arena())
        self._io = self._session.io
        self.store: ChunkStore = self._session.store
        self._layout = chunk_layout(config, self)
        self._closed = False
        log.info(
            "lmcache-valkey connected to %s (tenant %s, namespace %s, transport %s)",
            settings.url_for_humans,
            settings.tenant,
            self.namespace.digest,
            self.store.transport_name,
        )

    # ------------------------------------------------------------- helpers

    def _arena(self) -> tuple[int, int] | None:
        """LMCache's whole CPU arena (every MemoryObj lies in it), registered once for RMA."""
        if self.settings.transport == "tcp":
            return None
        alloc = self.local_cpu_backend.memory_allocator
        buf = getattr(getattr(alloc, "pin_allocator", alloc), "buffer", None)
        if buf is None:
            if self.settings.transport == "fabric":
                raise RuntimeError(f"cannot find the CPU arena of {type(alloc).__name__} to register")
            log.warning("no CPU arena found in %s: transport auto will not use RMA", type(alloc).__name__)
            return None
        return buf.data_ptr(), buf.numel() * buf.element_size()

    def _ref(self, key: CacheEngineKey) -> ChunkRef:
        s = key.to_string()
        return ChunkRef(self._ids.of(s), s)

    def _chunk_ids(self, keys: Sequence[CacheEngineKey]) -> list[str]:
        """A lookup's hot path: keys to (remembered) ids, mostly without a key string."""
        return self._key_ids.many(keys)

    def _allocate(self) -> Optional[MemoryObj]:
        # busy_loop=False: never stall the I/O loop waiting for LMCache to evict.
        obj = self.local_cpu_backend.allocate(self.meta_shapes, self.meta_dtypes, self.meta_fmt, busy_loop=False)
        if obj is None:
            metrics.record_miss("ram", "alloc")
        return obj

    def _finish(self, obj: MemoryObj, result: Optional[GetResult]) -> Optional[MemoryObj]:
        """Turn a store result into what LMCache expects, releasing on a miss."""
        if result is None:  # already handed back through the store's on_release
            return None
        if result.nbytes != self.full_chunk_size_bytes:
            try:
                obj = self.reshape_partial_chunk(obj, result.nbytes)
            except ValueError as e:
                log.warning("stored chunk has an unusable length: %s", e)
                metrics.record_miss("ram", "truncated")
                obj.ref_count_down()
                return None
        return obj

    async def _get_many(self, keys: Sequence[CacheEngineKey]) -> list[Optional[MemoryObj]]:
        """Runs on the I/O loop: allocate, read, verify. Every destination that does not
        become a hit goes back to LMCache through ``on_release``, once nothing can write
        into it (at once with RESP; after the server's transfer ended with RMA)."""
        objs: list[Optional[MemoryObj]] = [self._allocate() for _ in keys]
        placed = [o for o in objs if o is not None]
        items = [(self._ref(k), o.byte_array) for k, o in zip(keys, objs) if o is not None]
        results = await self.store.get_many_into(items, on_release=lambda i: placed[i].ref_count_down(),
                                                 layout=self._layout)
        it = iter(results)
        return [None if o is None else self._finish(o, next(it)) for o in objs]

    async def _put_many(self, keys: Sequence[CacheEngineKey], objs: Sequence[MemoryObj]) -> list[bool]:
        items = []
        for k, o in zip(keys, objs):
            s = k.to_string()
            meta = ChunkMeta(
                shapes=tuple(tuple(int(d) for d in shape) for shape in o.get_shapes()),
                dtypes=tuple(str(d) for d in o.get_dtypes()),
                fmt=int(o.meta.fmt.value),
                key=s,
            )
            items.append((ChunkRef(self._ids.of(s), s), meta, o.byte_array))
        try:
            return await self.store.put_many(items)
        finally:
            for o in objs:
                o.ref_count_down()

    # --------------------------------------------------------- RemoteConnector

    async def exists(self, key: CacheEngineKey) -> bool:
        return await self._io.run(self.store.exists(self._ids.of(key.to_string())))

    def exists_sync(self, key: CacheEngineKey) -> bool:
        try:
            return self._session.contains_prefix([self._ids.of(key.to_string())], self.settings.lookup_timeout_s * 2) == 1
        except Exception as e:
            log.warning("exists_sync failed: %s", e)
            return False

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys: List[CacheEngineKey]) -> int:
        try:
            return self._session.contains_prefix(self._chunk_ids(keys), self.settings.lookup_timeout_s * 2)
        except Exception as e:
            log.warning("batched_contains failed: %s", e)
            return 0

    def support_batched_async_contains(self) -> bool:
        return True

    async def batched_async_contains(self, lookup_id: str, keys: List[CacheEngineKey], pin: bool = False) -> int:
        try:
            return await self._session.contains_prefix_async(self._chunk_ids(keys), self.settings.lookup_timeout_s * 2)
        except Exception as e:  # (the store answers misses itself; this is a wedged loop)
            log.warning("batched_async_contains failed: %s", e)
            return 0

    async def get(self, key: CacheEngineKey) -> Optional[MemoryObj]:
        return (await self._io.run(self._get_many([key]), on_orphan=_release_all))[0]

    def support_batched_get(self) -> bool:
        return True

    async def batched_get(self, keys: List[CacheEngineKey]) -> List[Optional[MemoryObj]]:
        return await self._io.run(self._get_many(keys), on_orphan=_release_all)

    def support_batched_get_non_blocking(self) -> bool:
        return True

    async def batched_get_non_blocking(self, lookup_id: str, keys: List[CacheEngineKey]) -> List[MemoryObj]:
        objs = await self._io.run(self._get_many(keys), on_orphan=_release_all)
        prefix: list[MemoryObj] = []
        for i, o in enumerate(objs):
            if o is None:
                _release_all(objs[i + 1 :])
                break
            prefix.append(o)
        return prefix

    async def put(self, key: CacheEngineKey, memory_obj: MemoryObj) -> None:
        memory_obj.ref_count_up()  # ours, dropped by _put_many when the I/O is over
        await self._io.run(self._put_many([key], [memory_obj]))

    def support_batched_put(self) -> bool:
        return True

    async def batched_put(self, keys: List[CacheEngineKey], memory_objs: List[MemoryObj]) -> None:
        for o in memory_objs:
            o.ref_count_up()
        await self._io.run(self._put_many(keys, memory_objs))

    def remove_sync(self, key: CacheEngineKey) -> bool:
        try:
            return self._io.run_sync(self.store.delete([self._ids.of(key.to_string())]), self.settings.op_timeout_s) > 0
        except Exception as e:
            log.warning("remove_sync failed: %s", e)
            return False

    async def list(self) -> List[str]:
        """Chunk ids of this namespace (LMCache key strings are not recoverable without reading values)."""
        return await self._io.run(self.store.list_ids())

    def support_ping(self) -> bool:
        return True

    async def ping(self) -> int:
        return 0 if await self._io.run(self.store.ping()) else 1

    async def close(self) -> None:
        """Idempotent: LMCache (and its own test fixtures) may close a backend twice."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._io.run(self.store.close())
        finally:
            self._io.stop()

    def close_sync(self) -> None:
        """For callers without a loop (tests, the demo); idempotent like :meth:`close`."""
        if self._closed:
            return
        self._closed = True
        self._session.close(timeout=5.0)

    def __repr__(self) -> str:
        return f"<ValkeyRemoteConnector {self.settings.url_for_humans} ns={self.namespace.base}>"


def _release_all(objs: Sequence[Optional[MemoryObj]]) -> None:
    for o in objs:
        if o is not None:
            o.ref_count_down()
