"""`lmcache-valkey tierd` as a real process: CLI stats/evict, object retrieval after the
faster copies are evicted, graceful SIGTERM with the backlog drained."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import re
import time

import pytest
from support.procs import sigterm_and_collect
from tierhelp import NS, chunk, ram_get, resp_client

from lmcache_valkey.tiering import RemoteTierClient

pytestmark = pytest.mark.timeout(120)


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lmcache_valkey", *argv], capture_output=True, text=True, timeout=60)



def _put_with_hints(server, items) -> None:
    async def body() -> None:
        client = await resp_client(server)
        tc = RemoteTierClient(client, client.settings)
        for key, value in items:
            await client.set(key, [value], ttl_s=None, timeout=5.0)
            await tc.note_put(key, len(value))
        await tc.flush_hints()
        await tc.close()
        await client.close()

    asyncio.run(body())


def test_tierd_process_cli_controls_and_sigterm(small_valkey, nvme_dir, moto_s3) -> None:
    moto_s3.create_bucket()
    env = dict(os.environ)
    proc = subprocess.Popen(
        [sys.executable, "-m", "lmcache_valkey", "tierd", "--valkey-url", small_valkey.url, "--tenant", "t1",
         "--nvme-dir", nvme_dir, "--s3-bucket", moto_s3.bucket, "--s3-endpoint-url", moto_s3.url,
         "--admission", "always", "--set", "request_block_s=0.2", "--drain-timeout-s", "30"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ctl = ["--url", small_valkey.url, "--tenant", "t1", "--timeout", "20"]
    items = [chunk(i, 200_000) for i in range(4)]
    try:
        _put_with_hints(small_valkey, items)
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
            tc = RemoteTierClient(client, client.settings)
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
        out = sigterm_and_collect(proc)
    assert proc.returncode == 0, out
    assert "draining the flush backlog" in out


def test_drain_reports_progress_and_stats_read_like_a_report(small_valkey, nvme_dir, moto_s3) -> None:
    """With the object store down the backlog cannot flush: `drain` says how much is left while
    it waits and fails at its deadline; once the store is back it drains. `stats` without
    --json prints sizes and counters a person reads, not Python dicts."""
    moto_s3.create_bucket()
    moto_s3.stop()
    proc = subprocess.Popen(
        [sys.executable, "-m", "lmcache_valkey", "tierd", "--valkey-url", small_valkey.url, "--tenant", "t1",
         "--nvme-dir", nvme_dir, "--nvme-budget-bytes", "1GiB", "--s3-bucket", moto_s3.bucket,
         "--s3-endpoint-url", moto_s3.url, "--admission", "always", "--set", "request_block_s=0.2",
         "--set", "s3_timeout_s=1", "--drain-timeout-s", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ctl = ["--url", small_valkey.url, "--tenant", "t1"]
    try:
        _put_with_hints(small_valkey, [chunk(i, 100_000) for i in range(3)])
        deadline = time.monotonic() + 60
        while True:  # tierd has taken the chunks (NVMe copies written, S3 uploads pending)
            r = _cli("stats", *ctl, "--json", "--timeout", "20")
            if r.returncode == 0 and json.loads(r.stdout)["index"]["nvme"]["chunks"] == 3:
                break
            assert time.monotonic() < deadline, r.stdout + r.stderr
            time.sleep(0.2)

        r = _cli("stats", *ctl, "--timeout", "20")
        assert r.returncode == 0, r.stderr
        assert "{" not in r.stdout and "'" not in r.stdout, r.stdout
        assert re.search(r"^nvme +[\d.]+ KiB of 1\.0 GiB used \([\d.]+%\), holds 3 chunk\(s\)", r.stdout, re.M), r.stdout
        assert re.search(r"^s3 +backlog \d+ of 1,024 chunk\(s\), breaker \w+", r.stdout, re.M), r.stdout

        r = _cli("drain", *ctl, "--timeout", "5")
        assert r.returncode == 1, r.stdout + r.stderr
        assert "NOT drained within 5s" in r.stdout
        progress = [ln for ln in r.stderr.splitlines() if ln.startswith("drain: ")]
        assert len(progress) >= 2 and all(re.search(r"still to flush to S3", ln) for ln in progress), r.stderr
        assert re.search(r"waited \d+s of 5s$", progress[-1]), progress

        moto_s3.start()
        r = _cli("drain", *ctl, "--timeout", "40")
        assert r.returncode == 0 and "flush backlog drained" in r.stdout, r.stdout + r.stderr
    finally:
        out = sigterm_and_collect(proc)
    assert proc.returncode == 0, out


def test_control_commands_without_a_tierd_fail_in_one_line(small_valkey) -> None:
    for cmd in ("stats", "drain"):
        r = _cli(cmd, "--url", small_valkey.url, "--tenant", "t9", "--timeout", "1")
        assert r.returncode == 1, r.stdout + r.stderr
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "no tierd answered for tenant 't9'" in r.stderr and "lmcache-valkey tierd" in r.stderr
        r = _cli(cmd, "--url", small_valkey.url, "--tenant", "t9", "--timeout", "1", "--json")
        assert r.returncode == 1 and json.loads(r.stdout)["exit_code"] == 1


def test_tierd_without_the_s3_extra_names_it_and_exits_2(small_valkey, tmp_path) -> None:
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['aiobotocore'] = None\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(hide), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", "lmcache_valkey", "tierd", "--valkey-url", small_valkey.url,
                        "--s3-bucket", "kv-cold"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "pip install 'lmcache-valkey[s3]'" in r.stderr and "ModuleNotFoundError" not in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_tierd_exit_codes_are_documented() -> None:
    r = _cli("tierd", "--help")
    assert "3: stopped with chunks its drain could not flush" in " ".join(r.stdout.split())


@pytest.mark.parametrize("argv, named", [
    (["--nvme-budget-bytes", "5XB"], "'--nvme-budget-bytes'"),
    (["--set", "demote_idle_s=soon"], "'--set demote_idle_s'"),
    (["--set", "demote_idle"], "'--set': expected KEY=VALUE"),
    (["--set", "nvme_budget=1GiB"], "'--set nvme_budget': expected one of the known keys"),
    (["--tenant", "team a"], "'--tenant'"),
])
def test_a_bad_tierd_flag_is_named_as_the_user_wrote_it(small_valkey, tmp_path, argv, named) -> None:
    r = _cli("tierd", "--valkey-url", small_valkey.url, "--nvme-dir", str(tmp_path / "nvme"), *argv)
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and named in r.stderr, r.stderr
    r = _cli("tierd", "--valkey-url", "http://valkey:6379", "--nvme-dir", str(tmp_path / "nvme"))
    assert r.returncode == 2 and "'--valkey-url'" in r.stderr, r.stderr


def test_tierd_stopped_with_chunks_it_could_not_flush_exits_3(small_valkey, nvme_dir, moto_s3) -> None:
    """The documented exit code 3: SIGTERM while the object store is down leaves uploads its
    bounded drain cannot finish; tierd says how many and exits 3 (0 is for a clean stop)."""
    moto_s3.create_bucket()
    moto_s3.stop()
    proc = subprocess.Popen(
        [sys.executable, "-m", "lmcache_valkey", "tierd", "--valkey-url", small_valkey.url, "--tenant", "t1",
         "--nvme-dir", nvme_dir, "--s3-bucket", moto_s3.bucket, "--s3-endpoint-url", moto_s3.url,
         "--admission", "always", "--set", "request_block_s=0.2", "--set", "s3_timeout_s=1",
         "--set", "s3_max_retries=20", "--drain-timeout-s", "1"],  # uploads wait, never given up
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _put_with_hints(small_valkey, [chunk(i, 100_000) for i in range(2)])
        deadline = time.monotonic() + 60
        while True:  # tierd has taken the chunks (NVMe copies written, S3 uploads pending)
            r = _cli("stats", "--url", small_valkey.url, "--tenant", "t1", "--json", "--timeout", "20")
            if r.returncode == 0 and json.loads(r.stdout)["index"]["nvme"]["chunks"] == 2:
                break
            assert time.monotonic() < deadline, r.stdout + r.stderr
            time.sleep(0.2)
    finally:
        out = sigterm_and_collect(proc)
    assert proc.returncode == 3, out
    assert re.search(r"tierd: 2 chunk\(s\) were not flushed to the object tier", out), out
