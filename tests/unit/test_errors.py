"""A server's error reply becomes one typed error, decided in one table (errors.py, and the
fabric endpoint's own codes beside it)."""

import pytest

from lmcache_valkey import errors
from lmcache_valkey.errors import (
    AuthError,
    Loading,
    OutOfMemory,
    ProtocolError,
    ReadOnly,
    Redirect,
    ServerError,
    TryAgain,
    server_error,
)


@pytest.mark.parametrize("reply,cls", [
    ("NOAUTH Authentication required.", AuthError),
    ("WRONGPASS invalid username-password pair or user is disabled.", AuthError),
    ("NOPERM User w has no permissions to run the 'flushall' command", AuthError),
    ("OOM command not allowed when used memory > 'maxmemory'.", OutOfMemory),
    ("TRYAGAIN Multiple keys request during rehashing of slot", TryAgain),
    ("READONLY You can't write against a read only replica.", ReadOnly),
    ("LOADING Valkey is loading the dataset in memory", Loading),
    ("ERR unknown command 'FOO'", ServerError),
    ("WRONGTYPE Operation against a key holding the wrong kind of value", ServerError),
])
def test_each_error_reply_maps_to_its_class(reply, cls):
    e = server_error(reply)
    assert type(e) is cls and isinstance(e, ServerError) and e.message == reply


def test_a_redirection_carries_its_slot_and_node():
    moved = server_error("MOVED 3999 10.0.0.2:6381")
    assert isinstance(moved, Redirect) and (moved.kind, moved.slot, moved.host, moved.port) == ("MOVED", 3999, "10.0.0.2", 6381)
    ask = server_error("ASK 12 :6380")  # an empty host: the node that answered
    assert isinstance(ask, Redirect) and (ask.kind, ask.slot, ask.host, ask.port) == ("ASK", 12, "", 6380)
    for bad in ("MOVED 99999 h:1", "MOVED x h:1", "ASK 12 h:0", "MOVED 12"):
        assert isinstance(server_error(bad), ProtocolError), bad


def test_every_table_entry_is_a_typed_server_error_with_a_metrics_cause():
    from lmcache_valkey import metrics

    for prefix, make in errors.SERVER_ERROR_PREFIXES.items():
        e = make(f"{prefix} 1 h:1" if prefix in ("MOVED", "ASK") else f"{prefix} x")
        assert isinstance(e, ServerError) and e.prefix == prefix, prefix
        assert e.cause in metrics.ERROR_CAUSES, (prefix, e.cause)


def test_the_fabric_endpoint_codes_map_once_too():
    from lmcache_valkey.transport.fabric import commands
    from lmcache_valkey.transport.fabric.errors import NoFabricSession, ServerDeadline

    assert isinstance(commands.map_error("NOHELLO no session"), NoFabricSession)
    timeout = commands.map_error("TIMEOUT deadline passed inflight=3")
    assert isinstance(timeout, ServerDeadline) and timeout.inflight == 3
    assert isinstance(commands.map_error("TRYAGAIN slot migrating"), TryAgain)  # the server's table
