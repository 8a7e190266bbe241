"""Fixtures for the SGLang backend tests. They run in .venv-sglang (``bash scripts/test.sh --env
sglang``; scripts/envs/sglang.sh installs SGLang 0.5.23 there); ``scripts/test.sh`` leaves them
out of the main environment, and so does a bare ``pytest tests`` there, which has no SGLang."""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings
from typing import Any, Callable, Iterator

import pytest

def _sglang_installed() -> bool:
    try:
        return importlib.util.find_spec("sglang.srt.mem_cache.hicache_storage") is not None
    except ModuleNotFoundError:
        return False


if not _sglang_installed():
    collect_ignore_glob = ["*.py"]
else:
    sys.path.insert(0, os.path.dirname(__file__))
    # SGLang warns at import that CPU builds lack its GPU quantization kernels.
    warnings.filterwarnings("ignore", message="Only CUDA", category=UserWarning)


@pytest.fixture
def backends() -> Iterator[Callable[..., Any]]:
    """``backends(url, pool=..., **kw)`` builds a registered backend (sglanghelp.py); every one
    is closed after the test."""
    from sglanghelp import make_backend

    made: list[Any] = []

    def make(url: str, **kw: Any) -> Any:
        b = make_backend(url, **kw)
        made.append(b)
        return b

    yield make
    for b in reversed(made):
        b.close()
