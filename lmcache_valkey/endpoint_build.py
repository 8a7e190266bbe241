"""``lmcache-valkey endpoint build``: compile the reference Valkey module from the C sources
this package ships, for users who installed it with pip (no repository checkout).

The sources (``endpoint/`` of the repository: Makefile, ``src/``, ``include/``) travel in the
wheel as ``lmcache_valkey/_endpoint/`` (setup.py copies them at build time); from a checkout
the repository's ``endpoint/`` is used. The build runs the shipped Makefile in a scratch copy
with the libfabric prefix the fabric binding uses (``LMCACHE_VALKEY_LIBFABRIC_PREFIX``, else
/opt/amazon/efa, else /usr) and copies ``lmcv_blob.so`` to ``--out``. Imports only the standard
library and this package's libfabric header finder.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Callable

from .errors import LmcacheValkeyError

MODULE_FILE = "lmcv_blob.so"
PACKAGES_HINT = (
    "Debian/Ubuntu: apt-get install build-essential libfabric-dev; RHEL/Fedora: dnf install gcc make "
    "libfabric-devel; AWS: the EFA installer (libfabric under /opt/amazon/efa)"
)


class EndpointBuildError(LmcacheValkeyError):
    """The module cannot be built here; the message names what to install or fix."""


def endpoint_sources() -> Path:
    """The directory holding the module's Makefile, src/ and include/."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "_endpoint", here.parent / "endpoint"):
        if (candidate / "Makefile").is_file() and (candidate / "src").is_dir():
            return candidate
    raise EndpointBuildError(f"the module's C sources are not in this install ({here / '_endpoint'}): "
                             "reinstall lmcache-valkey from its wheel or sdist")


def build_command() -> str:
    """What to tell a user who needs the module (doctor, docs)."""
    return "lmcache-valkey endpoint build --out DIR"


def _missing_tools() -> list[str]:
    return [tool for tool in ("make", os.environ.get("CC") or "cc") if shutil.which(tool) is None]


def build_endpoint(out: str | os.PathLike[str], *, say: Callable[[str], None] = lambda m: None) -> Path:
    """Compile the module and return the path of ``<out>/lmcv_blob.so``."""
    from .transport.fabric._build import BuildError, find_libfabric  # the one header search

    src = endpoint_sources()
    missing = _missing_tools()
    if missing:
        raise EndpointBuildError(f"building the module needs {' and '.join(missing)} (a C toolchain): {PACKAGES_HINT}")
    try:
        libfabric = find_libfabric()
    except BuildError as e:
        raise EndpointBuildError(f"building the module needs libfabric headers ({e}): {PACKAGES_HINT}") from None
    out_dir = Path(out).expanduser().resolve()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise EndpointBuildError(f"cannot create --out {out_dir}: {e.strerror or e}") from None
    say(f"building {MODULE_FILE} from {src} against libfabric {libfabric.version} ({libfabric.prefix})")
    with tempfile.TemporaryDirectory(prefix="lmcv-endpoint-") as tmp:
        work = Path(tmp) / "endpoint"
        shutil.copytree(src, work, ignore=shutil.ignore_patterns("build", "*.o", "*.so"))
        proc = subprocess.run(["make", "-s", "-C", str(work), f"LIBFABRIC_PREFIX={libfabric.prefix}"],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-4:])
            raise EndpointBuildError(f"make failed ({tail}): {PACKAGES_HINT}")
        target = out_dir / MODULE_FILE
        tmp_target = out_dir / f".{MODULE_FILE}.{os.getpid()}"
        shutil.copyfile(work / "build" / MODULE_FILE, tmp_target)
        os.chmod(tmp_target, 0o755)  # Valkey refuses a module without execute permission
        os.replace(tmp_target, target)  # a running Valkey that loaded the old file keeps its mapping
    say(f"load it with: valkey-server --loadmodule {target} provider 'tcp;ofi_rxm' (see the README)")
    return target


__all__ = ["build_endpoint", "endpoint_sources", "build_command", "EndpointBuildError", "MODULE_FILE"]
