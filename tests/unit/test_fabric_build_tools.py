"""From Python 3.12 on, cffi needs setuptools to compile the libfabric binding: without it
the error names setuptools and the pip command, not libfabric headers (which are there).
Runs in the py312/py313 test environments; older Pythons compile without setuptools."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import sys
sys.modules["setuptools"] = None  # as in an environment installed without it
from lmcache_valkey.errors import FabricUnavailable
from lmcache_valkey.transport.fabric import binding
try:
    binding.load()
except FabricUnavailable as exc:
    print("UNAVAILABLE:", exc)
else:
    print("LOADED")
"""


@pytest.mark.skipif(sys.version_info < (3, 12), reason="Python < 3.12 compiles with the standard library's distutils")
@pytest.mark.skipif(not Path("/usr/include/rdma/fabric.h").exists(), reason="needs libfabric headers (setup.sh installs them)")
def test_without_setuptools_the_error_names_setuptools(tmp_path):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))  # nothing cached: the build must run
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "UNAVAILABLE:" in out.stdout, out.stdout
    assert "setuptools" in out.stdout and "pip install" in out.stdout
    assert "libfabric-dev" not in out.stdout  # the headers are there: do not send the user after them


def test_the_binding_builds_on_this_python(tmp_path):
    """With the package's requirements installed, the binding compiles and loads here."""
    if not Path("/usr/include/rdma/fabric.h").exists():
        pytest.skip("needs libfabric headers (setup.sh installs them)")
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    probe = "from lmcache_valkey.transport.fabric import binding; print(binding.libfabric_version())"
    out = subprocess.run([sys.executable, "-c", probe], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip().count(".") == 1
