"""The secondary-tier contract, as vLLM's own tests check it for its ``fs`` tier
(tests/v1/kv_offload/tiering/test_fs_tier.py), run against our tier and a real Valkey.

The tier is built the way vLLM builds it (vllmhelp.Harness) and driven through
``SecondaryTierManager``'s methods only.
"""

from __future__ import annotations

import time

import pytest
from support.chunks import cut_short, relabelled, rewrite
from vllmhelp import BLOCK, SLOTS, Harness, block_bytes, expire_everything, keys

from lmcache_valkey.errors import ConfigError
from lmcache_valkey.integrations.vllm.lookups import REUSE_S
from vllm.v1.kv_offload.base import Locality, LookupResult, ReqContext

pytestmark = pytest.mark.timeout(120)

@pytest.fixture
def harness(valkey_server):
    made = []

    def make(**kw) -> Harness:
        h = Harness(valkey_server.url, **kw)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


def test_lookup_in_an_empty_tier_misses(harness) -> None:
    assert harness().lookup_and_wait(keys("k", 2)) == [LookupResult.MISS] * 2


def test_a_stored_block_is_a_hit_and_lives_in_valkey(harness, valkey_server) -> None:
    h = harness()
    k = keys("k", 1)
    (r,) = h.store(k, [0])
    assert r.success and r.transfer_bytes == BLOCK and r.transfer_time is not None
    assert h.lookup_and_wait(k, ReqContext(req_id="fresh")) == [LookupResult.HIT]
    assert any(b":c:{" in key for key in valkey_server.cmd("KEYS", "lmcv:default:*"))


@pytest.mark.parametrize("n", [0, 1, 2, 5])
def test_store_then_load_is_byte_exact_into_other_slots(harness, n) -> None:
    h = harness()
    ks = keys("batch", n)
    stored = h.store(ks, list(range(n)))
    assert len(stored) == 1 and stored[0].success
    expected = [h.slot(i) for i in range(n)]
    h.primary[:] = bytes(len(h.primary))  # the data must come from Valkey
    (loaded,) = h.load(ks, list(range(SLOTS - n, SLOTS)))
    assert loaded.success and loaded.successful_keys is None and loaded.transfer_bytes == n * BLOCK
    assert [h.slot(i) for i in range(SLOTS - n, SLOTS)] == expected


def test_loading_a_block_never_stored_fails_the_job(harness) -> None:
    (r,) = harness().load(keys("never", 1), [0])
    assert not r.success and not r.successful_keys
    # RESP: nothing writes into the slot once the read returned, so nothing is held (0.34+).
    assert getattr(r, "deferred_release", None) is None


def test_jobs_are_tracked_independently(harness) -> None:
    h = harness()
    k1, k2 = keys("a", 1) + keys("b", 1)
    h.fill(0, block_bytes(k1, BLOCK))
    h.fill(1, block_bytes(k2, BLOCK))
    j1, j2 = h.job([k1], [0]), h.job([k2], [1])
    h.tier.submit_store(j1)
    h.tier.submit_store(j2)
    assert {r.job_id for r in h.drain()} == {j1.job_id, j2.job_id}
    assert h.lookup_and_wait([k1, k2]) == [LookupResult.HIT] * 2


def test_a_partly_missing_load_keeps_the_blocks_that_arrived_and_misses_the_rest(harness) -> None:
    h = harness()
    present = keys("present", 2)
    h.store(present, [0, 1])
    ks = present + keys("absent", 1)
    assert h.lookup_and_wait(present) == [LookupResult.HIT] * 2
    (r,) = h.load(ks, [5, 6, 7])
    assert not r.success and set(r.successful_keys) == set(present) and r.transfer_bytes == 2 * BLOCK
    assert [h.slot(5), h.slot(6)] == [block_bytes(k, BLOCK) for k in present]
    assert h.lookup_and_wait(ks) == [LookupResult.HIT, LookupResult.HIT, LookupResult.MISS]


