"""What every engine adapter shares: its namespace and a store on a private loop.

The adapters under ``integrations/`` (LMCache in-process plugin, LMCache MP L2 adapter, and
the vLLM and SGLang tiers) differ in the engine types they translate; they do not differ in
how the namespace fingerprint always carries ``model_revision``, or how the store is opened
on its own I/O loop (docs/private-io-loop.md), given an arena to register for RMA, and
closed within a bound. That lives here, once; their settings come from
:func:`lmcache_valkey.settings.load_settings`.

Never imports: any engine (``lmcache``, ``vllm``, ``sglang``), the integrations.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from typing import Any, Coroutine, Mapping, Sequence, TypeVar

from .config import Settings, check_tenant_secret
from .keys import Namespace, make_namespace
from .loop_thread import LoopThread
from .store import ChunkStore, open_store
from .tiering.settings import TieringSettings

log = logging.getLogger(__name__)

T = TypeVar("T")

# Threads that answer lookups awaited on an engine's loop (contains_prefix_async); a lookup
# takes them for about one round trip, so two keep a burst of concurrent lookups moving.
LOOKUP_THREADS = 2
# How much longer than a lookup's own deadline a thread waits for the store's loop to answer it
# (the store counts a late lookup as a miss itself, within its deadline plus a grace).
LOOP_GRACE_S = 0.5


def namespace_for(settings: Settings, fields: Mapping[str, Any]) -> Namespace:
    """The namespace of a layout: the engine's compatibility ``fields`` plus what every engine
    shares (``model_revision``: adapters, tokenizer, revision the engine does not know).
    Every worker derives its ids from here: a tenant other than ``default`` without its
    secret is refused (:func:`~lmcache_valkey.config.check_tenant_secret`), a ConfigError."""
    check_tenant_secret(settings)
    return make_namespace(
        settings.key_prefix, settings.tenant, {**fields, "revision": settings.model_revision}, settings.namespace,
        secret=settings.tenant_secret,
    )


class StoreSession:
    """A :class:`ChunkStore` opened on a private :class:`LoopThread`; the adapter submits and waits.

    ``arena``: ``(address, length)`` of the engine's host buffer that every transfer uses
    (LMCache's CPU arena, the MP L1 arena, vLLM's primary tier); with the fabric transport
    it is registered once, here, never per transfer.
    """

    def __init__(
        self,
        settings: Settings,
        namespace: Namespace,
        tiering: TieringSettings | None = None,
        *,
        arena: tuple[int, int] | None = None,
        name: str = "lmcache-valkey-io",
    ) -> None:
        self.settings = settings
        self.namespace = namespace
        if namespace.secret is None:
            # (a tenant other than "default" gets here only with require_tenant_secret: false)
            log.log(logging.INFO if namespace.tenant == "default" else logging.WARNING,
                    "lmcache-valkey: chunk ids of tenant %s are derived without a tenant secret: whoever knows "
                    "the tenant's name can compute them (set tenant_secret_file, docs/security.md)", namespace.tenant)
        self.io = LoopThread(name)
        self._lookups: concurrent.futures.ThreadPoolExecutor | None = None  # started on first use
        self._lookups_lock = threading.Lock()
        self._closed = False
        try:
            self.store: ChunkStore = self.io.run_sync(
                open_store(settings, namespace, tiering=tiering), timeout=settings.connect_timeout_s * 3 + 10
            )
            if arena is not None and self.store.transport_name == "fabric":
                self.store.register_memory(*arena)
        except BaseException:
            self.io.stop()
            raise

    @property
    def transport_name(self) -> str:
        return self.store.transport_name

    def run_sync(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        return self.io.run_sync(coro, timeout)

    def contains_prefix(self, chunk_ids: Sequence[str], timeout: float, store: ChunkStore | None = None) -> int:
        """An engine's synchronous prefix lookup: on the calling thread where the transport
        can (no hop to the loop and back), else on the loop, waiting at most ``timeout``.
        ``store``: a view of this session's store for another namespace."""
        store = self.store if store is None else store
        ends = time.monotonic() + timeout
        found = store.contains_prefix_blocking(chunk_ids, timeout)
        if found is None:  # (the loop's path gets what this thread's try left of the deadline)
            left = max(0.0, ends - time.monotonic())
            found = self.io.run_sync(store.contains_prefix(chunk_ids, left), left + LOOP_GRACE_S)
        return found

    async def contains_prefix_async(self, chunk_ids: Sequence[str], timeout: float) -> int:
        """The same lookup awaited on an engine's own event loop (LMCache's
        ``batched_async_contains``), never blocking it and without a hop to the store's loop:
        on that loop itself over the lookup lane's idle plain-TCP connections; else a lookup
        thread of this session does the blocking lookup (and opens them), and the store's
        loop answers what that thread cannot. If the caller gives up, a thread finishes
        within the lookup deadline and its answer is dropped: a lookup holds nothing."""
        # Bounded from the call: from here, the lookup on this loop, then a wait for a free
        # lookup thread (queued behind a paused server's lookups), then that thread's lookup
        # all come out of ``timeout``.
        deadline = time.monotonic() + timeout
        found = await self.store.contains_prefix_on_caller_loop(chunk_ids, timeout)
        if found is not None:
            return found
        with self._lookups_lock:
            if self._closed:
                return 0  # (a closing engine's last lookups: misses, as the store answers)
            if self._lookups is None:
                self._lookups = concurrent.futures.ThreadPoolExecutor(
                    LOOKUP_THREADS, thread_name_prefix=f"{self.io.name}-lookup")
            pool = self._lookups
        started = threading.Event()

        def look_up() -> int:
            started.set()
            left = deadline - time.monotonic()
            if left <= 0:
                return self.store.lookup_abandoned(len(chunk_ids), timeout)
            return self.contains_prefix(chunk_ids, left)

        try:  # (nothing left: wait_for gives up at once, and the count below or look_up's applies)
            return await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(pool, look_up),
                                          deadline - time.monotonic())
        except asyncio.TimeoutError:
            # Never started: it never will (cancelled in the queue), counted here. Started:
            # its thread is within what was left of the deadline and counts its own failure.
            return 0 if started.is_set() else self.store.lookup_abandoned(len(chunk_ids), timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Close the store and stop the loop; returns within about ``timeout`` seconds."""
        try:
            self.io.run_sync(self.store.close(), timeout=timeout)
        except Exception as e:  # a stuck server must not hold the engine's shutdown
            log.warning("lmcache-valkey: store did not close cleanly within %.1fs: %s", timeout, e)
        finally:
            self.io.stop()
            with self._lookups_lock:
                self._closed = True
                pool, self._lookups = self._lookups, None
            if pool is not None:
                pool.shutdown(wait=False)  # (queued lookups still run: a closed store answers them None/misses)


__all__ = ["StoreSession", "namespace_for"]
