"""The integrations load with whichever supported LMCache is installed (0.5.6, the 0.5.7 line).

LMCache 0.5.7 moved its in-process modules under ``lmcache.inprocess`` and dropped
``lmcache.v1.token_database``; this file runs in the main environment (0.5.6) and in
``scripts/envs/lmcache057.sh``'s (0.5.7).
"""

from __future__ import annotations

import importlib
import pkgutil

import torch

import lmcache_valkey.integrations.lmcache as lmcache_integration
from conftest_helpers import SMALL
from lmcache_valkey.integrations.lmcache.stack import build_stack
from lmcache_valkey.integrations.lmcache.tokens import chunk_keys


def test_every_lmcache_integration_module_imports_with_the_installed_lmcache():
    # The LMCache adapter's modules only: other engines' adapters import their engine,
    # which lives in its own test environment (scripts/envs/).
    failed = {}
    for mod in pkgutil.walk_packages(lmcache_integration.__path__, lmcache_integration.__name__ + "."):
        try:
            importlib.import_module(mod.name)
        except ImportError as e:
            failed[mod.name] = str(e)
    assert not failed, failed


def test_chunk_keys_are_the_keys_lmcache_itself_computes():
    try:
        from lmcache.v1.token_database import ChunkedTokenDatabase
    except ImportError:
        from lmcache.inprocess.v1.token_database import ChunkedTokenDatabase
    stack = build_stack(SMALL, remote_url=None)
    try:
        tokens = list(range(1000, 1000 + 5 * SMALL.chunk_size + 3))
        ours = chunk_keys(stack.config, stack.metadata, tokens)
        theirs = list(ChunkedTokenDatabase(stack.config, stack.metadata).process_tokens(torch.tensor(tokens)))
        assert len(ours) == 5  # the partial tail chunk is left out
        assert [(s, e, k.to_string()) for s, e, k in ours] == [(s, e, k.to_string()) for s, e, k in theirs[:5]]
    finally:
        stack.close()
