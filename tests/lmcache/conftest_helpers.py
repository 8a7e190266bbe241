"""LMCache's own CPU storage stack around this plugin, on real Valkey servers."""

from __future__ import annotations

from typing import Any, Callable, Iterator

import pytest
import torch

from lmcache_valkey import metrics
from lmcache_valkey.integrations.lmcache.stack import Layout, Stack, build_stack

SMALL = Layout(model="test-model", num_layers=4, num_kv_heads=2, head_dim=64, chunk_size=16, dtype=torch.bfloat16)


@pytest.fixture
def make_stack() -> Iterator[Callable[..., Stack]]:
    stacks: list[Stack] = []

    def make(settings: dict[str, Any], layout: Layout = SMALL, **kw: Any) -> Stack:
        s = build_stack(layout, plugin_settings=settings, **kw)
        stacks.append(s)
        return s

    yield make
    for s in stacks:
        s.close()


def put_and_wait(stack: Stack, keys: list[Any], objs: list[Any], timeout: float = 30.0) -> None:
    stack.put_and_wait(keys, objs, timeout)


def allocated_bytes(stack: Stack) -> int:
    """Bytes currently allocated in LMCache's CPU arena."""
    alloc = stack.local_cpu.memory_allocator
    for name in ("pin_allocator", "allocator", "cpu_allocator"):
        inner = getattr(alloc, name, None)
        if inner is not None and hasattr(inner, "total_allocated_size"):
            return int(inner.total_allocated_size)
    return int(alloc.total_allocated_size)


def filled(stack: Stack, seed: int) -> Any:
    """A MemoryObj whose bytes are a function of ``seed``."""
    obj = stack.allocate()
    g = torch.Generator().manual_seed(seed)
    raw = obj.tensor.view(torch.uint8).view(-1)
    raw.copy_(torch.randint(0, 256, raw.shape, generator=g, dtype=torch.uint8))
    return obj


def payload(obj: Any) -> bytes:
    return bytes(obj.byte_array)


def miss_count(cause: str) -> float:
    """Chunks missed in RAM for ``cause`` so far (``lmcache_valkey_misses_total``)."""
    prefix = f'lmcache_valkey_misses_total{{cause="{cause}",tier="ram"}} '
    for line in metrics.render_latest().decode().splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix):])
    return 0.0
