"""The allow-lists are exact: an LMCache worker (tiering through tierd) and tierd itself,
each logged in with its documented ACL line, do their whole job while MONITOR records every
command they send. Each sends only what its line allows, and its line allows nothing it
does not send."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lmcache_valkey import acl
from support.acl_lines import setuser

pytestmark = pytest.mark.timeout(240)

_LINE = re.compile(rb"^\+[\d.]+ \[\d+ ([^\]]+)\] (.*)$")
_ARG = re.compile(rb'"((?:[^"\\]|\\.)*)"')
_SUB = {"object", "cluster", "client", "config", "acl", "script", "function", "memory"}


class Monitor:
    """MONITOR as the admin user, and which ACL user each client address belongs to."""

    def __init__(self, server) -> None:
        self.server = server
        self.sock = socket.create_connection((server.host, server.port))
        self.sock.sendall(b"MONITOR\r\n")
        self.users: dict[str, str] = {}
        self.seen: list[tuple[str, str]] = []  # (client address or "lua", command)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._read, daemon=True),
                         threading.Thread(target=self._who, daemon=True)]
        for t in self._threads:
            t.start()

    def _read(self) -> None:
        buf = b""
        while not self._stop.is_set():
            try:
                data = self.sock.recv(1 << 16)
            except OSError:
                return
            if not data:
                return
            buf += data
            *lines, buf = buf.split(b"\r\n")
            for line in lines:
                m = _LINE.match(line)
                if not m:
                    continue
                args = [a.decode(errors="replace").lower() for a in _ARG.findall(m.group(2))]
                if args:
                    cmd = f"{args[0]}|{args[1]}" if args[0] in _SUB and len(args) > 1 else args[0]
                    self.seen.append((m.group(1).decode(), cmd))

    def _who(self) -> None:
        while not self._stop.is_set():
            try:
                for line in self.server.cmd("CLIENT", "LIST").decode().splitlines():
                    f = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
                    self.users[f["addr"]] = f["user"]
            except Exception:  # noqa: BLE001 - the server is stopping
                return
            time.sleep(0.02)

    def sent_by(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for addr, cmd in self.seen:
            user = "lua" if addr == "lua" else self.users.get(addr, f"unknown {addr}")
            out.setdefault(user, set()).add(cmd)
        return out

    def close(self) -> None:
        self._stop.set()
        self.sock.close()


def _wait(pred, what: str, seen=lambda: None, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, f"timed out: {what} ({seen()})"
        time.sleep(0.05)


def test_worker_and_tierd_send_exactly_what_their_lines_allow(valkey_server, make_stack, nvme_dir, moto_s3, tmp_path,
                                                              monkeypatch):
    from conftest_helpers import SMALL, filled, put_and_wait  # tests/lmcache

    from lmcache_valkey.tiering import protocol

    setuser(valkey_server, acl.worker_line("team-a", "team-a", tiering=True), "pw")
    setuser(valkey_server, acl.tierd_line("lmcv-tierd", "team-a"), "tierd-pw")
    moto_s3.create_bucket()
    mon = Monitor(valkey_server)
    exe = Path(sys.executable).with_name("lmcache-valkey")
    log = open(tmp_path / "tierd.log", "wb")
    tierd = subprocess.Popen(
        [str(exe), "tierd", "--valkey-url", valkey_server.url, "--tenant", "team-a", "--nvme-dir", nvme_dir,
         "--nvme-budget-bytes", "64MiB", "--s3-bucket", moto_s3.bucket, "--s3-endpoint-url", moto_s3.url, "--admission", "always", "--set", "request_block_s=0.2",
         "--set", "demote_interval_s=0.2", "--set", "demote_idle_s=3600", "--set", "marker_repair_s=0.5"],
        stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, "LMCACHE_VALKEY_USERNAME": "lmcv-tierd", "LMCACHE_VALKEY_PASSWORD": "tierd-pw"})
    # The worker's request list at its smallest bound: every push is followed by its LTRIM.
    monkeypatch.setattr(protocol, "REQUEST_MAX", 0)
    try:
        stack = make_stack({"url": valkey_server.url, "username": "team-a", "password": "pw", "tenant": "team-a",
                            "tenant_secret": "team-a-secret-0123456789", "tiering": "service",
                            "cluster": "no"})  # as documented: the worker line grants no INFO
        assert stack.connector is not None, "the plugin failed to start under its ACL line"
        store = stack.connector.store
        run = stack.connector._io.run_sync
        keys = [SMALL.key(i) for i in range(4)]
        objs = [filled(stack, i) for i in range(4)]
        put_and_wait(stack, keys, objs)
        for o in objs:
            o.ref_count_down()
        assert stack.remote.batched_contains(keys) == 4
        ids = [stack.connector._ref(k).chunk_id for k in keys]
        data = [store.namespace.data_key(c) for c in ids]
        _wait(lambda: all(valkey_server.cmd("EXISTS", store.namespace.marker_key(c)) for c in ids), "copies on NVMe")
        assert all(h is not None for h in run(store.peek_headers(ids), 10))  # header peeks (GETRANGE)
        valkey_server.cmd("UNLINK", *data)  # an operator evicts the RAM copies: the next get promotes
        got = stack.remote.batched_get_blocking(keys)
        assert all(g is not None for g in got)
        for g in got:
            g.ref_count_down()
        assert stack.connector.remove_sync(keys[0])  # a coordinated delete through tierd
        assert run(store.ping(), 10)
        _wait(lambda: {"zrange", "zrem", "object|idletime", "hdel", "info", "multi", "exec"}
              <= mon.sent_by().get("lmcv-tierd", set()),
              "tierd's background pass", lambda: sorted(mon.sent_by().get("lmcv-tierd", set())))
    finally:
        tierd.terminate()
        tierd.wait(timeout=60)
        log.close()
        mon.close()
    # Nothing refused: nobody sent a command outside its line (every refusal is logged).
    refused = valkey_server.cmd("ACL", "LOG")
    assert refused == [], [dict(zip(e[::2], e[1::2])) for e in refused]
    # And each line allows nothing its principal did not send. (Addresses CLIENT LIST never
    # showed are this test's own short admin connections.)
    sent = mon.sent_by()
    worker, tierd_sent = sent.get("team-a", set()), sent.get("lmcv-tierd", set()) | sent.get("lua", set())
    assert worker - {"auth"} == set(acl.worker_commands(tiering=True)), "worker line != what the worker sends"
    assert tierd_sent - {"auth"} == set(acl.tierd_commands()), "tierd line != what tierd sends"
