"""LMCache on vLLM's CPU platform: the KV connector lmcache-valkey gives LMCache, handed out by
LMCache's own factory once the hook is in, and the loud error where LMCache runs without one.

The data path runs against a KV cache laid out as vLLM-CPU lays it out (per layer
``[num_blocks, num_kv_heads, block_size, 2*head_size]``, read as K rows then V rows per block
and head); tests/serving runs it inside real ``vllm serve`` processes.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest
import torch
from lmcache.utils import EngineType
from lmcache.v1 import gpu_connector as lmcache_gpu_connector
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj
from lmcache.v1.metadata import LMCacheMetadata

from lmcache_valkey import metrics
from lmcache_valkey.errors import ConfigError
from lmcache_valkey.integrations.vllm_cpu import hook
from lmcache_valkey.integrations.vllm_cpu.kv_connector import KVLayoutError, VLLMPagedCPUConnector

LAYERS, HEADS, HEAD, BLOCK, BLOCKS, CHUNK = 2, 4, 64, 32, 64, 256


def metadata(dtype=torch.bfloat16) -> LMCacheMetadata:
    return LMCacheMetadata(model_name="tiny", world_size=1, local_world_size=1, worker_id=0,
                           local_worker_id=0, kv_dtype=dtype, kv_shape=(LAYERS, 2, CHUNK, HEADS, HEAD),
                           chunk_size=CHUNK)


def config() -> LMCacheEngineConfig:
    return LMCacheEngineConfig.from_dict({"chunk_size": CHUNK, "local_cpu": True, "max_local_cpu_size": 1})


def vllm_cpu_caches(block_pad: int = 0, dtype=torch.bfloat16) -> list[torch.Tensor]:
    """Per-layer caches with distinct values everywhere; ``block_pad`` pads each block's stride
    (a unified KV pool's view), which the connector must step over, never touch."""
    used = HEADS * BLOCK * 2 * HEAD
    return [torch.randn(BLOCKS, used + block_pad).to(dtype)
            .as_strided((BLOCKS, HEADS, BLOCK, 2 * HEAD), (used + block_pad, BLOCK * 2 * HEAD, 2 * HEAD, 1))
            for _ in range(LAYERS)]


def whole_allocation(cache: torch.Tensor) -> torch.Tensor:
    """Every element of the layer's allocation, padding included."""
    return cache.as_strided((BLOCKS, cache.stride(0)), (cache.stride(0), 1))


def k_and_v(cache: torch.Tensor, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What vLLM-CPU's attention reads for one token: its view [blocks, heads, 2*block, head]."""
    block, offset = divmod(slot, BLOCK)
    rows = cache.as_strided((BLOCKS, HEADS, 2 * BLOCK, HEAD), (cache.stride(0), cache.stride(1), HEAD, 1))
    return rows[block, :, offset], rows[block, :, BLOCK + offset]


def chunk(tokens: int, dtype=torch.bfloat16) -> TensorMemoryObj:
    shape = torch.Size([2, LAYERS, tokens, HEADS * HEAD])
    raw = torch.zeros(shape, dtype=dtype)
    meta = MemoryObjMetadata(shape=shape, dtype=dtype, address=0, phy_size=raw.numel() * raw.element_size(),
                             ref_count=1, fmt=MemoryFormat.KV_2LTD)
    return TensorMemoryObj(raw, meta, None)


@pytest.fixture
def factory():
    """LMCache's factory module with the hook installed, restored afterwards."""
    original = lmcache_gpu_connector.CreateGPUConnector
    original = getattr(original, hook._MARK, original)
    lmcache_gpu_connector.CreateGPUConnector = original
    hook._reported.clear()
    yield lmcache_gpu_connector
    lmcache_gpu_connector.CreateGPUConnector = original
    hook._reported.clear()
    metrics.set_lmcache_degraded("no_kv_connector", False)


def scattered_slots(n: int, seed: int = 0) -> torch.Tensor:
    """``n`` slots in blocks taken out of order, as vLLM's allocator hands them out."""
    blocks = torch.randperm(BLOCKS, generator=torch.Generator().manual_seed(seed))[: -(-n // BLOCK)]
    return (blocks[:, None] * BLOCK + torch.arange(BLOCK)[None, :]).reshape(-1)[:n]


def test_lmcache_factory_hands_out_the_cpu_connector_for_vllm_once_hooked(factory):
    with pytest.raises(RuntimeError, match="No supported cpu connector found"):
        factory.CreateGPUConnector(config(), metadata(), EngineType.VLLM)  # LMCache alone

    hook.patch(factory, "auto")
    connector = factory.CreateGPUConnector(config(), metadata(), EngineType.VLLM)

    assert isinstance(connector, VLLMPagedCPUConnector)
    assert connector.get_shape(100) == torch.Size([2, LAYERS, 100, HEADS * HEAD])
    assert hook.patch(factory, "auto")  # idempotent: not wrapped twice
    assert getattr(factory.CreateGPUConnector, hook._MARK) is not factory.CreateGPUConnector


@pytest.mark.parametrize("block_pad", [0, 3 * HEAD])
def test_store_then_load_moves_every_token_of_every_layer_to_where_vllm_reads_it(factory, block_pad):
    hook.patch(factory, "auto")
    connector = factory.CreateGPUConnector(config(), metadata(), EngineType.VLLM)
    source = vllm_cpu_caches(block_pad)
    slots = scattered_slots(CHUNK + 40)
    chunks = [chunk(CHUNK), chunk(40)]

    connector.batched_from_gpu(chunks, [0, CHUNK], [CHUNK, CHUNK + 40], kvcaches=source, slot_mapping=slots)

    for i, slot in enumerate(slots.tolist()):
        obj, t = (chunks[0], i) if i < CHUNK else (chunks[1], i - CHUNK)
        for layer in range(LAYERS):
            k, v = k_and_v(source[layer], slot)
            assert torch.equal(obj.tensor[0, layer, t].view(HEADS, HEAD), k)
            assert torch.equal(obj.tensor[1, layer, t].view(HEADS, HEAD), v)

    target = vllm_cpu_caches(block_pad)
    before = [whole_allocation(t).clone() for t in target]
    other = scattered_slots(CHUNK + 40, seed=1)  # another server's blocks for the same tokens
    connector.batched_to_gpu(chunks, [0, CHUNK], [CHUNK, CHUNK + 40], kvcaches=target, slot_mapping=other)

    for src_slot, dst_slot in zip(slots.tolist(), other.tolist()):
        for layer in range(LAYERS):
            assert all(torch.equal(a, b) for a, b in zip(k_and_v(target[layer], dst_slot),
                                                         k_and_v(source[layer], src_slot)))
    touched = torch.zeros(BLOCKS, dtype=torch.bool)
    touched[torch.div(other, BLOCK, rounding_mode="floor")] = True
    used = HEADS * BLOCK * 2 * HEAD
    for layer in range(LAYERS):  # blocks nobody loaded into are untouched, and so is the padding
        after = whole_allocation(target[layer])
        assert torch.equal(after[~touched], before[layer][~touched])
        assert torch.equal(after[:, used:], before[layer][:, used:])


def test_load_skips_the_tokens_vllm_already_holds(factory):
    connector = VLLMPagedCPUConnector.from_metadata(metadata())
    caches = vllm_cpu_caches()
    slots = scattered_slots(CHUNK)
    obj = chunk(CHUNK)
    obj.tensor.fill_(1.0)
    kept = [t.clone() for t in caches]

    connector.to_gpu(obj, 0, CHUNK, kvcaches=caches, slot_mapping=slots, vllm_cached_tokens=100)

    for i, slot in enumerate(slots.tolist()):
        k, _ = k_and_v(caches[0], slot)
        k_kept, _ = k_and_v(kept[0], slot)
        assert torch.equal(k, k_kept) if i < 100 else bool((k == 1.0).all())


def test_caches_it_cannot_read_are_refused_with_what_it_got(factory):
    connector = VLLMPagedCPUConnector.from_metadata(metadata())
    slots = scattered_slots(CHUNK)
    nhd = [torch.zeros(BLOCKS, BLOCK, HEADS, 2 * HEAD, dtype=torch.bfloat16) for _ in range(LAYERS)]
    with pytest.raises(KVLayoutError, match=r"shape \(64, 32, 4, 128\)"):
        connector.from_gpu(chunk(CHUNK), 0, CHUNK, kvcaches=nhd, slot_mapping=slots)
    with pytest.raises(KVLayoutError, match="same KV dtype"):
        connector.from_gpu(chunk(CHUNK), 0, CHUNK, kvcaches=vllm_cpu_caches(dtype=torch.float16),
                           slot_mapping=slots)
    with pytest.raises(KVLayoutError, match="does not map every token"):
        connector.from_gpu(chunk(CHUNK), 0, CHUNK, kvcaches=vllm_cpu_caches(),
                           slot_mapping=torch.full((CHUNK,), -1))
    with pytest.raises(KVLayoutError, match="LMCache's chunk has shape"):
        connector.from_gpu(chunk(10), 0, CHUNK, kvcaches=vllm_cpu_caches(), slot_mapping=slots)


def test_lmcache_without_a_kv_connector_is_one_error_and_a_metric(factory, caplog):
    hook.patch(factory, "off")  # the user turned ours off: LMCache's own behaviour, reported
    caplog.set_level(logging.ERROR, logger=hook.__name__)

    for _ in range(3):
        with pytest.raises(RuntimeError, match="No supported cpu connector found"):
            factory.CreateGPUConnector(config(), metadata(), EngineType.VLLM)

    errors = [r for r in caplog.records if r.name == hook.__name__]
    assert len(errors) == 1 and errors[0].levelno == logging.ERROR
    assert "recompute" in errors[0].getMessage() and hook.MODE_ENV in errors[0].getMessage()
    assert metrics.sample_sum(metrics.render_latest().decode(), "lmcache_valkey_lmcache_degraded",
                              {"reason": "no_kv_connector"}) == 1


def test_a_factory_of_another_shape_is_left_alone_and_reported(factory, caplog):
    class Changed:
        __name__ = "lmcache.v1.gpu_connector"
        GPUConnectorInterface = lmcache_gpu_connector.GPUConnectorInterface

        @staticmethod
        def CreateGPUConnector(config, metadata, engine, layout_hints=None, device=None):  # noqa: N802
            raise RuntimeError("new LMCache")

    caplog.set_level(logging.ERROR, logger=hook.__name__)
    assert hook.patch(Changed, "auto") is False
    assert not hasattr(Changed.CreateGPUConnector, hook._MARK)
    assert any("takes" in r.getMessage() and "recompute" in r.getMessage() for r in caplog.records)


def test_a_bad_mode_stops_start_up_naming_the_variable():
    with pytest.raises(ConfigError, match=hook.MODE_ENV):
        hook.mode_from_env({hook.MODE_ENV: "yes"})
    assert hook.mode_from_env({}) == "auto" and hook.mode_from_env({hook.MODE_ENV: " OFF "}) == "off"


def test_vllm_plugin_hook_waits_for_lmcache_to_be_imported_by_its_user():
    """vLLM calls register() in every process before LMCache is imported; importing LMCache
    there breaks vLLM-CPU's worker start (its kernel scan). The hook lands on first import."""
    script = textwrap.dedent("""
        import sys
        from importlib.metadata import entry_points
        (plugin,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "lmcache_valkey"]
        plugin.load()()
        assert not [m for m in sys.modules if m == "lmcache" or m.startswith("lmcache.")], "imported LMCache"
        from lmcache.v1.gpu_connector import CreateGPUConnector
        from lmcache.utils import EngineType
        from lmcache.v1.config import LMCacheEngineConfig
        from lmcache.v1.metadata import LMCacheMetadata
        import torch
        md = LMCacheMetadata(model_name="m", world_size=1, local_world_size=1, worker_id=0, local_worker_id=0,
                             kv_dtype=torch.bfloat16, kv_shape=(2, 2, 256, 4, 64), chunk_size=256)
        c = CreateGPUConnector(LMCacheEngineConfig.from_dict({"chunk_size": 256}), md, EngineType.VLLM)
        print(type(c).__name__)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "VLLMPagedCPUConnector"


def test_a_model_the_connector_cannot_read_is_reported_not_silently_recomputed(factory, caplog):
    hook.patch(factory, "auto")
    caplog.set_level(logging.ERROR, logger=hook.__name__)
    mla = metadata()
    mla.use_mla = True

    with pytest.raises(KVLayoutError, match="MLA"):
        factory.CreateGPUConnector(config(), mla, EngineType.VLLM)

    assert any("refused this model" in r.getMessage() for r in caplog.records)
    assert metrics.sample_sum(metrics.render_latest().decode(), "lmcache_valkey_lmcache_degraded",
                              {"reason": "no_kv_connector"}) == 1