def test_a_failed_load_turns_the_requests_hit_into_a_miss_without_probing_again(harness, valkey_server) -> None:
    h = harness()
    k = keys("evicted", 1)
    h.store(k, [0])
    ctx = ReqContext(req_id="livelock")
    assert h.lookup_and_wait(k, ctx) == [LookupResult.HIT]
    valkey_server.cmd("FLUSHALL")  # Valkey evicted it after the lookup
    (r,) = h.load(k, [1])
    assert not r.success
    assert h.tier.lookup(k[0], ctx) is LookupResult.MISS  # at once: no new probe, no retry loop
    assert h.lookup_and_wait(k, ReqContext(req_id="fresh")) == [LookupResult.MISS]


def assert_failed_load_and_deleted(h, valkey_server, k, key: bytes) -> None:
    (r,) = h.load(k, [1])
    assert not r.success
    for _ in range(200):  # the bad copy is deleted in the background
        if valkey_server.cmd("EXISTS", key) == 0:
            break
        time.sleep(0.01)
    assert valkey_server.cmd("EXISTS", key) == 0
    assert h.lookup_and_wait(k, ReqContext(req_id="fresh")) == [LookupResult.MISS]


def test_a_corrupt_block_is_a_failed_load_and_its_copy_is_deleted(harness, valkey_server) -> None:
    h = harness()
    k = keys("corrupt", 1)
    h.store(k, [0])
    (key,) = [x for x in valkey_server.cmd("KEYS", "lmcv:default:*") if b":c:{" in x]
    valkey_server.cmd("SETRANGE", key, 512 + 1000, b"\xff\x00")  # flip payload bytes, same length
    assert_failed_load_and_deleted(h, valkey_server, k, key)


@pytest.mark.parametrize("change", [cut_short, relabelled])
def test_a_block_with_valid_checksums_but_lying_metadata_is_a_failed_load_and_deleted(harness, valkey_server, change) -> None:
    """Rewritten by someone with the tenant's credentials: every CRC and digest checks out, but
    the payload is not the block its metadata describes, or the metadata is not a block."""
    h = harness()
    k = keys(f"lie-{change.__name__}", 1)
    h.store(k, [0])
    (key,) = [x for x in valkey_server.cmd("KEYS", "lmcv:default:*") if b":c:{" in x]
    rewrite(valkey_server, key, change)
    assert_failed_load_and_deleted(h, valkey_server, k, key)


def test_a_slot_outside_the_primary_tier_fails_the_job(harness) -> None:
    h = harness()
    k = keys("oob", 1)
    h.tier.submit_store(h.job(k, [SLOTS]))
    (r,) = h.drain()
    assert not r.success
    (r,) = h.load(k, [SLOTS])
    assert not r.success


def test_a_block_valkey_already_holds_is_not_sent_again(harness) -> None:
    h = harness()
    k = keys("dup", 1)
    h.store(k, [0])
    assert h.lookup_and_wait(k) == [LookupResult.HIT]
    h.tier.get_stats()
    (r,) = h.store(k, [1])
    assert r.success and r.transfer_bytes == 0
    data = h.tier.get_stats().data["data"]["vllm:kv_offload_valkey_blocks"]
    assert data == {(h.tier.tier_type, "store", "skipped"): 1}


def test_drain_waits_for_every_transfer_in_flight_and_never_cuts_one_short(harness) -> None:
    h = harness()
    ks = keys("drain", SLOTS)
    h.store(ks, list(range(SLOTS)))
    expected = [h.slot(i) for i in range(SLOTS)]
    h.primary[:] = bytes(len(h.primary))
    h.tier.submit_load(h.job(ks[:4], [4, 5, 6, 7], promotion=True))
    h.tier.submit_load(h.job(ks[4:], [0, 1, 2, 3], promotion=True))
    h.tier.drain_jobs()
    assert not h.tier.has_pending_work()
    results = list(h.tier.get_finished_jobs())
    assert len(results) == 2 and all(r.success for r in results)
    assert [h.slot(i) for i in (4, 5, 6, 7, 0, 1, 2, 3)] == expected


