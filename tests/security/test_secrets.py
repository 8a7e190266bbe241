"""No secret in any log line, error or metric: tierd, the CLI and an LMCache worker run with
passwords (holding '?', '/', '@', ':') and a tenant secret, and their logs, stderr and
/metrics are searched for any piece of them."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from lmcache_valkey import acl
from support.acl_lines import setuser
from support.servers import free_port

pytestmark = pytest.mark.timeout(180)

TIERD_PW = "Tq7?zW/rKp@x:9Lm"  # what a password generator may well produce
WORKER_PW = "Wv3#nB?cH8/qZ@e"
TENANT_SECRET = "Xj4kM9pQ2rS7-vB8nL3wT6"
EXE = Path(sys.executable).with_name("lmcache-valkey")


def _pieces(*secrets: str) -> set[str]:
    """Every run of 3+ letters or digits of the secrets: none may appear anywhere."""
    return {p for s in secrets for p in re.split(r"[^A-Za-z0-9]", s) if len(p) >= 3} | set(secrets)


def _leaks(text: str, *secrets: str) -> list[str]:
    return [p for p in _pieces(*secrets) if p in text]


def _url(server, user: str, password: str) -> str:
    return f"valkey://{user}:{password}@127.0.0.1:{server.port}"  # unencoded: the hard case


@pytest.fixture
def users(valkey_server):
    setuser(valkey_server, acl.tierd_line("lmcv-tierd", "team-a"), TIERD_PW)
    setuser(valkey_server, acl.worker_line("team-a", "team-a", tiering=True), WORKER_PW)
    return valkey_server


def test_tierd_and_the_cli_never_show_a_password(users, tmp_path):
    server = users
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    port = free_port()
    out = tmp_path / "tierd.log"
    proc = subprocess.Popen(
        [str(EXE), "tierd", "--valkey-url", _url(server, "lmcv-tierd", TIERD_PW), "--tenant", "team-a",
         "--nvme-dir", str(nvme), "--metrics-port", str(port), "--set", "request_block_s=0.2"],
        stdout=open(out, "wb"), stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 60  # start-up of a hung process, not a speed check
        while b"serving tenant" not in out.read_bytes():
            assert proc.poll() is None and time.monotonic() < deadline, out.read_text()
            time.sleep(0.1)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        cli = [subprocess.run([str(EXE), *args], capture_output=True, text=True, timeout=120) for args in (
            ["stats", "--url", _url(server, "team-a", WORKER_PW), "--tenant", "team-a", "--json"],
            ["stats", "--url", _url(server, "team-a", "wrong" + WORKER_PW), "--tenant", "team-a"],
            ["doctor", "--url", _url(server, "team-a", WORKER_PW), "--tenant", "team-a", "--transport", "tcp"],
            ["doctor", "--url", _url(server, "team-a", WORKER_PW).replace(str(server.port), "99999")],
            ["doctor", "--url", _url(server, "team-a", WORKER_PW) + "?nope=1"],
        )]
        assert cli[0].returncode == 0, cli[0].stderr
        assert cli[1].returncode != 0 and cli[3].returncode == 2 and cli[4].returncode == 2
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    log = out.read_text()
    assert "serving tenant team-a on valkey://127.0.0.1:" in log
    for text in (log, metrics, *(c.stdout + c.stderr for c in cli)):
        assert not _leaks(text, TIERD_PW, WORKER_PW), text[-2000:]


def test_a_worker_never_logs_its_password_or_tenant_secret(users, make_stack, caplog):
    from conftest_helpers import SMALL, filled, put_and_wait

    from lmcache_valkey import metrics

    caplog.set_level(logging.DEBUG)
    stack = make_stack({"url": _url(users, "team-a", WORKER_PW), "tenant": "team-a", "cluster": "no",
                        "tenant_secret": TENANT_SECRET})
    assert stack.connector is not None
    keys = [SMALL.key(i) for i in range(3)]
    objs = [filled(stack, i) for i in range(3)]
    put_and_wait(stack, keys, objs)
    for o in objs:
        o.ref_count_down()
    got = stack.remote.get_blocking(keys[0])
    got.ref_count_down()
    # and one that cannot log in
    assert make_stack({"url": _url(users, "team-a", "bad" + WORKER_PW), "tenant": "team-a",
                       "tenant_secret": TENANT_SECRET}).connector is None
    text = "\n".join(f"{r.getMessage()} {r.exc_text or ''}" for r in caplog.records)
    assert "lmcache-valkey" in text and "WRONGPASS" in text  # the logs were captured
    reprs = repr(stack.connector.settings) + repr(stack.connector.namespace) + repr(stack.connector)
    exposition = metrics.render_latest().decode()
    for blob in (text, reprs, exposition):
        leaks = _leaks(blob, WORKER_PW, TENANT_SECRET, urllib.parse.quote(WORKER_PW, safe=""))
        assert not leaks, (leaks, [line for line in blob.splitlines() if any(p in line for p in leaks)][:5])
