"""The L2AdapterInterface contract, driven the way LMCache's controllers drive it: real Valkey,
LMCache's own MemoryObjs over one L1 buffer (its L2 benchmark's helpers), our adapter built by
LMCache's plugin factory."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time

import pytest
import torch
from lmcache.cli.commands.bench.l2_adapter_bench.data import create_l1_memory_desc, make_memory_objects
from lmcache.v1.distributed.l2_adapters import create_l2_adapter
from lmcache.v1.distributed.l2_adapters.config import parse_args_to_l2_adapters_config
from lmcache.v1.platform import consume_fd
from mphelp import T1, keys, make_manager, spec, wait_for

from lmcache_valkey.errors import ConfigError

pytestmark = pytest.mark.timeout(180)

SIZE = 64 << 10


class Harness:
    """One adapter built by LMCache's factory from a plugin JSON, plus an L1 buffer."""

    def __init__(self, params: dict, n: int = 64) -> None:
        import argparse

        cfg = parse_args_to_l2_adapters_config(argparse.Namespace(l2_adapter=[json.dumps(spec(params))]))
        self.buffer = torch.zeros(n * SIZE, dtype=torch.uint8)
        self.adapter = create_l2_adapter(cfg.adapters[0], l1_memory_desc=create_l1_memory_desc(self.buffer))
        self.next = 0

    def objs(self, n: int, fill: int) -> list:
        out = make_memory_objects(self.buffer, n, SIZE, self.next * SIZE, fill_offset=fill)
        self.next += n
        return out

    def wait(self, fd: int, timeout: float = 30.0) -> None:
        p = select.poll()
        p.register(fd, select.POLLIN)
        assert p.poll(timeout * 1000), "no completion signalled"
        try:
            consume_fd(fd)
        except BlockingIOError:
            pass

    def store(self, ks, objs) -> object:
        tid = self.adapter.submit_store_task(ks, objs)
        done: dict = {}
        end = time.monotonic() + 30
        while tid not in done:
            assert time.monotonic() < end
            self.wait(self.adapter.get_store_event_fd())
            done.update(self.adapter.pop_completed_store_tasks())
        return done[tid]

    def lookup(self, ks) -> list[bool]:
        tid = self.adapter.submit_lookup_and_lock_task(ks, {})
        return self._bits(tid, self.adapter.get_lookup_and_lock_event_fd(), self.adapter.query_lookup_and_lock_result, len(ks))

    def load(self, ks, objs) -> list[bool]:
        tid = self.adapter.submit_load_task(ks, objs)
        return self._bits(tid, self.adapter.get_load_event_fd(), self.adapter.query_load_result, len(ks))

    def _bits(self, tid, fd, query, n) -> list[bool]:
        end = time.monotonic() + 30
        while True:
            r = query(tid)
            if r is not None:
                assert query(tid) is None, "a result is handed out once"
                return [r.test(i) for i in range(n)]
            assert time.monotonic() < end, "task did not finish"
            self.wait(fd, 1.0) if _readable(fd) else time.sleep(0.005)

    def close(self) -> None:
        self.adapter.close()


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


@pytest.fixture
def harness(valkey_server):
    made = []

    def make(params=None, **kw):
        h = Harness({"url": valkey_server.url, **T1, **(params or {})}, **kw)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


def test_three_distinct_event_fds_and_each_kind_wakes_only_its_own(harness):
    h, other = harness(), harness()
    fds = [h.adapter.get_store_event_fd(), h.adapter.get_lookup_and_lock_event_fd(), h.adapter.get_load_event_fd()]
    fds2 = [other.adapter.get_store_event_fd(), other.adapter.get_lookup_and_lock_event_fd(), other.adapter.get_load_event_fd()]
    assert len(set(fds + fds2)) == 6
    ks = keys(range(4))
    assert h.store(ks, h.objs(4, 1)).is_successful()
    assert not _readable(fds[1]) and not _readable(fds[2])
    h.adapter.submit_lookup_and_lock_task(ks, {})
    wait_for(lambda: _readable(fds[1]), 10, "lookup fd")
    assert not _readable(fds[0]) and not _readable(fds[2])


def test_store_lookup_load_unlock_byte_exact(harness):
    h = harness()
    ks = keys(range(8))
    src = h.objs(8, 7)
    r = h.store(ks, src)
    assert r.is_successful() and r.bytes_transferred() == 8 * SIZE
    assert h.lookup(ks + keys([99])) == [True] * 8 + [False]
    assert h.adapter.report_status()["locked_keys"] == 8
    dst = h.objs(8, 200)
    assert h.load(ks, dst) == [True] * 8
    assert all(torch.equal(a.raw_data, b.raw_data) for a, b in zip(src, dst))
    h.adapter.submit_unlock(ks)
    assert h.adapter.report_status()["locked_keys"] == 0