def test_shutdown_with_jobs_in_flight_returns_and_later_jobs_fail(harness) -> None:
    h = harness()
    ks = keys("shutdown", SLOTS)
    for i in range(SLOTS):
        h.tier.submit_store(h.job([ks[i]], [i]))
    h.tier.shutdown()
    h.tier.submit_store(h.job(ks[:1], [0]))
    results = list(h.tier.get_finished_jobs())
    assert len(results) == SLOTS + 1 and not results[-1].success


def test_stored_blocks_become_kv_events_when_vllm_publishes_them(harness) -> None:
    h = harness(events=True, enable_kv_events=True)
    ks = keys("events", 2)
    h.store(ks, [0, 1])
    (event,) = list(h.tier.take_events())
    assert event.keys == ks and not event.removed and event.locality is Locality.REMOTE
    # This tier owns the state it announces, and will announce its removal.
    assert event.ownership == h.tier.tier_type and event.removal_expected
    assert list(h.tier.take_events()) == []
    quiet = harness(enable_kv_events=True)  # vLLM's KV events are off: the tier stays quiet
    quiet.store(keys("quiet", 1), [0])
    assert list(quiet.tier.take_events()) == []


def test_a_block_valkey_expired_is_a_removal_event_once_a_lookup_sees_it_gone(harness, valkey_server) -> None:
    h = harness(events=True, enable_kv_events=True)
    gone, kept = keys("expires", 2), keys("stays", 1)
    h.store(gone, [0, 1])
    expire_everything(valkey_server)  # what a TTL or maxmemory eviction does, silently
    h.store(kept, [2])
    assert [e.removed for e in h.tier.take_events()] == [False, False]
    assert h.lookup_and_wait(gone + kept, ReqContext(req_id="fresh")) == [LookupResult.MISS] * 2 + [LookupResult.HIT]
    (removal,) = list(h.tier.take_events())
    assert removal.removed and removal.keys == gone and removal.ownership == h.tier.tier_type
    assert not getattr(removal, "metadata_only", False)  # a public removal: routers drop the blocks
    # Reported once: asking again finds them absent again, and says nothing new.
    assert h.lookup_and_wait(gone, ReqContext(req_id="again")) == [LookupResult.MISS] * 2
    assert list(h.tier.take_events()) == []
    # Stored again, announced again.
    h.store(gone, [0, 1])
    (again,) = list(h.tier.take_events())
    assert again.keys == gone and not again.removed


def test_a_lookup_that_failed_proves_nothing_and_removes_nothing(harness, valkey_server, monkeypatch) -> None:
    h = harness(events=True, enable_kv_events=True)
    ks = keys("unanswered", 1)
    h.store(ks, [0])
    list(h.tier.take_events())
    store = h.tier._session.store

    async def unanswered(chunk_ids):  # what the store returns when Valkey is down or late
        return None

    monkeypatch.setattr(store, "answer_each", unanswered)
    assert h.lookup_and_wait(ks, ReqContext(req_id="down")) == [LookupResult.MISS]
    assert list(h.tier.take_events()) == []  # a miss, but not a removal
    monkeypatch.undo()
    expire_everything(valkey_server)
    time.sleep(REUSE_S * 1.5)  # the failed verdict is no longer reused: the next request asks Valkey
    assert h.lookup_and_wait(ks, ReqContext(req_id="up")) == [LookupResult.MISS]
    assert [e.removed for e in h.tier.take_events()] == [True]


def test_the_factory_forwards_locality(harness) -> None:
    assert harness(locality="LOCAL").tier.locality is Locality.LOCAL
    assert harness().tier.locality is Locality.REMOTE


def test_an_invalid_locality_stops_construction_naming_the_key(valkey_server) -> None:
    with pytest.raises(ConfigError) as e:
        Harness(valkey_server.url, locality="nearby")
    assert e.value.key.endswith("].locality")
