"""Sans-I/O parts of tiering: settings validation, breaker, admission, demotion, cost, keys."""

from __future__ import annotations

import pytest

from lmcache_valkey.errors import ConfigError
from lmcache_valkey.tiering import TieringSettings, split_tiering_keys, tiering_settings_from_mapping
from lmcache_valkey.tiering.ledger import ABSENT, DURABLE, WRITING, Ledger, LedgerError
from lmcache_valkey.tiering.markers import data_of, marker_of, marker_value, split_data_key
from lmcache_valkey.tiering.policy import (
    Admission,
    Candidate,
    CircuitBreaker,
    CostModel,
    Demotion,
    MemoryState,
    parse_info_memory,
)
from lmcache_valkey.tiering.tiers import Pins


def test_settings_parse_and_defaults() -> None:
    s = tiering_settings_from_mapping({"tiering": "embedded", "nvme_dir": "/nvme", "nvme_budget_bytes": "2GiB",
                                       "s3_bucket": "my-bucket", "s3_endpoint_url": "http://minio:9000",
                                       "flush_queue_max": "100", "admission": "frequency",
                                       "admission_min_touches": 3, "recompute_budget_s": "0.5"})
    assert s.mode == "embedded" and s.enabled and s.nvme_budget_bytes == 2 << 30
    assert s.flush_queue_max == 100 and s.admission_min_touches == 3 and s.recompute_budget_s == 0.5
    assert tiering_settings_from_mapping({"admission": "second_touch"}).admission_min_touches == 2
    assert tiering_settings_from_mapping({"admission": "always"}).admission_min_touches == 1
    assert not TieringSettings().enabled
    assert tiering_settings_from_mapping({"tiering": True, "nvme_dir": "/x"}).mode == "embedded"
    assert tiering_settings_from_mapping({"tiering": "service"}).enabled  # tiers live in tierd


@pytest.mark.parametrize("raw,key", [
    ({"nvme_budget_bytes": "lots"}, "nvme_budget_bytes"),
    ({"s3_bucket": "Bad_Bucket"}, "s3_bucket"),
    ({"s3_endpoint_url": "minio:9000"}, "s3_endpoint_url"),
    ({"flush_queue_max": 0}, "flush_queue_max"),
    ({"admission": "sometimes"}, "admission"),
    ({"recompute_budget_s": -1}, "recompute_budget_s"),
    ({"tiering": "maybe"}, "tiering"),
    ({"tiering": "embedded"}, "tiering"),  # on, but no tier configured
    ({"demote_low_watermark": 0.9}, "demote_low_watermark"),
    ({"s3_part_bytes": "1MiB"}, "s3_part_bytes"),
    ({"no_such_key": 1}, "no_such_key"),
])
def test_settings_errors_name_the_key(raw, key) -> None:
    with pytest.raises(ConfigError) as e:
        tiering_settings_from_mapping(raw, key_prefix="remote_storage_plugin.valkey.")
    assert e.value.key == "remote_storage_plugin.valkey." + key


def test_split_tiering_keys() -> None:
    mine, rest = split_tiering_keys({"url": "valkey://x", "nvme_dir": "/n", "tiering": "service"})
    assert mine == {"nvme_dir": "/n", "tiering": "service"} and rest == {"url": "valkey://x"}


def test_breaker_states() -> None:
    now = [0.0]
    seen = []
    b = CircuitBreaker(failures=2, reset_s=1.0, clock=lambda: now[0], on_change=seen.append)
    assert b.allow() and b.state == "closed"
    b.failure()
    assert b.state == "closed"
    b.failure()
    assert b.state == "open" and not b.allow()
    now[0] = 1.5
    assert b.state == "half_open" and b.allow() and not b.allow()  # one probe at a time
    b.failure()
    assert b.state == "open"
    now[0] = 3.0
    assert b.allow()
    b.success()
    assert b.state == "closed" and seen == ["open", "half_open", "open", "half_open", "closed"]


