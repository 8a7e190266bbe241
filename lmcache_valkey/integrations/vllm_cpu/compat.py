"""Where LMCache keeps what the CPU KV connector needs, by release (one shim, STYLE 16).

0.5.6 has its in-process code under ``lmcache.v1``; the 0.5.7 line moved it under
``lmcache.inprocess.v1`` (and keeps ``lmcache.v1.gpu_connector`` as a shared-kernels package
with no factory). The hook patches the factory module that LMCache's own vLLM service
factory imports ``CreateGPUConnector`` from, at call time.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

# (factory module, interface module) per layout, newest first.
_LAYOUTS = (
    ("lmcache.inprocess.v1.gpu_connector", "lmcache.inprocess.v1.gpu_connector.gpu_connectors"),
    ("lmcache.v1.gpu_connector", "lmcache.v1.gpu_connector.gpu_connectors"),
)


def _first_with_factory() -> tuple[ModuleType, ModuleType]:
    if importlib.util.find_spec("lmcache") is None:  # no LMCache at all: a plain missing module
        raise ModuleNotFoundError("No module named 'lmcache'", name="lmcache")
    errors = []
    for factory_name, interface_name in _LAYOUTS:
        try:
            factory = importlib.import_module(factory_name)
        except ImportError as e:
            errors.append(f"{factory_name}: {e}")
            continue
        if hasattr(factory, "CreateGPUConnector"):
            return factory, importlib.import_module(interface_name)
        errors.append(f"{factory_name}: no CreateGPUConnector")
    raise ImportError("LMCache's KV connector factory is in none of the places known to "
                      "lmcache-valkey (" + "; ".join(errors) + ")")


FACTORY_MODULE, _INTERFACES = _first_with_factory()
GPUConnectorInterface = _INTERFACES.GPUConnectorInterface

from lmcache.utils import EngineType  # noqa: E402  (after the layout is known)
from lmcache.v1.memory_management import MemoryFormat  # noqa: E402

try:
    from lmcache import __version__ as LMCACHE_VERSION  # noqa: E402
except ImportError:  # pragma: no cover - every release we support has it
    LMCACHE_VERSION = "unknown"


def device_type() -> str:
    """The torch device LMCache runs its engine on ("cuda", "xpu", ..., "cpu")."""
    import lmcache

    return str(getattr(lmcache, "torch_device_type", "unknown"))


__all__ = ["EngineType", "FACTORY_MODULE", "GPUConnectorInterface", "LMCACHE_VERSION", "MemoryFormat",
           "device_type"]
