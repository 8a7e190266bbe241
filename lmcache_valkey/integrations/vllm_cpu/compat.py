"""Where LMCache keeps what the CPU KV connector needs, by release (one shim, STYLE 16).

0.5.6 has its in-process code under ``lmcache.v1``; the 0.5.7 line moved it under
``lmcache.inprocess.v1`` (and keeps ``lmcache.v1.gpu_connector`` as a shared-kernels package
with no factory). The hook patches the factory module that LMCache's own vLLM service
factory imports ``CreateGPUConnector`` from, at call time.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# (factory module, interface module) per layout, newest first.
_LAYOUTS = (
    ("lmcache.inprocess.v1.gpu_connector", "lmcache.inprocess.v1.gpu_connector.gpu_connectors"),
    ("lmcache.v1.gpu_connector", "lmcache.v1.gpu_connector.gpu_connectors"),
)


def _first_with_factory() -> tuple[ModuleType, ModuleType]:
    errors, absent = [], True
    for factory_name, interface_name in _LAYOUTS:
        try:
            factory = importlib.import_module(factory_name)
        except ImportError as e:
            absent = absent and isinstance(e, ModuleNotFoundError) and (e.name or "").startswith("lmcache")
            errors.append(f"{factory_name}: {e}")
            continue
        absent = False
        if hasattr(factory, "CreateGPUConnector"):
            return factory, importlib.import_module(interface_name)
        errors.append(f"{factory_name}: no CreateGPUConnector")
    why = ("LMCache's KV connector factory is in none of the places known to lmcache-valkey ("
           + "; ".join(errors) + ")")
    if absent:  # no LMCache here (or none with in-process code): a plain missing module
        raise ModuleNotFoundError(why, name="lmcache")
    raise ImportError(why)


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
