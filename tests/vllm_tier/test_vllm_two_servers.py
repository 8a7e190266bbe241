"""Two vLLM servers in two processes share offloaded blocks through one Valkey."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from vllmhelp import block_bytes, keys

pytestmark = pytest.mark.timeout(300)

HERE = Path(__file__).resolve().parent


def other_server(url: str, mode: str, seed: str, n: int) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, str(HERE / "other_server.py"), url, mode, seed, str(n)],
                         env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_each_server_loads_what_the_other_computed(valkey_server, engines) -> None:
    here = engines(valkey_server.url)
    mine = keys("computed here", 4)
    here.offload(mine)
    got = other_server(valkey_server.url, "fetch", "computed here", 4)["digests"]
    assert got == [hashlib.sha256(block_bytes(k, here.block_size)).hexdigest() for k in mine]

    assert other_server(valkey_server.url, "offload", "computed there", 3) == {"stored": 3}
    theirs = keys("computed there", 3)
    assert here.fetch(theirs) == [block_bytes(k, here.block_size) for k in theirs]