def test_two_controller_threads_submit_at_once(harness):
    """The store controller and the prefetch controller call from their own threads."""
    h = harness(n=256)
    errors: list[BaseException] = []
    batches = [(keys(range(i * 8, i * 8 + 8)), h.objs(8, i)) for i in range(12)]

    def storer() -> None:
        try:
            ids = [h.adapter.submit_store_task(k, o) for k, o in batches]
            done: dict = {}
            end = time.monotonic() + 60
            while len(done) < len(ids):
                assert time.monotonic() < end
                if _readable(h.adapter.get_store_event_fd()):
                    consume_fd(h.adapter.get_store_event_fd())
                done.update(h.adapter.pop_completed_store_tasks())
                time.sleep(0.002)
            assert set(done) == set(ids) and all(r.is_successful() for r in done.values())
        except BaseException as e:
            errors.append(e)

    def prefetcher() -> None:
        try:
            for i in range(12):
                ks = keys(range(i * 8, i * 8 + 8))
                h.lookup(ks)  # found or not yet: each result exactly once
                h.adapter.submit_unlock(ks)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=storer), threading.Thread(target=prefetcher)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    every = [k for ks, _ in batches for k in ks]
    assert h.lookup(every) == [True] * len(every)
    h.adapter.submit_unlock(every)
    assert h.adapter.report_status()["locked_keys"] == 0
    assert h.adapter.get_usage().total_bytes_used == len(every) * SIZE


def test_delete_skips_locked_keys_and_accounts_what_it_removed(harness, valkey_server):
    h = harness()
    ks = keys(range(4), salt="s1")
    h.store(ks, h.objs(4, 3))
    assert dict(h.adapter.get_usage().bytes_by_cache_salt) == {"s1": 4 * SIZE}
    h.lookup(ks[:1])  # locks chunk 0
    h.adapter.delete(ks)
    assert h.lookup(ks) == [True, False, False, False]
    assert h.adapter.get_usage().total_bytes_used == SIZE
    h.adapter.submit_unlock(ks[:1])
    h.adapter.submit_unlock(ks[:1])
    h.adapter.delete(ks[:1])
    assert h.lookup(ks) == [False] * 4
    assert h.adapter.get_usage().total_bytes_used == 0 and dict(h.adapter.get_usage().bytes_by_cache_salt) == {}
    assert valkey_server.cmd("DBSIZE") == 0


def test_a_re_store_adds_no_bytes(harness):
    h = harness()
    ks = keys(range(2))
    h.store(ks, h.objs(2, 1))
    h.store(ks, h.objs(2, 1))
    assert h.adapter.get_usage().total_bytes_used == 2 * SIZE


