"""LMCache's cache events (MP mode) carry what our adapter holds: a coordinator (LMCache's key
directory, or a router reading it) learns of the chunks stored in Valkey and of the chunks
Valkey lost, through LMCache's own path: the adapter's notify calls publish on LMCache's event
bus, its ``CacheEventSubscriber`` batches them, and its ``HttpCacheEventSink`` POSTs them to
``/events``, here a small HTTP server standing in for the coordinator."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from mphelp import CHUNK_BYTES, T1, adapter_of, keys, l2_lookup, wait_for, write

cache_events = pytest.importorskip("lmcache.v1.mp_coordinator.cache_events",
                                   reason="this LMCache has no cache-event path (0.5.6 and later do)")
from lmcache.v1.mp_observability.event_bus import EventBusConfig, init_event_bus  # noqa: E402

pytestmark = pytest.mark.timeout(180)


class Coordinator:
    """Receives ``POST /events`` as LMCache's coordinator does, and keeps every batch."""

    def __init__(self) -> None:
        self.batches: list[dict] = []
        lock = self._lock = threading.Lock()
        batches = self.batches

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    batches.extend(body["batches"])
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def l2(self, event_type: str) -> list[str]:
        """Chunk hashes of every L2 entry of this type, in the order they arrived."""
        with self._lock:
            return [e["key"]["chunk_hash_hex"] for b in self.batches
                    if b["tier"] == "l2" and b["event_type"] == event_type for e in b["entries"]]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def coordinator():
    """LMCache's event bus with its cache-event subscriber posting to a coordinator; the
    process-wide bus is put back (disabled, as LMCache starts it) afterwards."""
    c = Coordinator()
    bus = init_event_bus(EventBusConfig(enabled=True))
    sink = cache_events.HttpCacheEventSink(c.url)
    bus.register_subscriber(cache_events.CacheEventSubscriber(sink, instance_id="mp-a", incarnation=1,
                                                              flush_interval=0))
    bus.start()
    yield c
    bus.stop()
    init_event_bus(EventBusConfig(enabled=False))
    c.close()


def expire_everything(valkey_server) -> None:
    for key in valkey_server.cmd("KEYS", "*"):
        valkey_server.cmd("PEXPIRE", key, 1)
    wait_for(lambda: not [k for k in valkey_server.cmd("KEYS", "*") if valkey_server.cmd("EXISTS", k)], 10,
             "the keys to expire")


def test_the_coordinator_hears_of_chunks_stored_and_of_chunks_valkey_lost(valkey_server, managers, coordinator):
    sm = managers({"url": valkey_server.url, **T1})  # built after the bus: the adapter publishes on it
    adapter = adapter_of(sm)
    lost, kept = keys(range(3), salt="a"), keys(range(3, 5), salt="a")
    write(sm, lost, range(3))
    wait_for(lambda: adapter.get_usage().total_bytes_used == 3 * CHUNK_BYTES, 30, "3 chunks accounted")
    expire_everything(valkey_server)  # a TTL or maxmemory: Valkey drops them without a word
    write(sm, kept, range(3, 5))
    wait_for(lambda: adapter.get_usage().total_bytes_used == 5 * CHUNK_BYTES, 30, "5 chunks accounted")

    # The next lookup sees the loss: LMCache's accounting drops it, and the coordinator hears.
    assert l2_lookup(adapter, lost + kept) == [False] * 3 + [True] * 2
    assert adapter.get_usage().total_bytes_used == 2 * CHUNK_BYTES
    assert adapter.get_usage().bytes_by_cache_salt == {"a": 2 * CHUNK_BYTES}
    hexes = [k.chunk_hash.hex() for k in lost + kept]
    wait_for(lambda: coordinator.l2("delete") == hexes[:3], 30, "the delete events")
    assert coordinator.l2("store") == hexes

    # Once: a second lookup of lost chunks reports nothing more, and accounting stays right.
    assert l2_lookup(adapter, lost) == [False] * 3
    time.sleep(0.5)  # give a wrong second report time to arrive (the check below must see none)
    assert coordinator.l2("delete") == hexes[:3]
    assert adapter.get_usage().total_bytes_used == 2 * CHUNK_BYTES


def test_a_lookup_that_failed_reports_no_loss(valkey_server, managers, coordinator, monkeypatch):
    sm = managers({"url": valkey_server.url, **T1})
    adapter = adapter_of(sm)
    ks = keys(range(2))
    write(sm, ks, range(2))
    wait_for(lambda: adapter.get_usage().total_bytes_used == 2 * CHUNK_BYTES, 30, "2 chunks accounted")

    async def unanswered(chunk_ids):  # what the store returns when Valkey is down or late
        return None

    monkeypatch.setattr(adapter.store, "answer_each", unanswered)
    assert l2_lookup(adapter, ks) == [False, False]
    assert adapter.get_usage().total_bytes_used == 2 * CHUNK_BYTES
    monkeypatch.undo()
    assert l2_lookup(adapter, ks) == [True, True]
    time.sleep(0.5)
    assert coordinator.l2("delete") == []
