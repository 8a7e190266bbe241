"""SGLang's own HiCacheController (the cache controller of a running SGLang server) on CPU,
with our backend attached as SGLang attaches it from ``--hicache-storage-backend dynamic``.
Tests play the radix tree's part: they hand the controller host pages to back up and take
its prefetch hits, and the controller's own storage threads call the backend."""

from __future__ import annotations

import os
import queue
import threading
import time
from typing import Any

import torch
from sglang.srt.managers.cache_controller import HiCacheController
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.utils import get_storage_hash_str
from sglang.srt.runtime_context import get_parallel

from support.servers import free_port

_group: Any = None


def single_rank_group() -> Any:
    """A one-process TP group (gloo), and the runtime context of TP/PP rank 0 of 1."""
    global _group
    if _group is None:
        if not torch.distributed.is_initialized():
            os.environ["MASTER_ADDR"] = "127.0.0.1"
            os.environ["MASTER_PORT"] = str(free_port())
            torch.distributed.init_process_group("gloo", rank=0, world_size=1)
        _group = torch.distributed.new_group([0], backend="gloo")
        get_parallel().override_permanently(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_dcp_size=1,
                                            attn_dcp_rank=0)
    return _group


class Server:
    """The storage side of one SGLang server: device pool, host pool, allocator, controller."""

    def __init__(self, extra_config: dict, *, page_size: int = 4, layers: int = 3, layout: str = "page_first",
                 tokens: int = 256) -> None:
        self.page_size = page_size
        dev = MHATokenToKVPool(tokens, page_size, torch.bfloat16, 2, 16, layers, "cpu", False,
                               start_layer=0, end_layer=layers)
        self.host = MHATokenToKVPoolHost(dev.get_device_pool_infos()[0].buffer_info, 2.0, 0, page_size, layout,
                                         pin_memory=False, device="cpu", device_capacity_tokens=dev.size,
                                         start_layer=0, end_layer=layers)
        alloc = PagedTokenToKVPoolAllocator(tokens, page_size, torch.bfloat16, "cpu", dev, False)
        self.controller = HiCacheController(
            alloc, self.host, page_size, single_rank_group(), threading.Event(), io_backend="direct",
            write_policy="write_through", storage_backend="dynamic", model_name="test/model",
            storage_backend_extra_config=dict(extra_config))

    @property
    def backend(self) -> Any:
        return self.controller.storage_backend

    def hashes(self, tokens: list[int]) -> list[str]:
        return get_storage_hash_str(tokens, None, page_size=self.page_size)

    def back_up(self, tokens: list[int], seed: int, timeout: float = 60.0, *, stored: bool = True) -> list[bytes]:
        """Host pages holding ``tokens``' KV (random bytes), backed up by the controller's backup
        thread as after a write-through; returns the pages' bytes once it acknowledged them
        (all stored, or with ``stored=False`` none)."""
        host_indices = self.host.alloc(len(tokens))
        g = torch.Generator().manual_seed(seed)
        pages = []
        for p in range(len(tokens) // self.page_size):
            start = int(host_indices[p * self.page_size])
            page = self.host.get_dummy_flat_data_page()
            page.view(torch.uint8).copy_(torch.randint(0, 256, (page.numel() * page.element_size(),),
                                                       generator=g, dtype=torch.uint8))
            self.host.set_from_flat_data_page(start, page)
            pages.append(self.host.get_data_page(start, flat=True).view(torch.uint8).numpy().tobytes())
        op_id = self.controller.write_storage(host_indices, tokens, hash_value=self.hashes(tokens))
        deadline = time.monotonic() + timeout
        while True:
            op = self.controller.ack_backup_queue.get(timeout=max(0.0, deadline - time.monotonic()))
            if op.id == op_id:
                want = len(tokens) if stored else 0
                assert op.completed_tokens == want, f"backed up {op.completed_tokens} of {len(tokens)} tokens"
                return pages

    def fetch(self, tokens: list[int], timeout: float = 60.0) -> list[bytes]:
        """A prefetch as the scheduler runs it: the controller's prefetch thread asks the backend
        how many pages it holds; host slots are taken for them; its I/O thread loads them.
        Returns the bytes of each page loaded (the consecutive prefix the controller reports)."""
        c = self.controller
        op = c.prefetch(f"req-{time.monotonic_ns()}", tokens)
        hit = c.prefetch_hit_queue.get(timeout=timeout)
        assert hit is op
        if op.storage_hit_count == 0:
            return []
        op.host_indices = self.host.alloc(op.storage_hit_count)
        c.prefetch_buffer.put(op)
        completed = 0
        deadline = time.monotonic() + timeout
        while True:
            try:
                ack = c.ack_prefetch_queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError("the controller did not finish the prefetch") from None
            if ack.completed_tokens is not None:
                completed = max(completed, ack.completed_tokens)
            if ack.completed_req:
                break
        pages = completed // self.page_size
        return [self.host.get_data_page(int(op.host_indices[p * self.page_size]), flat=True)
                .view(torch.uint8).numpy().tobytes() for p in range(pages)]

    def close(self) -> None:
        self.controller.detach_storage_backend()
