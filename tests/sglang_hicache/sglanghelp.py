"""Real SGLang 0.5.23 objects on CPU for the backend tests: device and host KV pools
(SGLang's own classes, as its cache controller builds them), storage configs, and our
backend loaded the way SGLang loads a ``dynamic`` backend."""

from __future__ import annotations

import warnings
from typing import Any

warnings.filterwarnings("ignore", message="Only CUDA", category=UserWarning)

import torch  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402

LAYOUTS = ("layer_first", "page_first", "page_first_direct")
BACKEND = {
    "backend_name": "valkey",
    "module_path": "lmcache_valkey.integrations.sglang.backend",
    "class_name": "ValkeyHiCacheStorage",
    "interface_v1": 1,
}


def make_pool(kind: str = "mha", layout: str = "page_first", *, page_size: int = 4, layers: int = 3,
              heads: int = 2, head_dim: int = 16, dtype: torch.dtype = torch.bfloat16, tokens: int = 128) -> Any:
    """SGLang's host KV pool over a device pool on CPU (host capacity = 2 x device)."""
    if kind == "mha":
        dev = MHATokenToKVPool(tokens, page_size, dtype, heads, head_dim, layers, "cpu", False,
                               start_layer=0, end_layer=layers)
        return MHATokenToKVPoolHost(dev.get_device_pool_infos()[0].buffer_info, 2.0, 0, page_size, layout,
                                    pin_memory=False, device="cpu", device_capacity_tokens=dev.size,
                                    start_layer=0, end_layer=layers)
    dev = MLATokenToKVPool(tokens, page_size, dtype, 4 * head_dim, head_dim, layers, "cpu", False,
                           start_layer=0, end_layer=layers)
    return MLATokenToKVPoolHost(dev.get_device_pool_infos()[0].buffer_info, 2.0, 0, page_size, layout,
                                pin_memory=False, device="cpu", device_capacity_tokens=dev.size,
                                start_layer=0, end_layer=layers, target_layer_num=layers)


def make_config(*, mla: bool = False, tp_rank: int = 0, tp_size: int = 1, pp_rank: int = 0, pp_size: int = 1,
                model: str | None = "test/model", metrics: bool = False, layout: str = "page_first",
                extra: dict | None = None) -> HiCacheStorageConfig:
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=pp_rank, pp_size=pp_size, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=mla, enable_storage_metrics=metrics, is_page_first_layout=layout == "page_first",
        model_name=model, extra_config=extra)


def make_backend(url: str, *, pool: Any = None, config: HiCacheStorageConfig | None = None,
                 register: bool = True, **extra: Any) -> Any:
    """Our backend as SGLang's cache controller makes it: StorageBackendFactory with the
    ``dynamic`` backend, then ``register_mem_pool_host``."""
    cfg = {**BACKEND, "url": url, "op_timeout_s": 5, "lookup_timeout_s": 2, "connect_timeout_s": 2, **extra}
    if config is None:
        config = make_config(mla=pool is not None and isinstance(pool, MLATokenToKVPoolHost),
                             layout=getattr(pool, "layout", "page_first"))
    config.extra_config = cfg
    backend = StorageBackendFactory.create_backend("dynamic", config, pool)
    if register and pool is not None:
        backend.register_mem_pool_host(pool)
    return backend


def fill_pages(pool: Any, starts: list[int], seed: int) -> list[bytes]:
    """Random bytes into each page (through SGLang's own set_from_flat_data_page); the pages' flat bytes."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for s in starts:
        page = pool.get_dummy_flat_data_page()
        page.view(torch.uint8).copy_(torch.randint(0, 256, (page.numel() * page.element_size(),), generator=g,
                                                   dtype=torch.uint8))
        pool.set_from_flat_data_page(s, page)
        out.append(page_bytes(pool, s))
    return out


def page_bytes(pool: Any, start: int) -> bytes:
    """A page's bytes as SGLang's plain API stores them (get_data_page, flat)."""
    return pool.get_data_page(start, flat=True).contiguous().view(torch.uint8).numpy().tobytes()


def zero_pages(pool: Any, starts: list[int]) -> None:
    for s in starts:
        pool.set_from_flat_data_page(s, torch.zeros_like(pool.get_dummy_flat_data_page()))


def indices(pool: Any, starts: list[int]) -> torch.Tensor:
    """host_indices as SGLang's controller passes them: every slot of every page."""
    ps = pool.page_size
    return torch.cat([torch.arange(s, s + ps, dtype=torch.int64) for s in starts])


def keys(n: int, tag: str = "k") -> list[str]:
    return [f"{tag}-{i:04d}-" + "ab" * 30 for i in range(n)]
