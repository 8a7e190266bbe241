"""Two SGLang servers in two processes share L3 pages through one Valkey."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sglanghelp import fill_pages, indices, keys, make_pool, page_bytes

pytestmark = pytest.mark.timeout(300)

HERE = Path(__file__).resolve().parent


def other_server(url: str, mode: str, seed: str, n: int, layout: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-W", "ignore", str(HERE / "other_server.py"), url, mode, seed, str(n), layout],
                         env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_each_server_loads_the_pages_the_other_stored(valkey_server, backends) -> None:
    """This one runs layer_first, the other page_first_direct: the same page bytes, shared."""
    pool = make_pool("mha", "layer_first")
    here = backends(valkey_server.url, pool=pool)
    mine = keys(4, "computed-here")
    want = fill_pages(pool, [0, 4, 8, 12], seed=30)
    assert all(here.batch_set_v1(mine, indices(pool, [0, 4, 8, 12])))
    got = other_server(valkey_server.url, "load", "computed-here", 4, "page_first_direct")["digests"]
    assert got == [hashlib.sha256(b).hexdigest() for b in want]

    assert other_server(valkey_server.url, "store", "computed-there", 3, "page_first_direct") == {"stored": 3}
    theirs = keys(3, "computed-there")
    assert here.batch_exists(theirs) == 3
    assert here.batch_get_v1(theirs, indices(pool, [40, 44, 48])) == [True] * 3
    reference = make_pool("mha", "page_first_direct")
    expected = fill_pages(reference, [0, 4, 8], seed=sum(map(ord, "computed-there")))
    assert [page_bytes(pool, s) for s in (40, 44, 48)] == expected
