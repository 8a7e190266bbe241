"""A server that lies about its SCAN cursor cannot keep a listing going forever.

Every SCAN loop -- the store's chunk listing (LMCache's ``list``, the MP adapter's key pages,
the SGLang backend's ``clear``), tierd's demotion, marker repair and ``evict`` -- walks
through one bounded walk per node (docs/scan-bounds.md). Against a real asyncio server
that answers SCAN with a cursor that never reaches 0, each ends within its bound with a
counted ``TransportError``; a real Valkey's walk is untouched.
"""

from __future__ import annotations

import asyncio
import itertools

import pytest
from prometheus_client.parser import text_string_to_metric_families

from lmcache_valkey import metrics
from lmcache_valkey.config import settings_from_mapping
from lmcache_valkey.errors import DeadlineExceeded, ProtocolError, TransportError
from lmcache_valkey.keys import make_namespace
from lmcache_valkey.store import open_store
from lmcache_valkey.transport import scan
from lmcache_valkey.transport.fabric.transport import FabricTransport
from support.hostile import HostileServer, bulk

pytestmark = pytest.mark.timeout(120)

NS = make_namespace("lmcv", "default", {"model": "scan-test"})
# What a test allows a refused walk (the loop it replaces never ended at all).
WITHIN_S = 30.0


def scan_errors(cause: str) -> float:
    for fam in text_string_to_metric_families(metrics.render_latest().decode()):
        for s in fam.samples:
            if s.name == "lmcache_valkey_errors_total" and s.labels == {"op": "scan", "cause": cause}:
                return s.value
    return 0.0


def scan_reply(cursor: bytes, keys: list[bytes] = ()) -> bytes:
    return b"*2\r\n" + bulk(cursor) + b"*%d\r\n" % len(keys) + b"".join(bulk(k) for k in keys)


def cursors_from(seq):
    """A lie: SCAN answers the cursors of ``seq`` in turn, with no keys."""
    it = iter(seq)

    def lie(name: bytes, args: list[bytes]):
        return scan_reply(next(it)) if name == b"SCAN" else None

    return lie


def key(i: int) -> bytes:
    return NS.data_key(NS.chunk_id(f"k{i}"))


LYING_WALKS = {
    "the same non-zero cursor forever": (cursors_from(itertools.repeat(b"7")), ProtocolError, "protocol"),
    "a cycle of three cursors": (cursors_from(itertools.cycle([b"5", b"9", b"12"])), ProtocolError, "protocol"),
    "a long run, then a cycle": (cursors_from(itertools.chain((b"%d" % i for i in range(1, 300)),
                                                              itertools.cycle([b"300", b"301"]))),
                                 ProtocolError, "protocol"),
    "a cursor that is not a number": (cursors_from(itertools.repeat(b"abc")), ProtocolError, "protocol"),
    "a cursor past 64 bits": (cursors_from(itertools.repeat(b"18446744073709551616")), ProtocolError, "protocol"),
    "a negative cursor": (cursors_from(itertools.repeat(b"-3")), ProtocolError, "protocol"),
    "an integer instead of a reply": (lambda n, a: b":5\r\n" if n == b"SCAN" else None, ProtocolError, "protocol"),
}


async def _list_through_store(server: HostileServer) -> list[str]:
    settings = settings_from_mapping({"url": server.url, "cluster": "no", "op_timeout_s": 1,
                                      "connect_timeout_s": 2}, env={})
    store = await open_store(settings, NS)
    try:
        return await asyncio.wait_for(store.list_ids(), WITHIN_S)
    finally:
        await store.close()


async def _list_through_fabric_bulk(server: HostileServer) -> list[bytes]:
    t = FabricTransport("127.0.0.1", server.port, data_path="bulk", connections=1)
    try:
        return await asyncio.wait_for(_collect(t.scan_iter(NS.data_pattern())), WITHIN_S)
    finally:
        await t.close()


async def _collect(it) -> list:
    return [k async for k in it]


@pytest.mark.parametrize("through", [_list_through_store, _list_through_fabric_bulk], ids=["resp", "fabric"])
@pytest.mark.parametrize("lie,error,cause", LYING_WALKS.values(), ids=LYING_WALKS.keys())
async def test_a_lying_cursor_ends_the_listing_with_a_counted_error(through, lie, error, cause) -> None:
    with HostileServer(lie) as server:
        before = scan_errors(cause)
        with pytest.raises(error):
            await through(server)
        assert scan_errors(cause) == before + 1


