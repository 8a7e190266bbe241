"""The MP demo end to end: real Valkey 9.1.2, two real LMCache MP servers (`lmcache server` on
CPU) with this package's L2 adapter, driven by LMCache's own MP client."""

from __future__ import annotations

import json
import re

import pytest
from test_demo import _alive, _run

pytest.importorskip("lmcache")

pytestmark = pytest.mark.timeout(600)


def test_mp_server_b_serves_what_mp_server_a_stored(tmp_path):
    out_json = tmp_path / "demo.json"
    r = _run(["--mode", "mp", "--requests", "2", "--tokens", "512", "--json", str(out_json)], tmp_path, timeout=540)
    text = r.stdout + r.stderr
    assert r.returncode == 0, text
    assert re.search(r"^  server A 2 of 2 requests computed and stored", r.stdout, re.M), text
    assert re.search(r"^  server B first lookups hit 4 of 4 chunks; 2 of 2 requests retrieved byte-identical KV",
                     r.stdout, re.M), text
    assert re.search(r"^  L2       server B lists 4 chunks in Valkey", r.stdout, re.M), text
    assert re.search(r"^PASS: MP server B reused every chunk MP server A stored", r.stdout, re.M), text
    report = json.loads(out_json.read_text())
    assert report["ok"] is True and report["hits"] == [[2, 2], [2, 2]]
    assert report["stored"] == report["loaded"] and len(report["stored"]) == 2
    m = re.search(r"embedded valkey-server [\d.]+, 127\.0\.0\.1:\d+ \(pid (\d+)\)", r.stdout)
    assert m and not _alive(int(m.group(1))), "the demo left its Valkey server running"
    assert report["server_pids"] and not any(_alive(p) for p in report["server_pids"]), "an MP server outlived the demo"
