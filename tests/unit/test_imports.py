"""Every module of the package imports on this Python (the py310/py312/py313 environments run
this file too); only an engine or optional library that is not installed may stop one."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import lmcache_valkey

# Modules that import an engine (or its torch) only exist to be loaded by that engine.
OPTIONAL = {"lmcache", "torch", "vllm", "sglang", "transformers", "aiobotocore", "botocore"}


def _modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(lmcache_valkey.__path__, "lmcache_valkey."))


@pytest.mark.parametrize("name", _modules())
def test_module_imports(name):
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in OPTIONAL:
            raise
        pytest.skip(f"{name} needs {e.name}, not installed in this environment")
