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

import logging
from typing import Any, Coroutine, Mapping, TypeVar

from .config import Settings
from .keys import Namespace, make_namespace
from .loop_thread import LoopThread
from .store import ChunkStore, open_store
from .tiering.settings import TieringSettings

log = logging.getLogger(__name__)

T = TypeVar("T")


def namespace_for(settings: Settings, fields: Mapping[str, Any]) -> Namespace:
    """The namespace of a layout: the engine's compatibility ``fields`` plus what every engine
    shares (``model_revision``: adapters, tokenizer, revision the engine does not know)."""
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
            log.info("lmcache-valkey: chunk ids of tenant %s are derived without a tenant secret: whoever knows "
                     "the tenant's name can compute them (set tenant_secret, docs/security.md)", namespace.tenant)
        self.io = LoopThread(name)
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

    def close(self, timeout: float = 5.0) -> None:
        """Close the store and stop the loop; returns within about ``timeout`` seconds."""
        try:
            self.io.run_sync(self.store.close(), timeout=timeout)
        except Exception as e:  # a stuck server must not hold the engine's shutdown
            log.warning("lmcache-valkey: store did not close cleanly within %.1fs: %s", timeout, e)
        finally:
            self.io.stop()


__all__ = ["StoreSession", "namespace_for"]
