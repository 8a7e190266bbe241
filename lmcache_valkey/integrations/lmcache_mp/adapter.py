"""LMCache multiprocess (MP) mode: an ``L2AdapterInterface`` over :class:`~lmcache_valkey.store.ChunkStore`.

Thin by design: it turns ``ObjectKey`` into a :class:`ChunkRef` (keys.py), an L1
``MemoryObj`` into (metadata, buffer), and runs store coroutines on the private I/O loop of
a :class:`~lmcache_valkey.session.StoreSession` — the same store, transports (RESP, fabric
RMA into the L1 arena) and tiers as the in-process plugin.

Contract with LMCache's controllers (docs/lmcache-mp.md):

* ``submit_*`` may come from two controller threads at once; each returns a task id at
  once and the work runs on our loop; the result is posted on that kind's event fd and
  handed out exactly once.
* every task has a deadline (``op_timeout_s``, ``lookup_timeout_s``): a slow or dead server
  or tier finishes it as failed/missed in bounded time.
* L1 buffers: LMCache owns them and frees them when a task is reported done, so a load is
  reported only once no transfer can write into its buffers any more (with RMA the server
  writes; see ``_load``): bounded by the store's deadline, and over fabric by the revocation
  of a link whose transfer did not end in time. A store only reads them.
* lookup-and-lock: a found chunk is locked until ``submit_unlock``: LMCache's eviction
  (``delete``) skips it and, with tiering, its RAM copy is not demoted and its lower-tier
  copies are pinned (a lease, bounded by ``lock_lease_s``). Valkey's own ``maxmemory``
  eviction cannot be held off: such a chunk's load is a counted miss.
* byte accounting goes through ``_notify_keys_stored``/``_notify_keys_deleted`` so
  LMCache's L2 eviction and per-``cache_salt`` quotas see what this adapter stored; a chunk
  it stored that a lookup answers absent (Valkey evicted or expired it) is accounted deleted
  then. Those calls are also LMCache's L2 cache events (``L2_KEYS_STORED``/``DELETED`` on its
  event bus, published to the coordinator by its ``CacheEventSubscriber``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import Counter
from typing import Any, AsyncIterator, Coroutine, Mapping

from lmcache.lmcache_native import Bitmap
from lmcache.v1.distributed.api import KeyEntry, KeyListPage, ObjectKey
from lmcache.v1.distributed.internal_api import L2StoreResult
from lmcache.v1.distributed.l2_adapters.base import L2AdapterInterface, L2TaskId

from ... import metrics
from ...errors import AuthError
from ...session import StoreSession, namespace_for
from ...store import ChunkRef
from .config import LmcvL2AdapterConfig
from .keys import chunk_meta, fits, key_string, layout, object_key, ref
from .tasks import LOAD, LOOKUP, STORE, TaskBoard

log = logging.getLogger(__name__)

# Namespace fields of MP mode: the layout is checked per chunk at load (keys.py), the
# model, rank, group and salt are in every chunk's key string.
NAMESPACE_FIELDS = {"adapter": "lmcache-mp"}
_CURSORS_MAX = 16  # list_l2_keys listings open at once (oldest dropped)


class LmcvL2Adapter(L2AdapterInterface):
    """Load with ``{"type": "plugin", "module_path": "lmcache_valkey.integrations.lmcache_mp",
    "class_name": "LmcvL2Adapter", "adapter_params": {...}}``."""

    config_class_name = "LmcvL2AdapterConfig"

    def __init__(self, config: LmcvL2AdapterConfig | Mapping[str, Any], l1_memory_desc: Any = None) -> None:
        if not isinstance(config, LmcvL2AdapterConfig):  # the plugin loader's raw-dict mode
            config = LmcvL2AdapterConfig.from_dict(config)
        super().__init__(max_capacity_bytes=config.max_capacity_bytes)
        self.config = config
        self.settings = config.settings
        self.namespace = namespace_for(self.settings, NAMESPACE_FIELDS)
        self._lock = threading.Lock()
        self._locks: Counter[ObjectKey] = Counter()  # lookup-and-lock holders per key
        # Per stored key: the bytes this adapter accounted, and when it last landed (a count
        # of store tasks: a lookup answered "absent" drops only keys that landed before it
        # asked, see _lookup).
        self._sizes: dict[ObjectKey, tuple[int, int]] = {}
        self._stores_landed = 0
        self._cursors: dict[str, AsyncIterator[str]] = {}
        self._cursor_ids = itertools.count(1)
        self._closed = False
        self._board = TaskBoard()
        try:
            self._session = StoreSession(
                self.settings, self.namespace, config.tiering, arena=_arena(l1_memory_desc, self.settings),
                name="lmcache-valkey-mp-io",
            )
        except BaseException as e:
            self._board.close()
            log.error("lmcache-valkey L2 adapter could not start (%s): %s", self.settings.url_for_humans, e)
            raise
        self.store = self._session.store
        self._loop = self._session.io.loop
        s = self.settings
        self._store_deadline = s.op_timeout_s + 1.0
        self._lookup_deadline = s.lookup_timeout_s + 1.0
        log.info("lmcache-valkey L2 adapter connected to %s (tenant %s, namespace %s, transport %s, tiering %s)",
                 s.url_for_humans, s.tenant, self.namespace.digest, self.store.transport_name, config.tiering.mode)

    # ------------------------------------------------------------------ event fds

    def get_store_event_fd(self) -> int:
        return self._board.fileno(STORE)

    def get_lookup_and_lock_event_fd(self) -> int:
        return self._board.fileno(LOOKUP)

    def get_load_event_fd(self) -> int:
        return self._board.fileno(LOAD)

    # ---------------------------------------------------------------------- store

    def submit_store_task(self, keys: list[ObjectKey], objects: list[Any]) -> L2TaskId:
        _same_length("submit_store_task", keys, objects)
        task_id = self._board.start(STORE)
        if self._closed or not keys:
            self._board.finish(STORE, task_id, L2StoreResult(not self._closed, 0))
            return task_id
        items = []
        for k, o in zip(keys, objects):
            r = ref(self.namespace, k)
            items.append((r, chunk_meta(o, r.key_string), o.byte_array))
        self._launch(STORE, task_id, self._store_many(keys, objects, items), L2StoreResult(False, 0))
        return task_id

    async def _store_many(self, keys: list[ObjectKey], objects: list[Any], items: list[Any]) -> L2StoreResult:
        ok = await asyncio.wait_for(self.store.put_many(items), self._store_deadline)
        stored: list[ObjectKey] = []
        sizes: list[int] = []
        moved = 0
        with self._lock:
            self._stores_landed += 1
            for k, o, good in zip(keys, objects, ok):
                if not good:
                    continue
                n = o.get_size()
                moved += n
                stored.append(k)
                # a re-store of a key already accounted adds no bytes
                accounted = self._sizes.get(k)
                sizes.append(0 if accounted else n)
                self._sizes[k] = (accounted[0] if accounted else n, self._stores_landed)
        if stored:
            self._notify_keys_stored(stored, sizes)
        return L2StoreResult(all(ok), moved)

    def pop_completed_store_tasks(self) -> dict[L2TaskId, L2StoreResult]:
        return self._board.pop_all(STORE)

    # ------------------------------------------------------------ lookup and lock

    def submit_lookup_and_lock_task(self, keys: list[ObjectKey], group_layout_descs: Any = None) -> L2TaskId:
        task_id = self._board.start(LOOKUP)
        if self._closed or not keys:
            self._board.finish(LOOKUP, task_id, Bitmap(len(keys)))
            return task_id
        refs = [ref(self.namespace, k) for k in keys]
        self._launch(LOOKUP, task_id, self._lookup(keys, refs), Bitmap(len(keys)))
        return task_id

    async def _lookup(self, keys: list[ObjectKey], refs: list[ChunkRef]) -> Any:
        with self._lock:
            asked_after = self._stores_landed
        answer = await asyncio.wait_for(self.store.answer_each([r.chunk_id for r in refs]), self._lookup_deadline)
        found = answer if answer is not None else [False] * len(keys)
        bitmap = Bitmap(len(keys))
        locked: list[ObjectKey] = []
        first: list[str] = []
        lost: list[tuple[ObjectKey, int]] = []
        with self._lock:
            if self._closed:
                return bitmap
            for i, (k, r, f) in enumerate(zip(keys, refs, found)):
                if not f:
                    # Stored here, answered absent (a TTL, maxmemory, a DEL, a failover):
                    # LMCache's accounting and its cache events learn of the loss. A failed
                    # check proves nothing; a store that landed since the check was sent wins.
                    accounted = self._sizes.get(k) if answer is not None else None
                    if accounted and accounted[1] <= asked_after:
                        lost.append((k, self._sizes.pop(k)[0]))
                    continue
                bitmap.set(i)
                self._locks[k] += 1
                locked.append(k)
                if self._locks[k] == 1:
                    first.append(r.chunk_id)
        if lost:
            self._notify_keys_deleted([k for k, _ in lost], [n for _, n in lost])
        if first:
            await self._pin(first)
        if locked:
            self._notify_keys_accessed(locked)
        return bitmap

    async def _pin(self, chunk_ids: list[str]) -> None:
        try:
            await self.store.lease(chunk_ids, self.config.lock_lease_s)
        except Exception as e:  # the lock still holds here; only the tier pins are missing
            log.warning("lmcache-valkey: pinning %d locked chunks failed: %s", len(chunk_ids), e)

    def query_lookup_and_lock_result(self, task_id: L2TaskId) -> Any:
        return self._board.pop(LOOKUP, task_id)

    def submit_unlock(self, keys: list[ObjectKey]) -> None:
        """Never fails: the lock state is ours and changes here; the tier pins are released in
        the background (and end by their lease deadline if that release is lost)."""
        last: list[str] = []
        with self._lock:
            for k in keys:
                n = self._locks.get(k, 0)
                if n > 1:
                    self._locks[k] = n - 1
                elif n == 1:
                    del self._locks[k]
                    last.append(ref(self.namespace, k).chunk_id)
            closed = self._closed
        if last and not closed:
            self._spawn(self._release(last))

    async def _release(self, chunk_ids: list[str]) -> None:
        try:
            await self.store.release(chunk_ids)
        except Exception as e:
            log.warning("lmcache-valkey: releasing %d chunk pins failed (their leases expire): %s", len(chunk_ids), e)

    # ----------------------------------------------------------------------- load

    def submit_load_task(self, keys: list[ObjectKey], objects: list[Any]) -> L2TaskId:
        _same_length("submit_load_task", keys, objects)
        task_id = self._board.start(LOAD)
        if self._closed or not keys:
            self._board.finish(LOAD, task_id, Bitmap(len(keys)))
            return task_id
        items = [(ref(self.namespace, k), o.byte_array) for k, o in zip(keys, objects)]
        want = [layout(o) for o in objects]
        self._launch(LOAD, task_id, self._load(keys, objects, items, want), Bitmap(len(keys)))
        return task_id

    async def _load(self, keys: list[ObjectKey], objects: list[Any], items: list[Any], want: list[Any]) -> Any:
        """Bytes land in the L1 objects themselves (RESP reads into them; with fabric the
        server writes into the registered L1 arena). ``load_into`` returns only once no
        transfer can write into a missed object any more (at once over RESP; over fabric
        after the server's reply or the revocation of the link, docs/fabric-buffer-ownership.md):
        LMCache frees the missed objects as soon as it sees the result."""
        n = len(items)
        results = await self.store.load_into(items, accept=lambda i, meta: fits(meta, want[i]))
        bitmap = Bitmap(n)
        hits: list[ObjectKey] = []
        for i, r in enumerate(results):
            if r is None:
                continue
            if r.nbytes == objects[i].get_size():
                bitmap.set(i)
                hits.append(keys[i])
            else:  # a shorter chunk than the L1 object (never a partial hit in MP mode)
                metrics.record_miss("ram", "truncated")
        if hits:
            self._notify_keys_accessed(hits)
        return bitmap

    def query_load_result(self, task_id: L2TaskId) -> Any:
        return self._board.pop(LOAD, task_id)

    # ----------------------------------------------------- eviction, listing, status

    def delete(self, keys: list[ObjectKey]) -> None:
        """Remove chunks from every tier (LMCache's L2 eviction). Locked keys are skipped:
        a lookup promised them to a load."""
        if not keys or self._closed:
            return
        with self._lock:
            doomed = [k for k in keys if self._locks.get(k, 0) == 0]
        if not doomed:
            return
        try:
            self._session.run_sync(self.store.delete([ref(self.namespace, k).chunk_id for k in doomed]),
                                   timeout=self.settings.op_timeout_s * 2 + 1)
        except Exception as e:
            log.warning("lmcache-valkey: delete of %d chunks failed: %s", len(doomed), e)
            return
        with self._lock:
            gone = [(k, self._sizes.pop(k)[0]) for k in doomed if k in self._sizes]
        if gone:
            self._notify_keys_deleted([k for k, _ in gone], [n for _, n in gone])

    def submit_touch(self, keys: list[ObjectKey]) -> None:
        """LMCache used these keys without a load: its L2 eviction sees the access, and our
        tiering counts it for recency and admission."""
        self._notify_keys_accessed(keys)
        if keys and not self._closed:
            self._spawn(self.store.touch([ref(self.namespace, k).chunk_id for k in keys]))

    def list_l2_keys(self, model_name: str | None = None, page_size: int = 500, cursor: str | None = None) -> Any:
        """Keys in Valkey RAM under this adapter's namespace, read from chunk headers (payloads
        are not moved). ``cursor`` is the previous page's ``next_page_token``."""
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size <= 0:
            raise ValueError(f"page_size must be a positive integer, got {page_size!r}")
        with self._lock:
            if cursor is None:
                it: AsyncIterator[str] | None = self.store.iter_ids()
            else:
                it = self._cursors.pop(cursor, None)
                if it is None:
                    raise ValueError(f"unknown or expired cursor {cursor!r}")
        try:
            entries, more = self._session.run_sync(self._page(it, model_name, page_size),
                                                   timeout=self.settings.op_timeout_s * 4 + 1)
        except AuthError as e:  # LMCache answers "listing unavailable" for this
            raise NotImplementedError(f"listing needs SCAN in this worker's ACL user ({e})") from None
        token = None
        if more:
            with self._lock:
                token = f"lmcv-{next(self._cursor_ids)}"
                self._cursors[token] = it
                while len(self._cursors) > _CURSORS_MAX:
                    self._cursors.pop(next(iter(self._cursors)))
        return KeyListPage(entries=tuple(entries), next_page_token=token)

    async def _page(self, it: AsyncIterator[str], model_name: str | None, page_size: int) -> tuple[list[Any], bool]:
        entries: list[Any] = []
        more = True
        while len(entries) < page_size and more:
            ids: list[str] = []
            try:
                while len(ids) < page_size - len(entries):
                    ids.append(await it.__anext__())
            except StopAsyncIteration:
                more = False
            for chunk, h in zip(ids, await self.store.peek_headers(ids)):
                k = None if h is None else object_key(h.meta.key)
                # the header's key string may be cut short: it must name this very chunk
                if k is None or self.namespace.chunk_id(key_string(k)) != chunk:
                    continue
                if model_name is None or k.model_name == model_name:
                    entries.append(KeyEntry(key=k.to_encoded_object_key(), size_bytes=h.payload_len))
        return entries, more

    def report_status(self) -> dict[str, Any]:
        usage = self.get_usage()
        healthy = False
        if not self._closed:
            try:
                healthy = self._session.run_sync(self.store.ping(), timeout=self.settings.lookup_timeout_s * 2 + 1)
            except Exception:
                healthy = False
        with self._lock:
            locked = len(self._locks)
        return {
            "is_healthy": healthy,
            "type": "lmcache-valkey",
            "url": self.settings.url_for_humans,
            "tenant": self.settings.tenant,
            "namespace": self.namespace.digest,
            "transport": self.store.transport_name,
            "tiering": self.config.tiering.mode,
            "locked_keys": locked,
            "running_tasks": self._board.running(),
            "current_size_bytes": usage.total_bytes_used,
            "max_capacity_bytes": usage.total_capacity_bytes,
            "usage_fraction": usage.usage_fraction,
        }

    def get_memory_tags(self) -> Any:
        """Where the bytes live (LMCache >= 0.5.7): storage shared with other hosts."""
        from lmcache.v1.distributed.api import MemoryResidency, MemorySegment, MemoryTags

        return MemoryTags(MemorySegment.STORAGE, MemoryResidency.REMOTE)

    # ---------------------------------------------------------------------- close

    def close(self) -> None:
        """Bounded: releases this adapter's pins, closes the store (transfers cancelled,
        fabric memory deregistered) and the event fds."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            locked = [ref(self.namespace, k).chunk_id for k in self._locks]
            self._locks.clear()
            self._cursors.clear()
        if locked:
            try:
                self._session.run_sync(self.store.release(locked), timeout=2.0)
            except Exception as e:
                log.warning("lmcache-valkey: pins not released at close (their leases expire): %s", e)
        self._session.close(timeout=5.0)
        self._board.close()

    # ------------------------------------------------------------------- plumbing

    def _launch(self, kind: str, task_id: int, coro: Coroutine[Any, Any, Any], failed: Any) -> None:
        """Run ``coro`` on our loop; its result (``failed`` if it raised) is posted once."""

        async def run() -> None:
            result = failed
            started = time.perf_counter()
            try:
                result = await coro
            except asyncio.CancelledError:
                log.info("lmcache-valkey: %s task %d cancelled (closing)", kind, task_id)
            except Exception as e:
                log.warning("lmcache-valkey: %s task %d failed after %.3fs: %s", kind, task_id,
                            time.perf_counter() - started, e)
            finally:
                self._board.finish(kind, task_id, result)

        try:
            asyncio.run_coroutine_threadsafe(run(), self._loop)
        except RuntimeError:  # the loop is gone (closing)
            coro.close()
            self._board.finish(kind, task_id, failed)

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        try:
            asyncio.run_coroutine_threadsafe(coro, self._loop)
        except RuntimeError:
            coro.close()


def _arena(desc: Any, settings: Any) -> tuple[int, int] | None:
    """The L1 arena LMCache's factory describes, registered once for RMA."""
    if desc is None or settings.transport == "tcp":
        if desc is None and settings.transport == "fabric":
            log.warning("lmcache-valkey: transport fabric without an L1 memory descriptor: "
                        "loads cannot land in L1 by RMA")
        return None
    size = getattr(desc, "stable_registration_size", None) or desc.size
    return int(desc.ptr), int(size)


def _same_length(op: str, keys: list[Any], objects: list[Any]) -> None:
    if len(keys) != len(objects):
        raise ValueError(f"{op}: {len(keys)} keys but {len(objects)} objects")
