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


def load() -> tuple[Any, Any]:
    """Returns ``(ffi, lib)`` of the libfabric binding or raises FabricUnavailable."""
    global _loaded
    with _lock:
        if _loaded is None:
            try:
                mod = _build.build_and_load()
            except _build.BuildError as exc:
                raise FabricUnavailable(str(exc)) from exc
            except ImportError as exc:  # cffi itself missing
                raise FabricUnavailable(f"cffi is not installed ({exc}): pip install cffi") from exc
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
