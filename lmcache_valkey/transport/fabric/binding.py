"""The one module that imports the compiled libfabric extension (cffi).

``load()`` builds the extension on first use (see ``_build``) and maps every failure to
``FabricUnavailable`` with what to install, so importing this package never requires
libfabric: only asking for the fabric data path does.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from typing import Any, Iterator

from lmcache_valkey.errors import FabricUnavailable

from . import _build

_lock = threading.Lock()


@contextlib.contextmanager
def _host_signal_handlers_kept() -> Iterator[None]:
    """Put back the process's signal handlers after libfabric is loaded.

    libfabric's shm provider installs SIGINT/SIGTERM (and other) handlers from a library
    constructor, replacing the host's: in a vLLM worker, Ctrl-C or SIGTERM would then end
    the process with exit(1) instead of reaching Python's handlers. The handlers are saved
    and restored at the C level (``signal.signal`` would need the main thread).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    saved = {}
    for sig in range(1, 32):
        sa = _SigAction()
        if libc.sigaction(sig, None, ctypes.byref(sa)) == 0:
            saved[sig] = sa
    try:
        yield
    finally:
        for sig, sa in saved.items():
            now = _SigAction()
            if libc.sigaction(sig, None, ctypes.byref(now)) == 0 and now.handler != sa.handler:
                libc.sigaction(sig, ctypes.byref(sa), None)


class _SigAction(ctypes.Structure):
    """glibc's ``struct sigaction`` (same layout on x86-64 and aarch64)."""

    _fields_ = [
        ("handler", ctypes.c_void_p),
        ("mask", ctypes.c_ulong * (1024 // (8 * ctypes.sizeof(ctypes.c_ulong)))),
        ("flags", ctypes.c_int),
        ("restorer", ctypes.c_void_p),
    ]
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
                with _host_signal_handlers_kept():
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
