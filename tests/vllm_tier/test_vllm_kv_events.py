"""KV events of our tier, through vLLM's own event path, as a router (llm-d, Dynamo) gets them.

vLLM's offloading scheduler drains ``manager.take_events()`` (primary and secondary tiers)
into its ``OffloadingEventsTracker``, which turns them into ``BlockStored``/``BlockRemoved``,
and its ``ZmqEventPublisher`` sends them as msgpack ``KVEventBatch``es. Here the real
``TieringOffloadingManager`` runs our tier over a real Valkey, and the events are read back
from the publisher's replay socket, decoded the way a subscriber decodes them.
"""

from __future__ import annotations

import time
import uuid

import msgspec
import pytest
import zmq
from vllmhelp import expire_everything, keys

from lmcache_valkey.integrations.vllm.events import TierEvents
from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVEventBatch, ZmqEventPublisher
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.events import OffloadingEventsTracker
from vllm.v1.core.kv_cache_utils import BlockHash, maybe_convert_block_hash
from vllm.v1.kv_offload.base import Locality, OffloadingKVEventsConfig, get_offload_block_hash

pytestmark = pytest.mark.timeout(180)

OURS = "ValkeySecondaryTier"


def router_hashes(ks) -> list:
    """The block hashes a router sees for these keys (vLLM's own conversion)."""
    return [maybe_convert_block_hash(BlockHash(get_offload_block_hash(k))) for k in ks]


class Router:
    """vLLM's publisher, and a subscriber that reads every batch it published (replay socket:
    no PUB/SUB join race)."""

    def __init__(self, tmp_path) -> None:
        name = uuid.uuid4().hex[:8]
        self.publisher = ZmqEventPublisher(
            0, endpoint=f"ipc://{tmp_path}/pub-{name}", replay_endpoint=f"ipc://{tmp_path}/replay-{name}")
        self._replay = zmq.Context.instance().socket(zmq.DEALER)
        self._replay.connect(f"ipc://{tmp_path}/replay-{name}")
        self._decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        self._published = 0

    def publish(self, events) -> None:
        self.publisher.publish(KVEventBatch(ts=time.time(), events=list(events)))
        self._published += 1

    def received(self, timeout: float = 30.0) -> list:
        """Every event of every batch published so far, in order, as a subscriber decodes them."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._replay.send_multipart([b"", (0).to_bytes(8, "big")])
            batches = []
            while True:
                assert self._replay.poll(int(timeout * 1000)), "the publisher's replay socket did not answer"
                _, _topic, seq, payload = self._replay.recv_multipart()
                if seq == ZmqEventPublisher.END_SEQ:
                    break
                batches.append(self._decoder.decode(payload))
            if len(batches) == self._published:  # the publisher thread has sent them all
                return [e for b in batches for e in b.events]
            time.sleep(0.05)
        raise AssertionError("the publisher did not send every batch")

    def close(self) -> None:
        self._replay.close(linger=0)
        self.publisher.shutdown()


@pytest.fixture
def router(tmp_path):
    r = Router(tmp_path)
    yield r
    r.close()


def tracker() -> OffloadingEventsTracker:
    return OffloadingEventsTracker(OffloadingKVEventsConfig(enable_kv_cache_events=True, self_describing_kv_events=False))


def ours(events, kind):
    return [e for e in events if isinstance(e, kind) and e.ownership == OURS]


def test_a_router_sees_blocks_valkey_stored_and_then_lost(engines, valkey_server, router) -> None:
    # Four CPU slots: offloading a second prompt pushes the first out of vLLM's own CPU tier,
    # so a later request for it has to ask ours.
    e = engines(valkey_server.url, cpu_blocks=4, events=True, tier_settings={"enable_kv_events": True})
    first, second = keys("router/first", 4), keys("router/second", 4)
    translate = tracker()
    e.offload(first)
    e.offload(second)
    with e.lock:
        router.publish(translate.take_events(list(e.manager.take_events())))
    expire_everything(valkey_server)  # Valkey's TTL (or maxmemory) drops the first prompt
    assert e.fetch(first) == []  # the CPU tier evicted it, Valkey lost it: recomputed
    with e.lock:
        router.publish(translate.take_events(list(e.manager.take_events())))

    events = router.received()
    stored = ours(events, BlockStored)
    assert [h for s in stored for h in s.block_hashes] == router_hashes(first + second)
    assert {(s.medium, s.locality) for s in stored} == {("CPU", Locality.REMOTE.value)}
    (removed,) = ours(events, BlockRemoved)
    assert removed.block_hashes == router_hashes(first) and removed.medium == "CPU"
    # vLLM's CPU tier announced its own eviction of the first prompt, under its own name:
    # a router keeps both residencies apart.
    primary_removed = [e for e in events if isinstance(e, BlockRemoved) and e.ownership is None]
    assert router_hashes(first)[0] in [h for r in primary_removed for h in r.block_hashes]


def test_the_tier_announces_nothing_unless_asked(engines, valkey_server) -> None:
    e = engines(valkey_server.url, cpu_blocks=4, events=True)  # vLLM publishes; the tier is not asked to
    e.offload(keys("quiet", 2))
    with e.lock:
        events = list(tracker().take_events(list(e.manager.take_events())))
    assert events and not [x for x in events if x.ownership == OURS]


def test_tracking_is_bounded_and_forgetting_is_not_a_public_removal() -> None:
    from lmcache_valkey.integrations.vllm.compat import EVENT_METADATA_ONLY

    ev = TierEvents(OURS, Locality.REMOTE, max_tracked=2)
    ks = keys("bounded", 3)
    ev.stored(ks)
    assert ev.tracked() == 2
    events = ev.take()
    assert [x.removed for x in events] == ([False, True] if EVENT_METADATA_ONLY else [False])
    if EVENT_METADATA_ONLY:  # vLLM frees what it kept for the oldest block, and tells no router
        assert events[1].keys == ks[:1] and events[1].metadata_only
        published = list(tracker().take_events(events))
        assert not [x for x in published if isinstance(x, BlockRemoved)]
    # The forgotten block answered absent later is not this server's to report any more.
    ev.answered([bytes(k) for k in ks], [False, False, False], ev.announcements())
    (removal,) = ev.take()
    assert removal.keys == ks[1:]


def test_an_absent_answer_to_a_check_sent_before_the_block_was_stored_removes_nothing() -> None:
    ev = TierEvents(OURS, Locality.REMOTE)
    (k,) = keys("race", 1)
    asked_after = ev.announcements()  # a lookup's check leaves for Valkey...
    ev.stored([k])  # ...a store of the block lands and is announced...
    ev.answered([bytes(k)], [False], asked_after)  # ...then Valkey's answer, from before it landed
    assert [x.removed for x in ev.take()] == [False] and ev.tracked() == 1
    ev.answered([bytes(k)], [False], ev.announcements())  # a check sent after it: a real loss
    assert [x.removed for x in ev.take()] == [True] and ev.tracked() == 0
