"""A real Prometheus server for metrics tests: scrapes given targets every second; query()
runs an instant PromQL query. Started on 127.0.0.1 with a free port, stopped by its handle."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    def __init__(self, workdir: Path, job: str, targets: list[str]):
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail("prometheus not found: run scripts/setup.sh (Debian package 'prometheus')")
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        cfg = workdir / "prometheus.yml"
        cfg.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            f"  - job_name: {job}\n"
            f"    static_configs: [{{targets: {json.dumps(targets)}}}]\n"
        )
        self.port = free_port()
        self._log = open(workdir / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={cfg}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )

    def query(self, promql: str) -> list[dict] | None:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                return json.loads(resp.read())["data"]["result"]
        except (urllib.error.URLError, ConnectionError, OSError):
            return None

    def wait_for(self, promql: str, accept, timeout: float = 90.0) -> list[dict]:
        """Poll until ``accept(result)``; the timeout guards a hung server, it is no speed check."""
        deadline = time.monotonic() + timeout
        result = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            result = self.query(promql)
            if result and accept(result):
                return result
            time.sleep(0.5)
        pytest.fail(f"query {promql!r} never satisfied (last: {result}); log:\n{self.log_tail()}")

    def log_tail(self) -> str:
        return (self.workdir / "prometheus.log").read_text(errors="replace")[-2000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self._log.close()


def samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def hit_rate_query(job: str) -> str:
    """hits / (hits + misses) per tier; a tier with only hits or only misses still shows."""
    sel = f"{{job='{job}'}}"
    h = f"sum by (tier) (lmcache_valkey_hits_total{sel})"
    m = f"sum by (tier) (lmcache_valkey_misses_total{sel})"
    return f"({h} or {m} * 0) / (({h} or {m} * 0) + ({m} or {h} * 0))"


def expected_hit_rates(text: str) -> dict[str, float]:
    """Per-tier hits / (hits + misses) computed from one scrape's text."""
    s = samples(text)
    rates = {}
    for tier in ("ram", "nvme", "s3"):
        hits = sum(v for k, v in s.items() if k.startswith("lmcache_valkey_hits_total{") and f'tier="{tier}"' in k)
        misses = sum(v for k, v in s.items() if k.startswith("lmcache_valkey_misses_total{") and f'tier="{tier}"' in k)
        if hits + misses:
            rates[tier] = hits / (hits + misses)
    return rates
