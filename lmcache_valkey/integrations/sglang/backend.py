"""``ValkeyHiCacheStorage``: the HiCache L3 storage backend SGLang loads by name.

    python -m sglang.launch_server ... --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic --hicache-storage-backend-extra-config \\
        '{"backend_name": "valkey", "module_path": "lmcache_valkey.integrations.sglang.backend",
          "class_name": "ValkeyHiCacheStorage", "interface_v1": 1, "url": "valkey://kv:6379"}'

Thin by design: SGLang's page keys become :class:`ChunkRef` s, its host pool's pages become
the parts the store moves in place (:mod:`.pages`), and every call is a store call on the
private I/O loop (docs/private-io-loop.md), waited for within the store's deadlines. SGLang
calls from its prefetch and backup threads, concurrently; nothing here keeps per-call state.

Keys: ``<prefix>:<tenant>:<fingerprint>:c:{<keyed hash of SGLang's page hash>}``. The
fingerprint covers the model, the parallel shard (:func:`.settings.config_fields`), the host
pool's class, page format and dtype (:class:`.pages.PageFormat`) and ``model_revision``: a
page is never served to another model, shard or byte layout. Design notes: docs/sglang.md.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, List, Optional, Sequence

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig, HiCacheStorageExtraInfo

from ...codec import ChunkLayout, ChunkMeta
from ...errors import ConfigError, LmcacheValkeyError
from ...session import StoreSession, namespace_for
from ...store import ChunkRef, ChunkStore
from .pages import PageFormat, PoolPages, UnsupportedPool, page_starts
from .settings import KEY_PREFIX, BackendSettings, config_fields, parse_backend_settings
from .stats import BackendStats

log = logging.getLogger(__name__)

_GRACE_S = 1.0  # past the store's own deadline: the private loop is wedged, answer misses


class ValkeyHiCacheStorage(HiCacheStorage):
    """SGLang HiCache L3 pages in Valkey RAM (and, with tiering, NVMe and S3 behind it), shared
    by every SGLang server that names the same Valkey, tenant, model and page layout."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None) -> None:
        self.storage_config = storage_config
        try:
            self.settings: BackendSettings = parse_backend_settings(storage_config.extra_config)
        except LmcacheValkeyError as e:
            log.error("lmcache-valkey SGLang backend: %s", e)
            raise
        self.is_writer = bool(storage_config.is_storage_writer)
        self._fields = config_fields(storage_config)
        store = self.settings.store
        # Until a host pool is registered, pages are whatever the caller hands the plain API.
        namespace = namespace_for(store, {**self._fields, "pool": None})
        try:
            self._session = StoreSession(store, namespace, self.settings.tiering,
                                         name=f"lmcache-valkey-sglang-tp{storage_config.tp_rank}")
        except BaseException as e:
            log.error("lmcache-valkey SGLang backend could not start (%s): %s", store.url_for_humans, e)
            raise
        self._store: ChunkStore = self._session.store
        if self._session.transport_name == "fabric" and not self.settings.interface_v1:
            self._session.close()
            e = ConfigError(KEY_PREFIX + "interface_v1", "1 with the fabric transport (SGLang's copying path hands "
                            "the backend temporary tensors outside the registered host pool)", 0)
            log.error("lmcache-valkey SGLang backend: %s", e)
            raise e
        self._pages: PoolPages | None = None
        self._closed = False
        self._lock = threading.Lock()
        self.stats = BackendStats(enabled=bool(storage_config.enable_storage_metrics))
        if not self.settings.interface_v1:
            log.warning("lmcache-valkey SGLang backend: \"interface_v1\": 1 is not set in the extra config, so "
                        "SGLang copies every page through a temporary tensor; set it for zero-copy transfers")
        log.info("lmcache-valkey SGLang backend on %s (tenant %s, transport %s, %s)", store.url_for_humans,
                 store.tenant, self._session.transport_name,
                 "writer" if self.is_writer else "reader: this rank's MLA pages are written by another rank")

    # ---------------------------------------------------------------- registration

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        super().register_mem_pool_host(mem_pool_host)
        try:
            pages = PoolPages(mem_pool_host)
        except UnsupportedPool as e:
            log.error("lmcache-valkey SGLang backend: %s", e)
            raise
        namespace = namespace_for(self.settings.store, {**self._fields, **self._pool_fields(mem_pool_host, pages.format)})
        if self._session.store.register_memory(*pages.region):
            log.info("lmcache-valkey SGLang backend: host pool (%d bytes) registered for RMA", pages.region[1])
        with self._lock:
            self._pages = pages
            self._store = self._session.store.for_namespace(namespace)
        log.info("lmcache-valkey SGLang backend: namespace %s for %s %s pages of %d bytes (%s)", namespace.digest,
                 type(mem_pool_host).__name__, mem_pool_host.layout, pages.format.nbytes,
                 " x ".join(f"{n} {name}" for name, n in pages.format.dims))

    @staticmethod
    def _pool_fields(pool: Any, fmt: PageFormat) -> dict[str, Any]:
        return {"pool": type(pool).__name__, "format_tag": getattr(pool, "storage_format_tag", None), **fmt.fields()}

    # ---------------------------------------------------------------- keys and calls

    def _ref(self, key: str) -> ChunkRef:
        return ChunkRef(self._store.namespace.chunk_id(key), key)

    def _run(self, coro: Any, timeout: float, default: Any) -> Any:
        """Run a store call on the private loop; past ``timeout`` (or closed) the answer is
        ``default`` (misses, failures): SGLang recomputes rather than waits."""
        return self._guarded(getattr(coro, "__name__", "call"), lambda: self._session.run_sync(coro, timeout), default,
                             on_closed=coro.close)

    def _guarded(self, what: str, call: Callable[[], Any], default: Any,
                 on_closed: Callable[[], Any] | None = None) -> Any:
        """``call()``, or ``default`` once closed (after ``on_closed()``) or if it raised."""
        if self._closed:
            if on_closed is not None:
                on_closed()
            return default
        try:
            return call()
        except Exception as e:  # the store answers misses itself; this is a wedged loop or a bug
            log.warning("lmcache-valkey SGLang backend: %s did not complete: %r", what, e)
            return default

    @property
    def _op_timeout(self) -> float:
        return self.settings.store.op_timeout_s + _GRACE_S

    @property
    def _lookup_timeout(self) -> float:
        return self.settings.store.lookup_timeout_s + _GRACE_S

    @staticmethod
    def _layout(fmt: PageFormat) -> ChunkLayout:
        """How every page of a namespace (which covers the page format) is stored."""
        return ChunkLayout(shapes=(fmt.shape,), dtypes=(fmt.dtype,), fmt=0)

    def _meta(self, key: str, fmt: PageFormat) -> ChunkMeta:
        lay = self._layout(fmt)
        return ChunkMeta(shapes=lay.shapes, dtypes=lay.dtypes, fmt=lay.fmt, key=key)

    # ---------------------------------------------------------------- lookups

    def batch_exists(self, keys: List[str], extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        """How many pages, from the first, are stored: one pipelined EXISTS per Valkey node."""
        if not keys:
            return 0
        store = self._store
        ids = [store.namespace.chunk_id(k) for k in keys]
        # On this thread where the transport can (no hop to the loop and back).
        return self._guarded("lookup", lambda: self._session.contains_prefix(ids, self._lookup_timeout, store), 0)

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # ---------------------------------------------------------------- zero-copy pages

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        """Read pages straight into the host pool slots ``host_indices`` names."""
        pages, store = self._pages, self._store
        if not keys:
            return []
        starts = self._starts(pages, keys, host_indices, "batch_get_v1")
        if pages is None or starts is None:
            return [False] * len(keys)
        started = time.perf_counter()
        refs = [ChunkRef(store.namespace.chunk_id(k), k) for k in keys]
        ok = self._run(self._load(store, pages, refs, [pages.parts(s) for s in starts]), self._op_timeout,
                       [False] * len(keys))
        self.stats.prefetch(sum(ok), pages.format.nbytes, time.perf_counter() - started)
        return ok

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        """Store pages straight from the host pool slots ``host_indices`` names."""
        pages, store = self._pages, self._store
        if not keys:
            return []
        if not self.is_writer:
            return self._skip_write(keys)
        starts = self._starts(pages, keys, host_indices, "batch_set_v1")
        if pages is None or starts is None:
            return [False] * len(keys)
        started = time.perf_counter()
        items = [(self._ref(k), self._meta(k, pages.format), pages.parts(s)) for k, s in zip(keys, starts)]
        ok, sent = self._run(self._save(store, items), self._op_timeout, ([False] * len(keys), 0))
        self.stats.backup(sent, pages.format.nbytes, time.perf_counter() - started)
        return ok

    def _starts(self, pages: PoolPages | None, keys: Sequence[str], host_indices: Any, op: str) -> list[int] | None:
        if pages is None:
            log.error("lmcache-valkey SGLang backend: %s before register_mem_pool_host", op)
            return None
        starts = page_starts(host_indices, len(keys), pages.page_size)
        if starts is None or not all(pages.valid_start(s) for s in starts):
            log.error("lmcache-valkey SGLang backend: %s got %d host slots for %d pages of %d tokens, not whole "
                      "pages of the host pool (%d slots)", op, len(host_indices), len(keys), pages.page_size,
                      pages.capacity)
            return None
        return starts

    async def _load(self, store: ChunkStore, pages: PoolPages, refs: list[ChunkRef],
                    dests: list[list[memoryview]]) -> list[bool]:
        """Read into the pool; return only once no transfer can still write into a missed page
        (SGLang reuses a missed page's slots as soon as this returns)."""
        fmt = pages.format
        # A stored value of another layout can never be a page here: a counted miss, deleted.
        results = await store.load_into(list(zip(refs, dests)), layout=self._layout(fmt))
        ok = [r is not None and r.nbytes == fmt.nbytes for r in results]
        for ref, r, good in zip(refs, results, ok):
            if r is not None and not good:
                log.warning("lmcache-valkey SGLang backend: page %s holds %d bytes, not %d: a miss",
                            ref.chunk_id, r.nbytes, fmt.nbytes)
        return ok

    async def _save(self, store: ChunkStore, items: list[tuple[ChunkRef, ChunkMeta, Any]]) -> tuple[list[bool], int]:
        """Store the pages Valkey does not hold yet; (per page: stored or already there, pages sent)."""
        ok = [True] * len(items)
        todo = list(range(len(items)))
        if self.settings.skip_existing:
            present = await store.contains_each([ref.chunk_id for ref, _, _ in items])
            todo = [i for i, p in enumerate(present) if not p]
        if todo:
            stored = await store.put_many([items[i] for i in todo])
            for i, s in zip(todo, stored):
                ok[i] = s
        return ok, len(todo)

    def _skip_write(self, keys: Sequence[str]) -> List[bool]:
        """An MLA rank that is not its shard's writer: another rank stores these same pages
        (SGLang's controller does not even call it; a direct caller is told it is done)."""
        self.stats.skipped(len(keys))
        return [True] * len(keys)

    # ---------------------------------------------------------------- plain API

    def get(self, key: str, target_location: Optional[Any] = None, target_sizes: Optional[Any] = None) -> torch.Tensor | None:
        return self.batch_get([key], [target_location] if target_location is not None else None)[0]

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> List[torch.Tensor | None]:
        """Read each page into its tensor (SGLang passes ``get_dummy_flat_data_page()`` s);
        the tensor on a hit, None on a miss."""
        if not keys:
            return []
        pages, store = self._pages, self._store
        if target_locations is None:
            if pages is None:
                raise ValueError("batch_get needs target tensors before a host pool is registered")
            target_locations = [pages.pool.get_dummy_flat_data_page() for _ in keys]
        if len(target_locations) != len(keys):
            raise ValueError(f"batch_get: {len(keys)} keys but {len(target_locations)} target tensors")
        started = time.perf_counter()
        refs = [ChunkRef(store.namespace.chunk_id(k), k) for k in keys]
        views = [_bytes_of(t, writable=True) for t in target_locations]
        nbytes = [v.nbytes for v in views]
        results = self._run(store.get_many_into(list(zip(refs, views))), self._op_timeout, [None] * len(keys))
        out = [t if r is not None and r.nbytes == n else None for t, r, n in zip(target_locations, results, nbytes)]
        self.stats.prefetch(sum(o is not None for o in out), nbytes[0], time.perf_counter() - started)
        return out

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(self, keys: List[str], values: Optional[Any] = None, target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        """Store each tensor (SGLang passes ``get_data_page(index, flat=True)``) under its key."""
        if not keys:
            return True
        if values is None or len(values) != len(keys):
            raise ValueError(f"batch_set: {len(keys)} keys but {0 if values is None else len(values)} values")
        if not self.is_writer:
            return all(self._skip_write(keys))
        pages, store = self._pages, self._store
        started = time.perf_counter()
        items = []
        for k, v in zip(keys, values):
            view = _bytes_of(v, writable=False)
            if pages is not None and view.nbytes != pages.format.nbytes:
                log.error("lmcache-valkey SGLang backend: batch_set value of %d bytes for key %s; a page holds %d",
                          view.nbytes, k, pages.format.nbytes)
                return False
            meta = self._meta(k, pages.format) if pages is not None else ChunkMeta(((view.nbytes,),), ("uint8",), 0, k)
            items.append((ChunkRef(store.namespace.chunk_id(k), k), meta, view))
        ok, sent = self._run(self._save(store, items), self._op_timeout, ([False] * len(keys), 0))
        self.stats.backup(sent, items[0][2].nbytes, time.perf_counter() - started)
        return all(ok)

    # ---------------------------------------------------------------- maintenance

    def clear(self) -> bool:
        """Remove this backend's pages (its namespace only: other models, layouts, ranks and
        tenants are untouched). Listing them needs ``SCAN``, which the tenant's confined worker
        ACL user is not given (docs/security.md): there, clearing is refused and an operator
        removes a namespace (``lmcache-valkey evict``)."""
        store = self._store
        removed = self._run(_clear(store), max(self._op_timeout, 60.0), None)
        if removed is None:
            log.error("lmcache-valkey SGLang backend: could not clear namespace %s (listing its pages failed: it "
                      "needs SCAN, which the tenant's worker ACL user does not have, and a server whose SCAN walk "
                      "does not end is refused, docs/scan-bounds.md; an operator can remove it)",
                      store.namespace.digest)
            return False
        log.info("lmcache-valkey SGLang backend: cleared namespace %s (%d pages)", store.namespace.digest, removed)
        return True

    def get_stats(self) -> Any:
        """SGLang's ``StorageMetrics`` since the last call (pages and GB/s per prefetch/backup)."""
        return self.stats.take()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._session.close()


async def _clear(store: ChunkStore, batch: int = 512) -> int:
    removed = 0
    ids: list[str] = []
    async for chunk in store.iter_ids():
        ids.append(chunk)
        if len(ids) >= batch:
            removed += await store.delete(ids)
            ids = []
    if ids:
        removed += await store.delete(ids)
    return removed


def _bytes_of(t: Any, *, writable: bool) -> memoryview:
    """A byte view of a CPU tensor's memory (a contiguous copy only for a strided value to store)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"expected a CPU tensor, got one on {t.device}")
    if not t.is_contiguous():
        if writable:
            raise ValueError("batch_get needs contiguous target tensors")
        t = t.contiguous()
    return memoryview(t.detach().reshape(-1).view(torch.uint8).numpy())


__all__ = ["ValkeyHiCacheStorage"]
