"""The plugin keeps the contract LMCache's own connector tests expect of a remote backend:
``CreateConnector`` without metadata (LMCache's built-ins take it from the local CPU backend),
``close()`` twice, and the exact LMCache interfaces we implement (pinned: a change in a new
LMCache fails here, not in production)."""

from __future__ import annotations

import asyncio
import inspect
import logging

from conftest_helpers import SMALL, filled, payload
from lmcache.v1.storage_backend.connector import ConnectorAdapter, ConnectorContext, CreateConnector
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

from lmcache_valkey.integrations.lmcache.adapter import ValkeyConnectorAdapter
from lmcache_valkey.integrations.lmcache.connector import ValkeyRemoteConnector


def _run(stack, coro):
    return asyncio.run_coroutine_threadsafe(coro, stack.loop).result(30)


def test_create_connector_without_metadata_uses_the_local_cpu_backends(valkey_server, make_stack, caplog):
    stack = make_stack({"url": valkey_server.url, "tenant": "contract",
                        "tenant_secret": "contract-secret-0123456789"})
    caplog.set_level(logging.ERROR)
    conn = CreateConnector("plugin://valkey", stack.loop, stack.local_cpu, stack.config)  # no metadata
    try:
        inner = conn.getWrappedConnector()
        assert isinstance(inner, ValkeyRemoteConnector)
        # The same namespace as the connector LMCache built with metadata: they share chunks.
        assert inner.namespace.digest == stack.connector.namespace.digest
        key, obj = SMALL.key(7), filled(stack, 7)
        _run(stack, conn.put(key, obj))
        assert conn.exists_sync(key)
        got = _run(stack, stack.connector.get(key))
        assert got is not None and payload(got) == payload(obj)
        got.ref_count_down()
        obj.ref_count_down()
    finally:
        _run(stack, conn.close())
    assert not [r for r in caplog.records if "every lookup will miss" in r.getMessage()]


def test_without_any_metadata_the_error_says_what_lmcache_did_not_pass(valkey_server, make_stack, caplog):
    stack = make_stack({"url": valkey_server.url})
    context = ConnectorContext("plugin://valkey", stack.loop, None, stack.config, None, "valkey")  # a scheduler
    caplog.set_level(logging.ERROR)
    try:
        ValkeyConnectorAdapter().create_connector(context)
    except Exception as e:
        message = str(e)
    else:
        raise AssertionError("a connector without metadata must not start")
    assert "no engine metadata" in message and "SafeLocalCPUBackend" in message
    assert "invalid setting 'config'" not in message
    assert any("could not start" in r.getMessage() for r in caplog.records)  # loud: LMCache swallows it


def test_close_twice_is_harmless(valkey_server, make_stack):
    stack = make_stack({"url": valkey_server.url})
    conn = CreateConnector("plugin://valkey", stack.loop, stack.local_cpu, stack.config, stack.metadata)
    _run(stack, conn.close())
    _run(stack, conn.close())  # LMCache's own backend fixtures do this
    inner = conn.getWrappedConnector()
    inner.close_sync()


# --- the LMCache interfaces we implement, pinned ---------------------------------------------

REMOTE_CONNECTOR = {  # method -> parameter names (self first)
    "__init__": ["self", "config", "metadata"],
    "exists": ["self", "key"],
    "exists_sync": ["self", "key"],
    "get": ["self", "key"],
    "put": ["self", "key", "memory_obj"],
    "list": ["self"],
    "close": ["self"],
    "batched_contains": ["self", "keys"],
    "batched_async_contains": ["self", "lookup_id", "keys", "pin"],
    "batched_get": ["self", "keys"],
    "batched_get_non_blocking": ["self", "lookup_id", "keys"],
    "batched_put": ["self", "keys", "memory_objs"],
    "remove_sync": ["self", "key"],
    "ping": ["self"],
    "support_batched_contains": ["self"],
    "support_batched_async_contains": ["self"],
    "support_batched_get": ["self"],
    "support_batched_get_non_blocking": ["self"],
    "support_batched_put": ["self"],
    "support_ping": ["self"],
    "reshape_partial_chunk": ["self", "memory_obj", "bytes_read"],
}


def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def test_lmcache_remote_connector_interface_is_the_one_we_implement():
    assert RemoteConnector.__abstractmethods__ == {"close", "exists", "exists_sync", "get", "list", "put"}
    for name, params in REMOTE_CONNECTOR.items():
        assert _params(getattr(RemoteConnector, name)) == params, name
    assert inspect.signature(RemoteConnector.batched_async_contains).parameters["pin"].default is False


def test_our_connector_overrides_with_the_same_signatures_and_kinds():
    assert not ValkeyRemoteConnector.__abstractmethods__
    for name, params in REMOTE_CONNECTOR.items():
        if name == "__init__" or name not in vars(ValkeyRemoteConnector):
            continue
        ours, theirs = getattr(ValkeyRemoteConnector, name), getattr(RemoteConnector, name)
        assert _params(ours) == params, name
        assert inspect.iscoroutinefunction(ours) == inspect.iscoroutinefunction(theirs), name
    for name in ("batched_contains", "batched_async_contains", "batched_get", "batched_get_non_blocking",
                 "batched_put", "ping"):
        assert name in vars(ValkeyRemoteConnector), f"{name} falls back to LMCache's default"


def test_lmcache_connector_adapter_interface_is_the_one_we_implement():
    assert ConnectorAdapter.__abstractmethods__ == {"create_connector"}
    assert _params(ConnectorAdapter.__init__) == ["self", "schema"]
    assert _params(ConnectorAdapter.can_parse) == ["self", "url"]
    assert _params(ConnectorAdapter.create_connector) == ["self", "context"]
    assert _params(ConnectorContext.__init__) == ["self", "url", "loop", "local_cpu_backend", "config", "metadata",
                                                  "plugin_name"]
    create = inspect.signature(CreateConnector).parameters
    assert list(create) == ["url", "loop", "local_cpu_backend", "config", "metadata", "plugin_name"]
    assert [create[p].default for p in ("config", "metadata", "plugin_name")] == [None, None, None]
    assert _params(ValkeyConnectorAdapter.can_parse) == ["self", "url"]
    assert _params(ValkeyConnectorAdapter.create_connector) == ["self", "context"]