@pytest.mark.parametrize("through", [_list_through_store, _list_through_fabric_bulk], ids=["resp", "fabric"])
async def test_ever_new_cursors_end_when_the_walks_time_budget_is_spent(through, monkeypatch) -> None:
    """No cursor repeats and no key comes: only the budget of reply time stops the walk."""
    monkeypatch.setattr(scan, "SCAN_BUDGET_S", 0.5)
    with HostileServer(cursors_from(b"%d" % i for i in itertools.count(1))) as server:
        before = scan_errors("deadline")
        with pytest.raises(DeadlineExceeded, match="SCAN"):
            await through(server)
        assert scan_errors("deadline") == before + 1


async def test_ever_new_keys_end_at_the_walks_key_bound(monkeypatch) -> None:
    monkeypatch.setattr(scan, "SCAN_MAX_KEYS", 1000)
    n = itertools.count(1)

    def lie(name: bytes, args: list[bytes]):
        if name != b"SCAN":
            return None
        i = next(n)
        return scan_reply(b"%d" % i, [key(i * 100 + j) for j in range(100)])

    with HostileServer(lie) as server:
        before = scan_errors("protocol")
        with pytest.raises(ProtocolError, match="keys"):
            await _list_through_store(server)
        assert scan_errors("protocol") == before + 1


async def test_a_key_outside_the_namespace_is_skipped_and_counted() -> None:
    other = make_namespace("lmcv", "other-tenant", {"model": "scan-test"})
    answers = iter([scan_reply(b"3", [key(1), other.data_key(other.chunk_id("x"))]),
                    scan_reply(b"0", [b"\xff\xfe not a key", key(2)])])

    def lie(name: bytes, args: list[bytes]):
        return next(answers) if name == b"SCAN" else None

    with HostileServer(lie) as server:
        before = scan_errors("protocol")
        assert await _list_through_store(server) == [NS.chunk_id("k1"), NS.chunk_id("k2")]
        assert scan_errors("protocol") == before + 2


async def test_a_real_walk_over_many_keys_is_not_refused(valkey_server) -> None:
    """Real Valkey, thousands of keys, COUNT 1: thousands of steps, no cursor repeats."""
    import valkey

    r = valkey.Valkey(host="127.0.0.1", port=valkey_server.port)
    pipe = r.pipeline(transaction=False)
    for i in range(3000):
        pipe.set(key(i), b"v")
        pipe.set(b"other:%d" % i, b"v")
    pipe.execute()
    settings = settings_from_mapping({"url": valkey_server.url, "cluster": "no"}, env={})
    store = await open_store(settings, NS)
    try:
        found = [k async for k in store.transport.scan_iter(NS.data_pattern(), count=1)]
        assert sorted(set(found)) == sorted(key(i) for i in range(3000))
    finally:
        await store.close()
        r.close()


def test_a_walk_refuses_the_first_repeated_cursor_of_any_cycle() -> None:
    """Brent's detection: constant memory, every cycle found within a few times its length."""
    for tail, cycle in [(0, 1), (0, 2), (1, 1), (5, 3), (100, 37), (1000, 1)]:
        walk = scan.ScanWalk("test")
        cursors = itertools.chain(range(1, tail + 1), itertools.cycle(range(tail + 1, tail + cycle + 1)))
        with pytest.raises(ProtocolError, match="second time"):
            for c in itertools.islice(cursors, 10 * (tail + cycle) + 10):
                walk.left_s()
                walk.step([b"%d" % c, []])
        assert walk.steps <= 3 * (tail + cycle) + 2, (tail, cycle, walk.steps)


def test_a_walk_ends_at_cursor_zero_and_takes_integer_cursors() -> None:
    walk = scan.ScanWalk("test")
    walk.left_s()
    assert walk.step([b"12", [b"a"]]) == [b"a"] and walk.cursor == b"12" and not walk.done
    walk.left_s()
    assert walk.step([0, [b"b"]]) == [b"b"] and walk.done


def test_the_error_is_a_transport_error_callers_already_handle() -> None:
    assert issubclass(ProtocolError, TransportError) and issubclass(DeadlineExceeded, TransportError)


