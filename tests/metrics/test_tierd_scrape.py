"""A real Prometheus server scrapes a running `lmcache-valkey tierd` (the CLI, in its own
process, as the Helm chart runs it) and a PromQL query returns per-tier hit rates."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from promhelp import Prometheus, expected_hit_rates, free_port, hit_rate_query


TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "tiering"))  # tierhelp: chunk values in the codec's format

pytestmark = pytest.mark.timeout(180)


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read()


@pytest.fixture
def tierd(valkey_server, tmp_path):
    nvme = tmp_path / "nvme"  # ext4 under the work tree / tmp (O_DIRECT works there)
    nvme.mkdir()
    port = free_port()
    exe = Path(sys.executable).with_name("lmcache-valkey")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-c", "from lmcache_valkey.cli import main; main()"]
    log = open(tmp_path / "tierd.log", "wb")
    proc = subprocess.Popen(
        cmd + ["tierd", "--valkey-url", valkey_server.url, "--tenant", "t1", "--nvme-dir", str(nvme),
               "--nvme-budget-bytes", "64MiB", "--admission", "always", "--metrics-port", str(port),
               "--set", "request_block_s=0.2", "--set", "demote_interval_s=3600"],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    deadline = time.monotonic() + 60  # start-up of a hung process, not a speed check
    while True:
        if proc.poll() is not None:
            pytest.fail("tierd exited: " + (tmp_path / "tierd.log").read_text(errors="replace")[-3000:])
        try:
            if _get(f"http://127.0.0.1:{port}/healthz").startswith(b"ok"):
                break
        except OSError:
            pass
        if time.monotonic() > deadline:
            pytest.fail("tierd never became healthy: " + (tmp_path / "tierd.log").read_text(errors="replace")[-3000:])
        time.sleep(0.2)
    try:
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        log.close()


async def _traffic(server) -> None:
    """Chunks go to RAM and are demoted to NVMe; RAM copies are evicted; promotions then hit
    the NVMe tier, and asking for a chunk nobody has is a miss."""
    from tierhelp import NS, chunk, resp_client

    from lmcache_valkey.tiering import RemoteTierClient
    from lmcache_valkey.tiering.tierd import drain, evict

    client = await resp_client(server)
    tc = RemoteTierClient(client, client.settings)
    try:
        items = [chunk(i, 64 << 10) for i in range(4)]
        for key, value in items:
            await client.set(key, [value], ttl_s=None, timeout=5.0)
            await tc.note_put(key, len(value))
        await tc.flush_hints()
        assert await drain(tc, timeout=30)
        assert await evict(tc, "ram", namespace=NS.digest, tenant="t1") == len(items)
        for key, _ in items:
            assert await tc.promote(key, timeout=10.0)
        assert not await tc.promote(NS.data_key("f" * 32), timeout=5.0)
    finally:
        await tc.close()
        await client.close()


def test_prometheus_scrapes_tierd_per_tier_hit_rate(valkey_server, tierd, tmp_path):
    asyncio.run(_traffic(valkey_server))
    text = _get(f"http://127.0.0.1:{tierd}/metrics").decode()
    want = expected_hit_rates(text)
    assert "nvme" in want, text[-3000:]
    assert want["nvme"] > 0  # the promotions above were NVMe hits

    prom = Prometheus(tmp_path / "prom", "tierd", [f"127.0.0.1:{tierd}"])
    try:
        # wait until a scrape has seen the final counters
        result = prom.wait_for(
            hit_rate_query("tierd"),
            lambda r: any(x["metric"].get("tier") == "nvme"
                          and float(x["value"][1]) == pytest.approx(want["nvme"]) for x in r),
        )
        got = {r["metric"]["tier"]: float(r["value"][1]) for r in result}
        for tier, rate in want.items():
            assert got[tier] == pytest.approx(rate), (tier, got, want)
        up = prom.wait_for("up{job='tierd'}", lambda r: True)
        assert float(up[0]["value"][1]) == 1.0
    finally:
        prom.stop()