def test_admission_second_touch_and_window() -> None:
    a = Admission(2, window=16)
    assert not a.admit(b"k") and a.touch(b"k") == 1 and not a.admit(b"k")
    a.touch(b"k")
    assert a.admit(b"k")
    for i in range(20):
        a.touch(b"x%d" % i)
    assert a.count(b"k") == 0  # aged out of the window
    assert Admission(1).admit(b"new")


def test_demotion_watermarks_and_info_parsing() -> None:
    mem = parse_info_memory(b"# Memory\r\nused_memory:900\r\nmaxmemory:1000\r\n")
    assert mem == MemoryState(900, 1000)
    d = Demotion(high=0.85, low=0.7)
    assert d.bytes_to_free(mem) == 200 and d.bytes_to_free(MemoryState(800, 1000)) == 0
    assert d.bytes_to_free(MemoryState(10**9, 0)) == 0  # no maxmemory: no watermark
    assert d.room_for(MemoryState(800, 1000), 100) == 200 and d.room_for(MemoryState(100, 1000), 100) == 0


def test_cost_model() -> None:
    c = CostModel(alpha=1.0, prior={"nvme": (0.001, 1e9)})
    assert c.expected("nvme", 10**9) == pytest.approx(1.001)
    assert not c.affordable("nvme", 10**9, 0.5) and c.affordable("nvme", 10**6, 0.5)
    c.observe("nvme", 10**8, 1.0, latency_s=0.0)
    assert c.expected("nvme", 10**8) == pytest.approx(1.0, rel=1e-3)


def test_cost_model_recovers_after_a_brownout() -> None:
    """A tier skipped as too slow is never read, so it must be probed to be re-measured."""
    now = [0.0]
    c = CostModel(probe_interval_s=30.0, clock=lambda: now[0])
    n = 0
    while c.affordable("s3", 4 << 20, 2.0) and n < 1000:
        c.observe("s3", 4 << 20, 3.0)  # brownout: every read takes 3 s
        n += 1
    assert n < 1000 and not c.affordable("s3", 4 << 20, 2.0)
    now[0] += 31.0
    assert c.affordable("s3", 4 << 20, 2.0) and c.probes == 1  # one probe read ...
    assert not c.affordable("s3", 4 << 20, 2.0)  # ... not a stream of them
    for _ in range(30):  # the store recovered: the probes measure it
        now[0] += 31.0
        if c.affordable("s3", 4 << 20, 2.0):
            c.observe("s3", 4 << 20, 0.05)
    assert c.affordable("s3", 4 << 20, 2.0)
    assert not c.affordable("s3", 4 << 20, 0.0)  # no budget left: never a probe


def test_cost_model_latency_rises_and_slow_reads_weigh_what_they_cost() -> None:
    c = CostModel(probe_interval_s=1e9)
    for _ in range(50):
        c.observe("s3", 64 << 10, 0.5)  # small objects, latency-bound slowness
    # the estimate follows (the old one could never raise its latency: min(seconds, lat0))
    assert c.expected("s3", 64 << 10) > 0.4 and c.snapshot()["s3"]["latency_s"] > 0.1
    c2 = CostModel(alpha=0.5, prior={"s3": (0.0, 1e9)}, probe_interval_s=1e9)
    c2.observe("s3", 10**8, 0.1, latency_s=0.0)  # 1 GB/s
    c2.observe("s3", 10**8, 10.0, latency_s=0.0)  # 10 MB/s
    # averaging seconds per byte: ~5 s per 100 MB (averaging bandwidth would say ~0.2 s)
    assert c2.expected("s3", 10**8) > 2.0
    c3 = CostModel(prior={"s3": (0.02, 2e8)}, probe_interval_s=1e9)
    c3.failure("s3", 1 << 20, 30.0)  # a read answered (without a usable copy) after 30 s counts
    assert c3.expected("s3", 1 << 20) > 1.0


