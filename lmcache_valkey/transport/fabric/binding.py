"""The one module that imports the compiled libfabric extension (cffi).

``load()`` builds the extension on first use (see ``_build``) and maps every failure to
``FabricUnavailable`` with what to install, so importing this package never requires
libfabric: only asking for the fabric data path does.
"""

from __future__ import annotations

import threading
from typing import Any

from lmcache_valkey.errors import FabricUnavailable

from . import _build

_lock = threading.Lock()
_loaded: tuple[Any, Any] | None = None
_failed: str | None = None  # remembered: ``transport: auto`` must not recompile per store


def load() -> tuple[Any, Any]:
    """Returns ``(ffi, lib)`` of the libfabric binding or raises FabricUnavailable."""
    global _loaded, _failed
    with _lock:
        if _loaded is None:
            if _failed is not None:
                raise FabricUnavailable(_failed)
            try:
                mod = _build.build_and_load()
            except _build.BuildError as exc:
                _failed = str(exc)
                raise FabricUnavailable(_failed) from exc
            except ImportError as exc:  # cffi itself missing
                _failed = f"cffi is not installed ({exc}): pip install cffi"
                raise FabricUnavailable(_failed) from exc
            _loaded = (mod.ffi, mod.lib)
        return _loaded


def available() -> bool:
    """True when the binding builds and loads here (cheap after the first call)."""
    try:
        load()
    except FabricUnavailable:
        return False
    return True


def libfabric_version() -> str:
    ffi, lib = load()
    return f"{lib.FI_MAJOR_VERSION}.{lib.FI_MINOR_VERSION}"
