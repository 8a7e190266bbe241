"""What a user sees when things go wrong: misses within deadlines, never wrong hits, never hangs."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from conftest_helpers import SMALL, allocated_bytes, filled, miss_count, payload, put_and_wait
from lmcache_valkey.integrations.lmcache.stack import Layout

BIG = Layout(model="big", num_layers=32, num_kv_heads=8, head_dim=128, chunk_size=32)  # 4 MiB chunks


def data_key(stack, key) -> bytes:
    ns = stack.connector.namespace
    return ns.data_key(ns.chunk_id(key.to_string()))


def store(stack, ids):
    objs = [filled(stack, i) for i in ids]
    want = [payload(o) for o in objs]
    put_and_wait(stack, [stack.layout.key(i) for i in ids], objs)
    for o in objs:
        o.ref_count_down()
    return want


def release(objs):
    for o in objs:
        if o is not None:
            o.ref_count_down()


def test_cancelled_get_never_writes_into_a_reused_buffer(valkey_server, make_stack):
    # LMCache gives up after 1 s and cancels; our op deadline is longer, so the cancel is what stops it.
    stack = make_stack({"url": valkey_server.url, "op_timeout_s": 20, "lookup_timeout_s": 1},
                       layout=BIG, cpu_gb=0.3, blocking_timeout_secs=1)
    want = store(stack, [1, 2, 3, 4])
    baseline = allocated_bytes(stack)
    os.kill(valkey_server.pid, signal.SIGSTOP)  # the server hangs mid-request
    try:
        got = stack.remote.batched_get_blocking([BIG.key(i) for i in (1, 2, 3, 4)])
        assert got == [None] * 4
    finally:
        os.kill(valkey_server.pid, signal.SIGCONT)
    # The cancelled read's buffers went back to the arena, and nothing writes into them any more:
    deadline = time.monotonic() + 10
    while allocated_bytes(stack) != baseline and time.monotonic() < deadline:
        time.sleep(0.01)
    assert allocated_bytes(stack) == baseline
    for _ in range(3):  # reuse the same arena space for other reads while late replies could arrive
        got = stack.remote.batched_get_blocking([BIG.key(i) for i in (4, 3, 2, 1)])
        assert [payload(g) for g in got] == want[::-1]
        release(got)
    assert allocated_bytes(stack) == baseline


def test_server_killed_mid_batch_gives_misses_then_recovers(valkey_server, make_stack):
    stack = make_stack({"url": valkey_server.url, "op_timeout_s": 3, "lookup_timeout_s": 1},
                       layout=BIG, cpu_gb=0.3, blocking_timeout_secs=10)
    store(stack, range(8))
    results = {}

    def reader():
        t = time.monotonic()
        results["got"] = stack.remote.batched_get_blocking([BIG.key(i) for i in range(8)] * 3)
        results["seconds"] = time.monotonic() - t

    th = threading.Thread(target=reader)
    th.start()
    time.sleep(0.02)
    valkey_server.kill9()
    th.join(60)
    assert not th.is_alive(), "a batched get hung after the server died"
    release(results["got"])
    assert stack.remote.batched_contains([BIG.key(0)]) == 0  # dead server: a miss, not an exception

    valkey_server.restart()  # empty, same port
    want = None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # reconnects with backoff
        try:
            want = store(stack, [5])
        except AssertionError:
            continue
        got = stack.remote.get_blocking(BIG.key(5))
        if got is not None:
            assert payload(got) == want[0]
            got.ref_count_down()
            break
        time.sleep(0.2)
    else:
        pytest.fail("no recovery after the server restarted")


@pytest.mark.parametrize(
    "damage,cause",
    [("flip_payload_bit", "crc"), ("truncate", "truncated"), ("append", "truncated"),
     ("foreign_key", "foreign"), ("garbage", "foreign"), ("oversized", "oversized")],
)
def test_damaged_values_are_counted_misses_and_removed(valkey_server, make_stack, damage, cause):
    from lmcache_valkey import codec

    stack = make_stack({"url": valkey_server.url})
    assert stack.connector is not None
    store(stack, [1, 2])
    k1, k2 = data_key(stack, SMALL.key(1)), data_key(stack, SMALL.key(2))
    value = valkey_server.cmd("GET", k1)
    if damage == "flip_payload_bit":
        valkey_server.cmd("SETRANGE", k1, len(value) - 10, bytes([value[-10] ^ 1]))
    elif damage == "truncate":
        valkey_server.cmd("SET", k1, value[: len(value) // 2])
    elif damage == "append":
        valkey_server.cmd("APPEND", k1, b"x" * 4096)
    elif damage == "foreign_key":
        valkey_server.cmd("SET", k1, valkey_server.cmd("GET", k2))  # right namespace, wrong key
    elif damage == "garbage":
        valkey_server.cmd("SET", k1, os.urandom(len(value)))
    else:  # a well-formed chunk under the right key, larger than a full chunk of this layout
        ns = stack.connector.namespace
        big = os.urandom(len(value) * 2)
        meta = codec.ChunkMeta(((len(big),),), ("uint8",), 1, SMALL.key(1).to_string())
        header = codec.encode_header(meta, big, ns.digest_bytes, ns.key_digest(SMALL.key(1).to_string()))
        valkey_server.cmd("SET", k1, bytes(header) + big)
    before = miss_count(cause)
    got = stack.remote.get_blocking(SMALL.key(1))
    assert got is None
    assert miss_count(cause) == before + 1, f"the {cause} miss was not counted"
    deadline = time.monotonic() + 5
    while valkey_server.cmd("EXISTS", k1) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert valkey_server.cmd("EXISTS", k1) == 0, "the bad copy must be deleted"
    good = stack.remote.get_blocking(SMALL.key(2))
    assert good is not None
    good.ref_count_down()


def test_acl_user_cannot_read_another_tenants_chunks(valkey_server, make_stack):
    for user in ("alice", "bob"):
        valkey_server.cmd("ACL", "SETUSER", user, "on", f">{user}-pw", "resetkeys", f"~lmcv:{user}:*", "+@all")
    alice_secret = "alice-secret-0123456789abcdef"
    alice = make_stack({"url": valkey_server.url, "username": "alice", "password": "alice-pw", "tenant": "alice",
                        "tenant_secret": alice_secret})
    assert alice.connector is not None
    store(alice, [1, 2])
    bob_own = make_stack({"url": valkey_server.url, "username": "bob", "password": "bob-pw", "tenant": "bob",
                          "tenant_secret": "bob-secret-fedcba9876543210"})
    assert bob_own.connector is not None
    assert bob_own.remote.batched_contains([SMALL.key(1), SMALL.key(2)]) == 0
    assert bob_own.remote.get_blocking(SMALL.key(1)) is None
    # Bob claims to be tenant alice, even with her secret (so he derives her very keys): the
    # server's ACL refuses, and that is a miss, not a hit.
    bob_as_alice = make_stack({"url": valkey_server.url, "username": "bob", "password": "bob-pw", "tenant": "alice",
                               "tenant_secret": alice_secret})
    assert bob_as_alice.connector is not None  # connected fine; the server refuses alice's keys
    assert bob_as_alice.remote.batched_contains([SMALL.key(1)]) == 0
    assert bob_as_alice.remote.get_blocking(SMALL.key(1)) is None
    got = alice.remote.get_blocking(SMALL.key(1))
    assert got is not None
    got.ref_count_down()


def test_tls_connection_with_a_test_ca(valkey_tls_server, make_stack):
    stack = make_stack({"url": valkey_tls_server.url, "tls_ca_file": valkey_tls_server.tls.ca_file})
    assert stack.connector is not None
    want = store(stack, [1, 2, 3])
    got = stack.remote.batched_get_blocking([SMALL.key(i) for i in (1, 2, 3)])
    assert [payload(g) for g in got] == want
    release(got)


def test_tls_with_an_unknown_ca_fails_at_start(valkey_tls_server, make_stack, tmp_path):
    from support.servers import make_tls_files

    other = make_tls_files(tmp_path / "other")
    stack = make_stack({"url": valkey_tls_server.url, "tls_ca_file": other.ca_file, "connect_timeout_s": 2})
    assert stack.remote.connection is None


def test_valkey_cluster_routes_chunks_to_every_shard(valkey_cluster, make_stack):
    stack = make_stack({"url": valkey_cluster.url})
    ids = list(range(30))
    want = store(stack, ids)
    assert stack.remote.batched_contains([SMALL.key(i) for i in ids]) == 30
    got = stack.remote.batched_get_blocking([SMALL.key(i) for i in ids])
    assert [payload(g) for g in got] == want
    release(got)
    per_node = [s.cmd("DBSIZE") for s in valkey_cluster.servers]
    assert all(n > 0 for n in per_node), per_node
