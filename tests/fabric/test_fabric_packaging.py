"""Without libfabric the package imports and works TCP-only; asking for the fabric path
raises FabricUnavailable saying what to install. Teardown leaves no thread behind."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import asyncio
import lmcache_valkey.transport.fabric as f
from lmcache_valkey.errors import FabricUnavailable
assert not f.available()
try:
    f.FabricTransport(data_path="rma")
except FabricUnavailable as exc:
    print("UNAVAILABLE:", exc)
t = f.FabricTransport(data_path="bulk")  # TCP-only path needs no libfabric
asyncio.run(t.close())
print("BULK-OK")
"""


def test_without_libfabric_the_fabric_path_fails_clearly(tmp_path):
    env = dict(os.environ, LMCACHE_VALKEY_LIBFABRIC_PREFIX=str(tmp_path / "no-libfabric"), XDG_CACHE_HOME=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "UNAVAILABLE:" in out.stdout and "libfabric-dev" in out.stdout
    assert "BULK-OK" in out.stdout


async def test_close_stops_the_progress_thread(start_server):
    from lmcache_valkey.transport.fabric import FabricTransport

    srv = start_server("tcp;ofi_rxm")

    t = FabricTransport("127.0.0.1", srv.port)
    arena = bytearray(1 << 20)
    t.register_buffer(arena)
    await t.connect()
    assert any(th.name.startswith("fabric-progress") for th in threading.enumerate())
    await t.close()

    assert not any(th.name.startswith("fabric-progress") for th in threading.enumerate())


def test_public_names_exist_and_the_package_never_imports_lmcache_or_the_store():
    import ast

    import lmcache_valkey.transport.fabric as fabric

    for name in fabric.__all__:
        assert hasattr(fabric, name), name
    pkg = ROOT / "lmcache_valkey" / "transport" / "fabric"
    for path in pkg.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for n in names:
                assert not n.startswith(("lmcache.", "torch", "lmcache_valkey.store", "lmcache_valkey.integrations")), (path, n)
                assert n != "lmcache", path