def test_breaker_probe_released_and_error_classes() -> None:
    from botocore.exceptions import ClientError

    from lmcache_valkey.tiering.object_store import _PRECONDITION, _permanent

    now = [0.0]
    b = CircuitBreaker(1, 1.0, clock=lambda: now[0])
    b.failure()
    now[0] = 2.0
    assert b.allow() and b.probing and not b.allow()
    b.release_probe()  # the probe was cancelled: no verdict
    assert b.state == "half_open" and b.allow()

    def err(code: str, status: int) -> ClientError:
        return ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")

    assert _permanent(err("AccessDenied", 403)) and _permanent(err("NoSuchBucket", 404))
    assert not _permanent(err("SlowDown", 503)) and not _permanent(err("InternalError", 500))
    assert not _permanent(err("RequestTimeout", 400)) and not _permanent(err("ConditionalRequestConflict", 409))
    assert "409" not in _PRECONDITION and "ConditionalRequestConflict" not in _PRECONDITION  # a race: retried


K = b"lmcv:t1:abcd:c:{0011}"


def test_keys_markers_and_pins() -> None:
    assert marker_of(K) == b"lmcv:t1:abcd:t:{0011}" and data_of(marker_of(K)) == K
    assert split_data_key(K) == ("lmcv", "t1", "abcd", "0011")
    assert marker_value(["nvme", "s3"]) == b"ns" and marker_value(["s3"]) == b"s"
    p, ran = Pins(), []
    with p.pin(K):
        assert p.defer(K, lambda: ran.append(1))
        assert ran == []
    assert ran == [1] and not p.defer(K, lambda: None)


def test_a_copy_moves_through_the_ledger_table_and_illegal_events_raise() -> None:
    changes: list[bytes] = []
    led = Ledger(("nvme", "s3"), on_change=changes.append)
    ticket = led.write(K, "s3")
    assert led.state(K, "s3") == WRITING and K not in led and led.tiers_of(K) == []  # not durable yet
    led.found(K, "nvme", 10)
    assert led.tiers_of(K) == ["nvme"] and changes == [K]
    assert led.landed(K, "s3", ticket, 10, 0)
    assert led.tiers_of(K) == ["nvme", "s3"] and led.stats()["s3"] == {"chunks": 1, "bytes": 10}
    led.lost(K, "nvme")  # evicted for space
    assert led.tiers_of(K) == ["s3"]
    assert led.doom(K, "s3") == DURABLE
    assert K not in led and led.doomed("s3") == [K] and led.tiers_of(K) == []
    with pytest.raises(LedgerError):
        led.found(K, "s3", 10)  # an inventory never brings back a copy whose removal is pending
    with pytest.raises(LedgerError):
        led.write(K, "s3")  # nor does a copy-down race the removal
    led.removed(K, "s3")
    assert led.state(K, "s3") == ABSENT and len(led) == 0 and led.doomed() == []
    with pytest.raises(LedgerError):
        led.landed(K, "ram", 1, 10, 0)  # not a lower tier
    assert changes == [K, K, K, K]  # each change of the durable tiers, for the marker


def test_a_write_that_lands_after_a_delete_is_stale_and_undone() -> None:
    led = Ledger(("s3",))
    gen = led.gen(K)
    ticket = led.write(K, "s3")
    led.bump([K])  # a delete ...
    led.doom(K, "s3")  # ... dooms the copy in flight
    assert not led.current(K, gen) and not led.wanted(K, "s3", ticket)
    assert led.landed(K, "s3", ticket, 10, 0) is False  # the caller removes what it wrote
    led.removed(K, "s3")
    assert led.landed(K, "s3", ticket, 10, 0) is False  # landing after the removal: removed again
    newer = led.write(K, "s3")
    assert led.landed(K, "s3", ticket, 10, 0) is True  # a newer write of the same content: kept
    assert led.landed(K, "s3", newer, 10, 0) and led.tiers_of(K) == ["s3"]


def test_a_promotion_holds_the_ram_copy_for_each_reader_until_read_or_its_deadline() -> None:
    led = Ledger(("nvme",))
    led.await_reader(K, until=10.0)
    led.await_reader(K, until=12.0)  # a second caller of the same promotion
    assert led.held(K, now=1.0) == (False, True, False)
    led.reader_done(K)
    assert led.held(K, now=1.0)[1]  # one reader left
    led.reader_done(K)
    assert led.held(K, now=1.0) == (False, False, False)
    led.await_reader(K, until=10.0)
    assert not led.held(K, now=10.0)[1]  # nobody read it in time: it may go
    led.expire_holds(now=10.0)
    assert led.held(K, now=1.0) == (False, False, False)


