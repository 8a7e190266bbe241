"""`lmcache-valkey tierd` as a real process: CLI stats/evict, object retrieval after the
faster copies are evicted, graceful SIGTERM with the backlog drained."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from tierhelp import NS, chunk, ram_get, resp_client

from lmcache_valkey.tiering import TierClient

pytestmark = pytest.mark.timeout(120)


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lmcache_valkey.cli", *argv], capture_output=True, text=True, timeout=60)


def test_tierd_process_cli_controls_and_sigterm(small_valkey, nvme_dir, moto_s3) -> None:
    moto_s3.create_bucket()
    env = dict(os.environ)
    proc = subprocess.Popen(
        [sys.executable, "-m", "lmcache_valkey.cli", "tierd", "--valkey-url", small_valkey.url, "--tenant", "t1",
         "--nvme-dir", nvme_dir, "--s3-bucket", moto_s3.bucket, "--s3-endpoint-url", moto_s3.url,
         "--admission", "always", "--set", "request_block_s=0.2", "--drain-timeout-s", "30"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ctl = ["--url", small_valkey.url, "--tenant", "t1", "--timeout", "20"]
    items = [chunk(i, 200_000) for i in range(4)]
    try:
        async def put_and_hint() -> None:
            client = await resp_client(small_valkey)
            tc = TierClient.remote(client, client.settings)
            for key, value in items:
                await client.set(key, [value], ttl_s=None, timeout=5.0)
                await tc.note_put(key, len(value))
            await tc.flush_hints()
            await tc.close()
            await client.close()

        asyncio.run(put_and_hint())
        # wait until tierd has the copies (it may still be starting: the CLI waits for replies)
        deadline = time.monotonic() + 60
        while True:
            r = _cli("stats", *ctl, "--json")
            if r.returncode == 0:
                stats = json.loads(r.stdout)
                if stats["index"]["s3"]["chunks"] == 4 and stats["index"]["nvme"]["chunks"] == 4:
                    break
            assert time.monotonic() < deadline, r.stdout + r.stderr
            time.sleep(0.2)
        r = _cli("evict", *ctl, "--tier", "ram", "--namespace", NS.digest, "--json")
        assert r.returncode == 0 and json.loads(r.stdout) == {"evicted": 4}, r.stderr
        r = _cli("evict", *ctl, "--tier", "nvme", "--namespace", NS.digest, "--json")
        assert r.returncode == 0 and json.loads(r.stdout) == {"evicted": 4}, r.stderr

        async def read_back() -> None:
            client = await resp_client(small_valkey)
            tc = TierClient.remote(client, client.settings)
            for key, value in items:
                assert await ram_get(client, key, len(value)) is None
                assert await tc.promote(key, timeout=20.0)
                assert await ram_get(client, key, len(value)) == value
            await tc.close()
            await client.close()

        asyncio.run(read_back())
        stats = json.loads(_cli("stats", *ctl, "--json").stdout)
        assert stats["s3"]["hits"] == 4
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    assert proc.returncode == 0, out
    assert "draining the flush backlog" in out