def test_a_chunk_of_another_layout_is_a_counted_miss_left_in_place(harness):
    from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj

    h = harness()
    ks = keys([1])
    h.store(ks, h.objs(1, 5))
    raw = torch.zeros(SIZE, dtype=torch.uint8)
    half = TensorMemoryObj(raw, MemoryObjMetadata(shape=torch.Size([SIZE // 2]), dtype=torch.int16, address=0,
                                                   phy_size=SIZE, fmt=MemoryFormat.KV_2LTD, ref_count=1), None)
    before = _miss_count("layout")
    assert h.load(ks, [half]) == [False]
    assert _miss_count("layout") == before + 1
    assert h.load(ks, h.objs(1, 9)) == [True]  # still there for readers of its layout


def test_a_locked_chunk_that_valkey_evicts_on_its_own_is_a_counted_miss(harness, valkey_server):
    """A lock keeps our own tiering and deletes away, not Valkey's maxmemory policy
    (docs/lmcache-mp.md): a locked chunk Valkey evicted loads as a counted `absent` miss,
    the others still load byte-exact, and the locks are released as usual."""
    h = harness()
    ks = keys(range(8))
    src = h.objs(8, 3)
    assert h.store(ks, src).is_successful()
    assert h.lookup(ks) == [True] * 8
    assert len(valkey_server.cmd("KEYS", "lmcv:*")) == 8
    info = dict(line.split(":", 1) for line in valkey_server.cmd("INFO", "memory").decode().split("\r\n") if ":" in line)
    valkey_server.cmd("CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
    valkey_server.cmd("CONFIG", "SET", "maxmemory", int(info["used_memory"]) + (256 << 10))
    for i in range(16):  # another tenant's writes push Valkey past maxmemory
        valkey_server.cmd("SET", f"other:{i}", b"x" * SIZE)
    gone = 8 - len(valkey_server.cmd("KEYS", "lmcv:*"))
    assert gone >= 1
    before = _miss_count("absent")
    dst = h.objs(8, 200)
    got = h.load(ks, dst)
    assert got.count(False) == gone and _miss_count("absent") == before + gone
    assert all(torch.equal(a.raw_data, b.raw_data) for a, b, ok in zip(src, dst, got) if ok)
    h.adapter.submit_unlock(ks)
    assert h.adapter.report_status()["locked_keys"] == 0


def _miss_count(cause: str) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value("lmcache_valkey_misses_total", {"tier": "ram", "cause": cause}) or 0.0


def test_list_l2_keys_pages_through_what_is_stored(harness):
    h = harness()
    a = keys(range(5), model="model-a")
    b = keys(range(3), model="model-b", salt="x")
    h.store(a, h.objs(5, 1))
    h.store(b, h.objs(3, 2))
    seen, cursor, pages = [], None, 0
    while True:
        page = h.adapter.list_l2_keys(page_size=3, cursor=cursor)
        pages += 1
        assert len(page.entries) <= 3
        seen += page.entries
        cursor = page.next_page_token
        if cursor is None:
            break
    assert pages >= 3
    assert sorted((e.key.model_name, e.key.chunk_hash_hex, e.key.cache_salt) for e in seen) == sorted(
        [(k.model_name, k.chunk_hash.hex(), k.cache_salt) for k in a + b])
    assert all(e.size_bytes == SIZE for e in seen)
    only_b = h.adapter.list_l2_keys(model_name="model-b", page_size=100)
    assert {e.key.to_object_key() for e in only_b.entries} == set(b) and only_b.next_page_token is None
    with pytest.raises(ValueError):
        h.adapter.list_l2_keys(cursor="no-such-cursor")


def test_status_and_memory_tags(harness):
    h = harness()
    st = h.adapter.report_status()
    assert st["is_healthy"] is True and st["transport"] == "resp" and st["tenant"] == "t1"
    try:
        from lmcache.v1.distributed.api import MemoryResidency, MemoryTags
    except ImportError:  # LMCache 0.5.6 has no memory tags
        return
    tags = h.adapter.get_memory_tags()
    assert isinstance(tags, MemoryTags) and tags.residency == MemoryResidency.REMOTE


def test_submit_touch_counts_as_an_access(harness):
    from lmcache.v1.distributed.internal_api import L2AdapterListener

    class Listener(L2AdapterListener):
        def __init__(self):
            self.accessed = []

        def on_l2_keys_stored(self, keys, *a):
            pass

        def on_l2_keys_accessed(self, keys):
            self.accessed.append(list(keys))

        def on_l2_keys_deleted(self, keys, *a):
            pass

    h = harness()
    listener = Listener()
    h.adapter.register_listener(listener)
    ks = keys(range(2))
    h.adapter.submit_touch(ks)
    assert listener.accessed == [ks]


def test_bad_adapter_params_stop_the_mp_server_naming_the_key(valkey_server):
    with pytest.raises(ConfigError) as e:
        make_manager({"url": valkey_server.url, "op_timeout_s": "fast"})
    assert e.value.key == "adapter_params.op_timeout_s"
    with pytest.raises(ConfigError) as e:
        make_manager({"url": valkey_server.url, "tenant_name": "x"})
    assert e.value.key == "adapter_params.tenant_name"
    with pytest.raises(ConfigError) as e:
        make_manager({"url": valkey_server.url, "max_capacity": "lots"})
    assert e.value.key == "adapter_params.max_capacity"


def test_a_closed_adapter_finishes_new_tasks_at_once_as_failures(harness):
    h = harness()
    h.close()
    tid = h.adapter.submit_load_task(keys([1]), h.objs(1, 0))
    assert h.adapter.query_load_result(tid).popcount() == 0
    tid = h.adapter.submit_store_task(keys([1]), h.objs(1, 0))
    assert not h.adapter.pop_completed_store_tasks()[tid].is_successful()
    h.close()  # idempotent


def test_lmcache_l2_benchmark_verifies_our_round_trips(valkey_server):
    """LMCache's own harness (`lmcache bench l2`): store, lookup, load, byte verification."""
    args = [sys.executable, "-c", "from lmcache.cli.main import main; main()", "bench", "l2",
            "--l2-adapter", json.dumps(spec({"url": valkey_server.url})),
            "--num-keys", "8", "--data-size-kb", "256", "--in-flight", "2", "--rounds", "2",
            "--lookup-max-hit-rate", "1.0", "--no-skip-verify"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=150, env={**os.environ, "PYTHONHASHSEED": "0"})
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "data verified OK" in out and "MISMATCH" not in out, out[-3000:]
    assert "TIMEOUT" not in out, out[-3000:]
    assert "Actual hit rate:                                            1.00" in out, out[-3000:]
