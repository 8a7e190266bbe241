"""Metrics: live /metrics from the module's own HTTP server passes `promtool check metrics`,
label sets stay closed, and multiprocess mode aggregates two real processes."""

from __future__ import annotations

import ast
import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request

import pytest

from promhelp import Prometheus, expected_hit_rates, hit_rate_query
from promhelp import samples as _samples

from lmcache_valkey import metrics

PROMTOOL = shutil.which("promtool")


def _need_promtool() -> str:
    if PROMTOOL is None:
        pytest.fail("promtool not found: run scripts/setup.sh (Debian package 'prometheus')")
    return PROMTOOL


def _get(url: str) -> tuple[int, bytes, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read(), resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers.get("Content-Type", "")


def _exercise_every_function() -> None:
    metrics.record_lookup(keys=8, prefix=5, seconds=0.0012)
    metrics.record_lookup(keys=3, prefix=0, seconds=0.0003)
    for tier in metrics.TIERS:
        for transport in metrics.TRANSPORTS:
            metrics.record_hit(tier, transport, 256 * 1024)
            metrics.observe_latency("get", tier, transport, 0.004)
            metrics.record_put(tier, transport, 256 * 1024, ok=True)
        for cause in metrics.MISS_CAUSES:
            metrics.record_miss(tier, cause)
        metrics.set_flush_backlog(tier, 7)
        metrics.record_flush_drop(tier)
        metrics.record_promotion(tier, 4096)
        metrics.record_demotion(tier, 4096)
        metrics.set_breaker_state(tier, "closed")
        metrics.record_admission(tier, admitted=True)
        metrics.record_admission(tier, admitted=False)
        metrics.set_tier_usage(tier, 10, 100)
    for op in metrics.OPS:
        for cause in metrics.ERROR_CAUSES:
            metrics.record_error(op, cause)
    metrics.record_put("ram", "resp", 10, ok=False)
    metrics.set_registered_bytes(1 << 30)


@pytest.fixture
def server():
    srv = metrics.start_http_server(0, "127.0.0.1", health=lambda: True)
    yield srv
    srv.close()


def test_live_metrics_pass_promtool(server, tmp_path):
    _exercise_every_function()
    code, body, ctype = _get(f"http://127.0.0.1:{server.port}/metrics")
    assert code == 200
    assert ctype.startswith("text/plain")
    text = body.decode()
    # every family we define is exposed with its conventional name
    for name in (
        "lmcache_valkey_lookups_total",
        "lmcache_valkey_hits_total",
        "lmcache_valkey_retrieved_bytes_total",
        "lmcache_valkey_misses_total",
        "lmcache_valkey_errors_total",
        "lmcache_valkey_operation_duration_seconds_bucket",
        "lmcache_valkey_lookup_duration_seconds_bucket",
        "lmcache_valkey_lookup_prefix_chunks_bucket",
        "lmcache_valkey_puts_total",
        "lmcache_valkey_stored_bytes_total",
        "lmcache_valkey_flush_backlog_chunks",
        "lmcache_valkey_flush_dropped_total",
        "lmcache_valkey_promotions_total",
        "lmcache_valkey_demotions_total",
        "lmcache_valkey_breaker_state",
        "lmcache_valkey_fabric_registered_bytes",
        "lmcache_valkey_admission_decisions_total",
        "lmcache_valkey_tier_used_bytes",
    ):
        assert f"\n{name}" in text, name
    # Only our families: when LMCache runs in the same process (earlier tests), the default
    # registry also carries its `lmcache:*` metrics, whose names are LMCache's to fix.
    ours = b"".join(
        line + b"\n"
        for line in body.splitlines()
        if line.startswith((b"lmcache_valkey_", b"# HELP lmcache_valkey_", b"# TYPE lmcache_valkey_"))
    )
    proc = subprocess.run(
        [_need_promtool(), "check", "metrics"], input=ours, capture_output=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()


def test_counts_and_histogram_buckets(server):
    s0 = _samples(metrics.render_latest().decode())
    metrics.record_hit("nvme", "local", 1000)
    metrics.record_hit("nvme", "local", 24)
    metrics.record_miss("ram", "deadline")
    metrics.observe_latency("get", "s3", "resp", 0.00005)
    metrics.observe_latency("get", "s3", "resp", 31.0)
    s1 = _samples(_get(f"http://127.0.0.1:{server.port}/metrics")[1].decode())

    def delta(key: str) -> float:
        return s1.get(key, 0.0) - s0.get(key, 0.0)

    assert delta('lmcache_valkey_hits_total{tier="nvme",transport="local"}') == 2
    assert delta('lmcache_valkey_retrieved_bytes_total{tier="nvme",transport="local"}') == 1024
    assert delta('lmcache_valkey_misses_total{cause="deadline",tier="ram"}') == 1
    lat = 'lmcache_valkey_operation_duration_seconds_bucket{le="%s",op="get",tier="s3",transport="resp"}'
    assert delta(lat % "0.0001") == 1  # 50 µs lands in the first bucket
    assert delta(lat % "30.0") == 1  # 31 s lands only in +Inf
    assert delta(lat % "+Inf") == 2
    buckets = metrics.LATENCY_BUCKETS
    assert buckets[0] == 0.0001 and buckets[-1] == 30.0 and list(buckets) == sorted(buckets)


def test_unknown_label_values_are_bounded(server):
    before = _samples(metrics.render_latest().decode())
    for i in range(50):
        metrics.record_hit(f"tier-{i}", f"transport-{i}", 1)
        metrics.record_miss("ram", f"weird-{i}")
    after = metrics.render_latest().decode()
    assert "tier-1" not in after and "weird-1" not in after
    s = _samples(after)
    key = 'lmcache_valkey_hits_total{tier="other",transport="other"}'
    assert s[key] - before.get(key, 0.0) == 50


def test_breaker_state_values():
    for state, value in (("closed", 0), ("open", 1), ("half_open", 2)):
        metrics.set_breaker_state("s3", state)
        assert _samples(metrics.render_latest().decode())['lmcache_valkey_breaker_state{tier="s3"}'] == value


def test_healthz_and_404():
    states = [True]
    srv = metrics.start_http_server(0, "127.0.0.1", health=lambda: states[0])
    try:
        assert _get(f"http://127.0.0.1:{srv.port}/healthz")[:2] == (200, b"ok\n")
        states[0] = False
        assert _get(f"http://127.0.0.1:{srv.port}/healthz")[0] == 503
        assert _get(f"http://127.0.0.1:{srv.port}/nope")[0] == 404
    finally:
        srv.close()


def test_all_is_exact():
    public = {n for n in dir(metrics) if not n.startswith("_") and callable(getattr(metrics, n))}
    for name in metrics.__all__:
        assert hasattr(metrics, name), name
    for fn in ("record_lookup", "record_hit", "record_miss", "start_http_server", "render_latest"):
        assert fn in metrics.__all__ and fn in public


def _documented_families() -> set[str]:
    """Family names from the table in docs/metrics.md (``_x`` is short for ``lmcache_valkey_x``)."""
    doc = pathlib.Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
    table = doc.read_text().split("## Families", 1)[1].split("\n\n", 2)[1]
    names: set[str] = set()
    for row in table.splitlines()[2:]:
        for name in re.findall(r"`(_?[a-z_]+)`", row.split("|")[1]):
            names.add(("lmcache_valkey" + name) if name.startswith("_") else name)
    return names


def test_every_documented_family_is_exposed_and_every_exposed_one_documented():
    exposed = {line.split()[2] for line in metrics.render_latest().decode().splitlines()
               if line.startswith("# TYPE lmcache_valkey_") and not line.split()[2].endswith("_created")}
    documented = _documented_families()
    assert len(documented) > 20
    assert documented == exposed, (documented - exposed, exposed - documented)


def test_every_recording_function_is_called_by_the_package():
    """A recording function nobody calls is a family that always reads 0 (or a helper to remove)."""
    root = pathlib.Path(metrics.__file__).parent
    called: set[str] = set()
    for path in root.rglob("*.py"):
        if path.name == "metrics.py" and path.parent == root:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "metrics":
                called.add(node.attr)
    recorders = {n for n in metrics.__all__ if n.startswith(("record_", "set_", "observe_"))}
    assert recorders and not recorders - called, recorders - called


def test_only_metrics_imports_prometheus_client():
    root = os.path.join(os.path.dirname(__file__), "..", "..", "lmcache_valkey")
    offenders = []
    for dirpath, _, files in os.walk(root):
        for f in files:
            if f.endswith(".py") and not (dirpath == root and f == "metrics.py"):
                path = os.path.join(dirpath, f)
                with open(path, encoding="utf-8") as fh:
                    src = fh.read()
                if "import prometheus_client" in src or "from prometheus_client" in src:
                    offenders.append(os.path.relpath(path, root))
    assert offenders == []


# --- multiprocess mode -----------------------------------------------------------------------
WORKER = textwrap.dedent(
    """
    import os, sys
    from lmcache_valkey import metrics
    assert metrics.multiprocess_enabled()
    n = int(sys.argv[1])
    for _ in range(n):
        metrics.record_hit("ram", "resp", 100)
    metrics.observe_latency("get", "ram", "resp", 0.001)
    print(os.getpid())
    """
)

SERVE = textwrap.dedent(
    """
    import sys, time
    from lmcache_valkey import metrics
    srv = metrics.start_http_server(0, "127.0.0.1")
    print(srv.port, flush=True)
    sys.stdin.read()  # until the test closes our stdin
    srv.close()
    """
)


def _env(mp_dir) -> dict:
    env = dict(os.environ)
    env["PROMETHEUS_MULTIPROC_DIR"] = str(mp_dir)
    return env


def test_multiprocess_two_workers_aggregate(tmp_path):
    mp_dir = tmp_path / "prom"
    mp_dir.mkdir()
    env = _env(mp_dir)
    pids = []
    for n in (2, 3):
        out = subprocess.run(
            [sys.executable, "-c", WORKER, str(n)], env=env, capture_output=True, timeout=60
        )
        assert out.returncode == 0, out.stderr.decode()
        pids.append(int(out.stdout.decode().strip()))

    server = subprocess.Popen(
        [sys.executable, "-c", SERVE], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        port = int(server.stdout.readline())
        code, body, _ = _get(f"http://127.0.0.1:{port}/metrics")
        assert code == 200
        s = _samples(body.decode())
        assert s['lmcache_valkey_hits_total{tier="ram",transport="resp"}'] == 5
        assert s['lmcache_valkey_retrieved_bytes_total{tier="ram",transport="resp"}'] == 500
        assert (
            s['lmcache_valkey_operation_duration_seconds_count{op="get",tier="ram",transport="resp"}']
            == 2
        )
        proc = subprocess.run(
            [_need_promtool(), "check", "metrics"], input=body, capture_output=True, timeout=60
        )
        assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()
    finally:
        server.stdin.close()
        server.wait(timeout=30)


LIVE_WORKER = textwrap.dedent(
    """
    import sys
    from lmcache_valkey import metrics
    n = int(sys.argv[1])
    metrics.set_flush_backlog("s3", n)
    metrics.set_breaker_state("nvme", "open" if n == 3 else "closed")
    metrics.set_registered_bytes(1000 * n)
    print("ready", flush=True)
    sys.stdin.read()
    """
)


def test_multiprocess_live_gauges(tmp_path):
    mp_dir = tmp_path / "prom"
    mp_dir.mkdir()
    env = _env(mp_dir)
    workers = []
    try:
        for n in (2, 3):
            p = subprocess.Popen(
                [sys.executable, "-c", LIVE_WORKER, str(n)],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
            workers.append(p)
            assert p.stdout.readline().strip() == b"ready"
        render = "from lmcache_valkey import metrics; import sys; sys.stdout.buffer.write(metrics.render_latest())"
        out = subprocess.run([sys.executable, "-c", render], env=env, capture_output=True, timeout=60)
        assert out.returncode == 0, out.stderr.decode()
        s = _samples(out.stdout.decode())
        assert s['lmcache_valkey_flush_backlog_chunks{tier="s3"}'] == 5  # livesum
        assert s['lmcache_valkey_breaker_state{tier="nvme"}'] == 1  # livemax: one is open
        assert s["lmcache_valkey_fabric_registered_bytes"] == 5000

        # A worker exits and the server marks it dead: its live gauges go.
        dead = workers.pop()
        dead.stdin.close()
        dead.wait(timeout=30)
        mark = f"from lmcache_valkey import metrics; metrics.mark_process_dead({dead.pid})"
        subprocess.run([sys.executable, "-c", mark], env=env, check=True, timeout=60)
        out = subprocess.run([sys.executable, "-c", render], env=env, capture_output=True, timeout=60)
        s = _samples(out.stdout.decode())
        assert s['lmcache_valkey_flush_backlog_chunks{tier="s3"}'] == 2
        assert s['lmcache_valkey_breaker_state{tier="nvme"}'] == 0
    finally:
        for p in workers:
            p.stdin.close()
            p.wait(timeout=30)



# --- a real Prometheus server scrapes the module's /metrics ------------------------------------
def test_prometheus_server_scrapes_per_tier_hit_rate(tmp_path):
    srv = metrics.start_http_server(0, "127.0.0.1")
    for _ in range(3):
        metrics.record_hit("ram", "resp", 10)
    metrics.record_miss("ram", "absent")
    metrics.record_hit("nvme", "local", 10)
    metrics.record_miss("nvme", "absent")
    # earlier tests in this process recorded too: compare with this process's own totals
    want = expected_hit_rates(metrics.render_latest().decode())
    prom = Prometheus(tmp_path / "prom", "lmcv-test", [f"127.0.0.1:{srv.port}"])
    try:
        result = prom.wait_for(hit_rate_query("lmcv-test"), lambda r: {"ram", "nvme"} <= {x["metric"]["tier"] for x in r})
        got = {r["metric"]["tier"]: float(r["value"][1]) for r in result}
        assert got["ram"] == pytest.approx(want["ram"])
        assert got["nvme"] == pytest.approx(want["nvme"])
    finally:
        prom.stop()
        srv.close()


# --- the label values the rest of the package passes are all known ----------------------------
def _package_sources() -> dict[str, str]:
    root = os.path.join(os.path.dirname(__file__), "..", "..", "lmcache_valkey")
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            if f.endswith(".py") and f != "metrics.py":
                path = os.path.join(dirpath, f)
                with open(path, encoding="utf-8") as fh:
                    out[os.path.relpath(path, root)] = fh.read()
    return out


def test_causes_used_in_the_package_are_known():
    import re

    found: dict[str, set] = {"cause": set(), "op": set(), "tier": set()}
    for path, src in _package_sources().items():
        # class attributes of typed errors (the store labels misses/errors with them)
        found["cause"].update(re.findall(r'^\s+cause = "([a-z_]+)"', src, re.M))
        # CorruptChunk("reason", ...)
        found["cause"].update(re.findall(r'CorruptChunk\(\s*"([a-z_]+)"', src))
        # record_miss(tier, "cause") / record_error("op", "cause") with literals
        for tier, cause in re.findall(r'record_miss\(\s*"([a-z0-9_]+)"\s*,\s*"([a-z_]+)"', src):
            found["tier"].add(tier)
            found["cause"].add(cause)
        for op, cause in re.findall(r'record_error\(\s*"([a-z_]+)"\s*,\s*"([a-z_]+)"', src):
            found["op"].add(op)
            found["cause"].add(cause)
        found["op"].update(re.findall(r'observe_latency\(\s*"([a-z_]+)"', src))
    assert found["cause"] <= set(metrics.MISS_CAUSES) | set(metrics.ERROR_CAUSES), (
        found["cause"] - set(metrics.MISS_CAUSES) - set(metrics.ERROR_CAUSES)
    )
    assert found["op"] <= set(metrics.OPS), found["op"] - set(metrics.OPS)
    assert found["tier"] <= set(metrics.TIERS), found["tier"] - set(metrics.TIERS)