def test_leases_are_counted_per_chunk_and_bounded() -> None:
    led = Ledger(("nvme",), max_leases=2)
    a, b, c = b"a", b"b", b"c"
    assert led.lease(a, 10.0) is True and led.lease(a, 10.0) is False  # two holders, one lease
    assert led.lease(b, 20.0) is True
    assert led.lease(c, 10.0) is None and led.lease_count == 2  # full: refused
    assert led.release(a) is False and led.release(a) is True  # the last holder ends it
    assert led.lease(c, 10.0) is True
    assert led.leased(b, now=5.0) and not led.leased(b, now=20.0)
    assert sorted(led.expire_holds(now=15.0)) == [c] and led.lease_count == 1


def test_expired_copies_are_not_served_by_the_ledger() -> None:
    led = Ledger(("nvme",))
    led.found(K, "nvme", 10, expires_ms=1)
    assert led.get(K) is None and led.tiers_of(K) == [] and led.expired_keys() == [K]
    led.found(b"lmcv:t1:abcd:c:{0022}", "nvme", 10, expires_ms=None)
    assert led.expiry_unknown(10) == [b"lmcv:t1:abcd:c:{0022}"]


def test_the_demotion_policy_picks_most_idle_first_and_respects_holds() -> None:
    d = Demotion(0.85, 0.70)
    cands = [Candidate(b"a", 100, lower=True), Candidate(b"b", 50, admitted=False),
             Candidate(b"c", 200, lower=True, promoting=True), Candidate(b"d", 300, lower=True, leased=True),
             Candidate(b"e", 5, admitted=True), Candidate(b"f", 150, lower=True),
             Candidate(b"g", 0, lower=True, awaiting_reader=True)]  # promoted, its reader not there yet
    assert [c.key for c in d.plan(cands)] == [b"f", b"a", b"e"]  # b: a one-time prompt, left to Valkey
    assert not d.enough(0, 100, 5) and d.enough(100, 100, 5)
    idle = Demotion(0.85, 0.70, idle_s=30)
    assert not idle.enough(100, 100, 40)  # idle long enough: goes whatever the memory
    assert not idle.enough(0, 0, 40) and idle.enough(0, 0, 10)  # an idle-only pass


def test_tiering_never_imports_store_or_integrations() -> None:
    import ast
    import pathlib

    import lmcache_valkey.tiering as t

    root = pathlib.Path(t.__file__).parent
    for p in root.glob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                mod = ("." * node.level) + node.module
                assert "store" not in mod.split(".") or "object_store" in mod, (p.name, mod)
                assert "integrations" not in mod and "fabric" not in mod, (p.name, mod)
                if "aiobotocore" in mod or "botocore" in mod:
                    assert p.name == "object_store.py", p.name


def test_cost_model_probe_that_beats_a_stale_estimate_restarts_it() -> None:
    """Reads that waited out a black hole are timed as very slow reads; one probe once the
    store answers brings the tier back (issue 28), while a slow probe keeps it skipped."""
    now = [0.0]
    c = CostModel(clock=lambda: now[0])
    for _ in range(3):
        c.observe("s3", 20_000, 12.0)  # answered when the black hole lifted
    assert c.admit("s3", 20_000, 0.5) == c.SKIP
    now[0] += c.probe_interval_s
    assert c.admit("s3", 20_000, 0.5) == c.PROBE
    c.observe("s3", 20_000, 3.0, probe=True)  # still slow: an ordinary sample
    assert c.admit("s3", 20_000, 0.5) == c.SKIP
    now[0] += c.probe_interval_s
    assert c.admit("s3", 20_000, 0.5) == c.PROBE
    c.observe("s3", 20_000, 0.02, probe=True)  # the store answers again
    assert c.expected("s3", 20_000) == pytest.approx(0.02)
    assert c.admit("s3", 20_000, 0.5) == c.READ
