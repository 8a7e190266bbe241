"""Every transport declares the store's contract (store.ChunkTransport): the same methods,
the same parameters, coroutine or async generator alike, and the two capabilities the store
relies on (``supports_release_callbacks``, ``register``) stated rather than probed."""

from __future__ import annotations

import inspect

import pytest

from lmcache_valkey.store import ChunkTransport
from lmcache_valkey.transport.blob_tcp import BlobTcpClient
from lmcache_valkey.transport.fabric.cluster import ClusterFabricTransport
from lmcache_valkey.transport.fabric.transport import FabricTransport
from lmcache_valkey.transport.memory import MemoryTransport
from lmcache_valkey.transport.resp import RespClient

TRANSPORTS = [RespClient, BlobTcpClient, FabricTransport, ClusterFabricTransport, MemoryTransport]
RMA = {FabricTransport, ClusterFabricTransport}


def _contract() -> dict[str, inspect.Signature]:
    return {name: inspect.signature(fn) for name, fn in vars(ChunkTransport).items()
            if callable(fn) and not name.startswith("_")}


def _accepts(impl: inspect.Signature, contract: inspect.Signature) -> bool:
    """``impl`` takes every argument the contract passes, the same way (it may add optional ones)."""
    have = list(impl.parameters.values())[1:]
    by_name = {p.name: p for p in have}
    positional = [p.name for p in have if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    want = list(contract.parameters.values())[1:]
    if [p.name for p in want if p.kind is not p.KEYWORD_ONLY] != positional[: sum(p.kind is not p.KEYWORD_ONLY for p in want)]:
        return False
    if any(p.name not in by_name or by_name[p.name].kind is p.POSITIONAL_ONLY for p in want):
        return False
    extra = [p for p in have if p.name not in {w.name for w in want}]
    return all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in extra)


@pytest.mark.parametrize("cls", TRANSPORTS, ids=lambda c: c.__name__)
def test_each_transport_implements_the_store_contract(cls):
    contract = _contract()
    assert {"get_many_into", "set_many", "exists_many", "delete", "scan_iter", "ping", "close",
            "getrange_into", "register"} <= set(contract)
    for name, sig in contract.items():
        impl = getattr(cls, name, None)
        assert impl is not None, f"{cls.__name__} lacks {name}"
        want = getattr(ChunkTransport, name)
        if name == "scan_iter":  # declared as returning an async iterator; implemented as an async generator
            assert inspect.isasyncgenfunction(impl), cls.__name__
        else:
            assert inspect.iscoroutinefunction(impl) == inspect.iscoroutinefunction(want), (cls.__name__, name)
        assert _accepts(inspect.signature(impl), sig), (cls.__name__, name, inspect.signature(impl))


@pytest.mark.parametrize("cls", TRANSPORTS, ids=lambda c: c.__name__)
def test_each_transport_states_whether_the_server_writes_into_buffers(cls):
    assert cls.supports_release_callbacks is (cls in RMA)
    if cls in RMA:  # the store passes on_release: the server writes, possibly after a call gave up
        assert "on_release" in inspect.signature(cls.get_many_into).parameters


def test_the_store_no_longer_probes_transports():
    import ast
    import pathlib

    import lmcache_valkey.store as store

    tree = ast.parse(pathlib.Path(store.__file__).read_text())
    probes = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") in ("getattr", "hasattr")
              and isinstance(n.args[0], ast.Attribute) and n.args[0].attr == "transport"]
    assert probes == []
