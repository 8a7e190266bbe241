"""Compiles the libfabric binding (cffi API mode) on first use and caches the result.

The extension is built against the system's libfabric headers, found under
``$LMCACHE_VALKEY_LIBFABRIC_PREFIX`` or else the first of /opt/amazon/efa and /usr that has
``include/rdma/fabric.h``. It is cached in ``$XDG_CACHE_HOME/lmcache-valkey/`` under a name
keyed by the libfabric version, the prefix, the Python ABI and the shim's source, so a
libfabric upgrade or a second install never loads a stale build (docs/fabric-binding.md).

This module imports cffi and nothing else of ours; it never touches the network.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.machinery
import importlib.util
import os
import re
import shutil
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

PREFIX_ENV = "LMCACHE_VALKEY_LIBFABRIC_PREFIX"
DEFAULT_PREFIXES = ("/opt/amazon/efa", "/usr")
INSTALL_HINT = (
    "install libfabric headers and a C compiler (Debian/Ubuntu: apt-get install build-essential "
    f"libfabric-dev; AWS: the EFA installer under /opt/amazon/efa), or point {PREFIX_ENV} at a prefix "
    "holding include/rdma/fabric.h and lib/libfabric.so"
)

CDEF = """
struct lmcv_ep;
struct fid_mr;
int lmcv_api_version(void);
struct lmcv_ep *lmcv_ep_open(const char *prov, const char *node, int hmem, char *err, size_t errlen);
void lmcv_ep_close(struct lmcv_ep *e);
const char *lmcv_ep_provider(struct lmcv_ep *e);
uint64_t lmcv_ep_mr_mode(struct lmcv_ep *e);
uint64_t lmcv_ep_max_msg(struct lmcv_ep *e);
int lmcv_ep_delivery_complete(struct lmcv_ep *e);
int lmcv_ep_waitable(struct lmcv_ep *e);
int lmcv_ep_addr_is_str(struct lmcv_ep *e);
int lmcv_ep_name(struct lmcv_ep *e, void *buf, size_t *len);
int lmcv_ep_av_insert(struct lmcv_ep *e, const void *addr, uint64_t *out);
int lmcv_mr_reg(struct lmcv_ep *e, void *addr, size_t len, int iface, int device, uint64_t requested_key,
                struct fid_mr **mr, uint64_t *key, void **desc);
int lmcv_mr_close(struct fid_mr *mr);
ssize_t lmcv_ep_write(struct lmcv_ep *e, void *buf, size_t len, void *desc, uint64_t dest, uint64_t raddr,
                      uint64_t key, void *ctx);
ssize_t lmcv_ep_read(struct lmcv_ep *e, void *buf, size_t len, void *desc, uint64_t dest, uint64_t raddr,
                     uint64_t key, void *ctx);
ssize_t lmcv_ep_wait(struct lmcv_ep *e, int timeout_ms, void **ctxs, int *errs, int max);
int lmcv_ep_signal(struct lmcv_ep *e);
const char *lmcv_strerror(int err);

#define FI_MR_LOCAL ...
#define FI_MR_VIRT_ADDR ...
#define FI_MR_ALLOCATED ...
#define FI_MR_PROV_KEY ...
#define FI_MR_ENDPOINT ...
#define FI_MR_HMEM ...
#define FI_EAGAIN ...
#define FI_ENOKEY ...
#define FI_MAJOR_VERSION ...
#define FI_MINOR_VERSION ...
"""


@dataclass(frozen=True)
class Libfabric:
    prefix: Path
    version: str  # "major.minor" from the headers


class BuildError(RuntimeError):
    """The binding cannot be built or loaded; the message says what to install."""


def find_libfabric() -> Libfabric:
    override = os.environ.get(PREFIX_ENV)
    candidates = [override] if override else list(DEFAULT_PREFIXES)
    for cand in candidates:
        header = Path(cand) / "include" / "rdma" / "fabric.h"
        if header.is_file():
            text = header.read_text(errors="replace")
            major = re.search(r"#define\s+FI_MAJOR_VERSION\s+(\d+)", text)
            minor = re.search(r"#define\s+FI_MINOR_VERSION\s+(\d+)", text)
            version = f"{major.group(1)}.{minor.group(1)}" if major and minor else "unknown"
            return Libfabric(Path(cand), version)
    where = override if override else " or ".join(DEFAULT_PREFIXES)
    raise BuildError(f"libfabric headers not found under {where}: {INSTALL_HINT}")


def _source() -> str:
    path = Path(__file__).with_name("_shim.c")
    if not path.is_file():  # a wheel built without package data
        raise BuildError(f"{path} is missing from this install: reinstall lmcache-valkey with its package data")
    return path.read_text()


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lmcache-valkey"


def _module_name(lf: Libfabric, source: str) -> str:
    tag = sysconfig.get_config_var("SOABI") or sys.implementation.cache_tag
    digest = hashlib.sha256("\0".join([source, CDEF, str(lf.prefix), lf.version, tag]).encode()).hexdigest()[:12]
    return f"_lmcv_fabric_{lf.version.replace('.', '_')}_{digest}"


def _check_build_tools() -> None:
    """cffi compiles through setuptools from Python 3.12 on (distutils left the standard
    library); without it cffi's own error suggests nothing a user can act on."""
    if sys.version_info < (3, 12):
        return
    if importlib.util.find_spec("setuptools") is None:
        raise BuildError(
            f"building the libfabric binding needs setuptools on Python {sys.version_info.major}."
            f"{sys.version_info.minor}: {sys.executable} -m pip install 'setuptools>=68' "
            "(lmcache-valkey requires it there; an install with --no-deps skips it)")


def _ffibuilder(lf: Libfabric, name: str, source: str):  # -> cffi.FFI
    import cffi

    ffi = cffi.FFI()
    ffi.cdef(CDEF)
    kwargs: dict = {"libraries": ["fabric"], "extra_compile_args": ["-O2", "-std=gnu11"]}
    if str(lf.prefix) != "/usr":
        inc, libs = [str(lf.prefix / "include")], [str(lf.prefix / "lib"), str(lf.prefix / "lib64")]
        kwargs.update(include_dirs=inc, library_dirs=libs, runtime_library_dirs=libs)
    ffi.set_source(name, source, **kwargs)
    return ffi


def _load_from(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise BuildError(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build_and_load() -> ModuleType:
    """Returns the compiled extension module (with ``ffi`` and ``lib``), building it once."""
    lf = find_libfabric()
    source = _source()
    name = _module_name(lf, source)
    cache = _cache_dir()
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    target = cache / f"{name}{suffix}"
    if not target.exists():
        cache.mkdir(parents=True, exist_ok=True)
        # Several processes (test servers, workers) may start at once: one compiles.
        with open(cache / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not target.exists():
                _check_build_tools()
                with tempfile.TemporaryDirectory(dir=cache) as tmp:
                    try:
                        built = _ffibuilder(lf, name, source).compile(tmpdir=tmp, verbose=False)
                    except Exception as exc:  # cffi raises VerificationError/CompileError/OSError
                        raise BuildError(f"building the libfabric binding failed ({exc}): {INSTALL_HINT}") from exc
                    shutil.move(built, target)
    try:
        return _load_from(target, name)
    except ImportError as exc:
        raise BuildError(f"loading {target} failed ({exc}): {INSTALL_HINT}") from exc
