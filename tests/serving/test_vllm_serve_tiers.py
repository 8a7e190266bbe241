"""The same two-server story through the fabric fast path (the reference module over
``tcp;ofi_rxm``) and through the tiered config with the prefix only on NVMe."""

from __future__ import annotations

from typing import Any

import pytest
from servehelp import CHUNK, PREFIX, QUESTION_1, QUESTION_2, prompt, same_answer, settle, wait_for

from lmcache_valkey.serving.tiny_model import vocab_size
from lmcache_valkey.serving.vllm_server import lmcache_config
from support.servers import ValkeyServer, endpoint_args

pytestmark = pytest.mark.timeout(900)

FULL_CHUNKS = PREFIX // CHUNK


def share(vllm_servers: Any, tag: str, config: dict, manual: list[int]) -> tuple[Any, Any, Any]:
    """A computes ``manual`` + either question and stops; a fresh B answers question 2 on it.
    Returns (B, B's answer, A's answer to the same prompt)."""
    a = vllm_servers(f"A-{tag}", lmcache=config).wait_ready()
    first = a.complete(manual + QUESTION_1)
    assert first.status == 200, first.body
    reference = a.complete(manual + QUESTION_2)
    a.stop()
    b = vllm_servers(f"B-{tag}", lmcache=config).wait_ready()
    return b, b.complete(manual + QUESTION_2), reference


def test_through_the_fabric_fast_path(vllm_servers, tiny_model):
    valkey = ValkeyServer(args=endpoint_args(arena_mb=128)).start()
    try:
        config = lmcache_config(valkey.url, transport="fabric", fabric_provider="tcp;ofi_rxm",
                                fabric_bind_addr="127.0.0.1")
        manual = prompt(11, vocab=vocab_size(tiny_model))

        b, answer, reference = share(vllm_servers, "fabric", config, manual)

        assert same_answer(answer, reference) is None, same_answer(answer, reference)
        assert b.metric("lmcache_valkey_hits_total", tier="ram", transport="fabric") == FULL_CHUNKS
        assert b.metric("vllm:external_prefix_cache_hits_total") == PREFIX
        assert b.metric("lmcache_valkey_fabric_fallbacks_total") == 0
    finally:
        valkey.stop()


def test_tiered_with_the_prefix_only_on_nvme(vllm_servers, tiny_model, tmp_path):
    valkey = ValkeyServer().start()
    try:
        config = lmcache_config(valkey.url, transport="tcp", tiering="embedded",
                                nvme_dir=str(tmp_path / "nvme"), admission="always")
        manual = prompt(12, vocab=vocab_size(tiny_model))
        a = vllm_servers("A-nvme", lmcache=config).wait_ready()
        first = a.complete(manual + QUESTION_1)
        reference = a.complete(manual + QUESTION_2)
        assert first.status == reference.status == 200
        # Every chunk's lower-tier copy is written behind (its marker key says so) ...
        markers = lambda: [k for k in valkey.cmd("KEYS", "*") if b":t:{" in k]  # noqa: E731
        wait_for(lambda: len(markers()) >= FULL_CHUNKS, 60, "NVMe copies of A's chunks")
        a.stop()
        settle(valkey)
        # ... then RAM loses them all (as under memory pressure): only NVMe holds the prefix.
        data = [k for k in valkey.cmd("KEYS", "*") if b":c:{" in k]
        assert len(data) >= FULL_CHUNKS
        valkey.cmd("DEL", *data)

        b = vllm_servers("B-nvme", lmcache=config).wait_ready()
        answer = b.complete(manual + QUESTION_2)

        assert same_answer(answer, reference) is None, same_answer(answer, reference)
        assert b.metric("lmcache_valkey_promotions_total", from_tier="nvme") == FULL_CHUNKS
        assert b.metric("vllm:external_prefix_cache_hits_total") == PREFIX
    finally:
        valkey.stop()
