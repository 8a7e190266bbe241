"""Fixtures for the vLLM tier tests. They run in .venv-vllm (vLLM 0.33.0, ``bash
scripts/test.sh --env vllm``) and .venv-vllm034 (vLLM 0.34.0, ``--env vllm034``), scripts/envs/;
``scripts/test.sh`` leaves them out
of the main environment, and so does a bare ``pytest tests`` there, which has no vLLM."""

from __future__ import annotations

import importlib.util
from typing import Any, Callable, Iterator

import pytest

if importlib.util.find_spec("vllm") is None:
    collect_ignore_glob = ["*.py"]


@pytest.fixture
def engines() -> Iterator[Callable[..., Any]]:
    """``engines(url, **kw)`` builds an Engine (vllmhelp.py); every one is shut down after the test."""
    from vllmhelp import Engine

    made: list[Engine] = []

    def make(url: str, **kw: Any) -> Engine:
        e = Engine(url, **kw)
        made.append(e)
        return e

    yield make
    for e in reversed(made):
        e.close()
