"""Build LMCache's own CPU storage stack around a remote connector.

Used by the demo, the benchmarks and the tests, so that all of them exercise the
code path a serving engine uses: ``CreateStorageBackends`` → ``RemoteBackend`` →
connector. Works for this plugin and for LMCache's built-in URLs alike.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch
from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.storage_backend import CreateStorageBackends

PLUGIN = "valkey"
ADAPTER = {
    f"remote_storage_plugin.{PLUGIN}.module_path": "lmcache_valkey.integrations.lmcache.adapter",
    f"remote_storage_plugin.{PLUGIN}.class_name": "ValkeyConnectorAdapter",
}


@dataclass(frozen=True)
class Layout:
    """A model's KV layout as LMCache sees it."""

    model: str = "demo-model"
    num_layers: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    chunk_size: int = 32
    dtype: torch.dtype = torch.bfloat16
    world_size: int = 1
    worker_id: int = 0

    @property
    def kv_shape(self) -> tuple[int, int, int, int, int]:
        return (self.num_layers, 2, self.chunk_size, self.num_kv_heads, self.head_dim)

    @property
    def chunk_bytes(self) -> int:
        return 2 * self.num_layers * self.chunk_size * self.num_kv_heads * self.head_dim * self.dtype.itemsize

    def key(self, chunk_hash: int) -> CacheEngineKey:
        return CacheEngineKey(self.model, self.world_size, self.worker_id, chunk_hash, self.dtype)


@dataclass
class Stack:
    config: LMCacheEngineConfig
    metadata: LMCacheMetadata
    layout: Layout
    loop: asyncio.AbstractEventLoop
    backends: Any
    _thread: threading.Thread = field(repr=False, default=None)  # type: ignore[assignment]

    @property
    def remote(self) -> Any:
        return next(b for name, b in self.backends.items() if name.startswith("RemoteBackend"))

    @property
    def local_cpu(self) -> Any:
        return self.backends["LocalCPUBackend"]

    @property
    def connector(self) -> Any:
        """The connector under LMCache's instrumentation wrapper (None if it failed to start)."""
        conn = self.remote.connection
        return None if conn is None else conn.getWrappedConnector()

    def allocate(self, fill: int | None = None) -> Any:
        obj = self.local_cpu.allocate(
            self.metadata.get_shapes(), self.metadata.get_dtypes(), self.connector_fmt()
        )
        if obj is None:
            raise RuntimeError("LMCache's local CPU arena is full")
        if fill is not None:
            obj.tensor.view(torch.uint8).fill_(fill % 256)
        return obj

    def put_and_wait(self, keys: list[Any], objs: list[Any], timeout: float = 60.0) -> None:
        """Batched put through LMCache's RemoteBackend; returns once every key's write completed."""
        done = threading.Semaphore(0)
        self.remote.batched_submit_put_task(keys, objs, on_complete_callback=lambda _k: done.release())
        end = time.monotonic() + timeout
        for _ in keys:
            if not done.acquire(timeout=max(0.0, end - time.monotonic())):
                raise TimeoutError(f"puts not completed within {timeout}s")

    def connector_fmt(self) -> Any:
        from lmcache.v1.memory_management import MemoryFormat

        return MemoryFormat.KV_MLA_FMT if self.metadata.use_mla else MemoryFormat.KV_2LTD

    def close(self) -> None:
        for b in self.backends.values():
            try:
                b.close()
            except Exception:
                pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        if self._thread is not None:
            self._thread.join(5)


def plugin_extra_config(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``extra_config`` entries for this plugin, from plain setting names."""
    return {**ADAPTER, **{f"remote_storage_plugin.{PLUGIN}.{k}": v for k, v in settings.items()}}


def build_stack(
    layout: Layout,
    *,
    plugin_settings: Mapping[str, Any] | None = None,
    remote_url: str | None = None,
    cpu_gb: float = 1.0,
    blocking_timeout_secs: int = 10,
    extra: Mapping[str, Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Stack:
    """This plugin (``plugin_settings``) or a built-in connector (``remote_url``)."""
    cfg: dict[str, Any] = {
        "chunk_size": layout.chunk_size,
        "local_cpu": True,
        "max_local_cpu_size": cpu_gb,
        "remote_serde": "naive",
        "blocking_timeout_secs": blocking_timeout_secs,
        "extra_config": dict(extra or {}),
    }
    cfg.update(overrides or {})
    if plugin_settings is not None:
        cfg["remote_storage_plugins"] = [PLUGIN]
        cfg["extra_config"].update(plugin_extra_config(plugin_settings))
    else:
        cfg["remote_url"] = remote_url
    config = LMCacheEngineConfig.from_dict(cfg)
    metadata = LMCacheMetadata(
        model_name=layout.model,
        world_size=layout.world_size,
        local_world_size=layout.world_size,
        worker_id=layout.worker_id,
        local_worker_id=layout.worker_id,
        kv_dtype=layout.dtype,
        kv_shape=layout.kv_shape,
        chunk_size=layout.chunk_size,
    )
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="lmcache-loop", daemon=True)
    thread.start()
    backends = CreateStorageBackends(config, metadata, loop, dst_device="cpu")
    return Stack(config, metadata, layout, loop, backends, thread)
