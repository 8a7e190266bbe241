"""The vLLM tier's job runner (integrations/vllm/jobs.py) without vLLM: a load's slots stay
held until no I/O of the job can touch them, and a job is reported only as its vLLM release
allows (vLLM 0.34's deferred release, or not before the hold is released on 0.32/0.33).

The transports are stand-ins for what no server produces on demand: an RMA server that may
still write into missed slots after the store gave up (its release comes when the test says),
and a RESP read whose cancellation takes a while to abort the connection."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import pytest

from lmcache_valkey.codec import ChunkMeta
from lmcache_valkey.config import Settings
from lmcache_valkey.integrations.vllm.jobs import JobRunner, SlotHold
from lmcache_valkey.keys import make_namespace
from lmcache_valkey.loop_thread import LoopThread
from lmcache_valkey.store import ChunkRef, ChunkStore
from lmcache_valkey.transport.memory import MemoryTransport

pytestmark = pytest.mark.timeout(60)

NS = make_namespace("lmcv", "default", {"model": "vllm-jobs"})
BLOCK = 4096
SLOTS = 8


class LateRelease(MemoryTransport):
    """Present keys are served at once; for an absent key the "server" may still write into
    the slot until :meth:`release` (the fabric transport revoking the link, in real life)."""

    supports_release_callbacks = True

    def __init__(self) -> None:
        super().__init__()
        self.pending: list = []
        self.got = threading.Event()

    async def get_many_into(self, items, *, timeout, on_release=None):
        out = await super().get_many_into(items, timeout=timeout)
        for r, cb in zip(out, on_release or [None] * len(items)):
            if cb is None:
                continue
            if r is None:
                self.pending.append(cb)
            else:
                cb()
        self.got.set()
        return out

    def release(self, loop: asyncio.AbstractEventLoop) -> None:
        callbacks, self.pending = self.pending, []
        for cb in callbacks:
            loop.call_soon_threadsafe(cb)


class SlowAbort(MemoryTransport):
    """A RESP read that never answers; cancelled, it takes a while to abort its connection,
    and bytes may still land in the buffer meanwhile (they do here, on purpose)."""

    def __init__(self) -> None:
        super().__init__()
        self.started = threading.Event()
        self.wrote_after_cancel = False

    async def get_many_into(self, items, *, timeout, **kw):
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.sleep(0.2)
            for _, sink in items:
                for part in sink[1:]:  # the payload: the primary slot
                    part[:] = b"\xee" * len(part)
            self.wrote_after_cancel = True
            raise


@pytest.fixture
def runner():
    made = []

    def make(transport, *, defer_release: bool):
        io = LoopThread("test-vllm-jobs")
        settings = Settings(op_timeout_s=30.0)

        async def build():
            return ChunkStore(settings, NS, transport, transport_name="fabric")

        store = io.run_sync(build(), timeout=5)
        primary = bytearray(SLOTS * BLOCK)
        r = JobRunner(SimpleNamespace(io=io, store=store), memoryview(primary), BLOCK, defer_release=defer_release)
        made.append((r, io, store))
        return r, io, store, primary

    yield make
    for r, io, store in made:
        r.close(0.1)
        if not io.loop.is_closed():
            io.run_sync(store.close(), timeout=5)
            io.stop()
        r.release_all()


def refs(names):
    return [ChunkRef(NS.chunk_id(n), n) for n in names]


def put(io, store, names) -> None:
    items = [(r, ChunkMeta(shapes=((BLOCK,),), dtypes=("uint8",), fmt=0, key=r.key_string), bytes([i + 1]) * BLOCK)
             for i, r in enumerate(refs(names))]
    assert io.run_sync(store.put_many(items), timeout=10) == [True] * len(items)


def wait_for(cond, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def test_a_hold_is_released_once_the_task_ended_and_every_lent_slot_is_back() -> None:
    fired = []
    h = SlotHold(on_released=lambda: fired.append(1))
    h.lend([0, 1, 2])
    h.back([0])
    h.ended()
    assert not h.released.is_set()
    h.back([1, 2])
    assert h.released.is_set() and fired == [1]
    h.back([1]), h.ended(), h.force()
    assert fired == [1]  # once


def test_with_deferred_release_a_failed_load_is_reported_at_once_and_its_hold_set_only_when_io_is_over(runner) -> None:
    transport = LateRelease()
    r, io, store, _ = runner(transport, defer_release=True)
    put(io, store, ["present"])
    r.submit(1, load=True, refs=refs(["present", "absent-1", "absent-2"]), slots=[0, 1, 2])
    wait_for(lambda: r.pending() and transport.got.is_set() and r._finished)
    (out,) = r.take_finished()
    assert out.ok == (True, False, False) and out.released is not None
    assert not out.released.is_set() and r.pending() == 1  # the server may still write slots 1, 2

    drained = threading.Thread(target=r.drain)
    drained.start()
    drained.join(0.3)
    assert drained.is_alive()  # drain waits for the deferred release as well
    transport.release(io.loop)
    drained.join(20)
    assert not drained.is_alive() and out.released.is_set() and r.pending() == 0


def test_without_deferred_release_a_failed_load_is_reported_only_once_its_io_is_over(runner) -> None:
    transport = LateRelease()
    r, io, store, _ = runner(transport, defer_release=False)
    r.submit(1, load=True, refs=refs(["absent"]), slots=[3])
    wait_for(transport.got.is_set)
    time.sleep(0.05)
    assert r.take_finished() == [] and r.pending() == 1
    transport.release(io.loop)
    r.drain()
    (out,) = r.take_finished()
    assert out.ok == (False,) and out.released is None


def test_a_load_whose_io_is_over_when_it_fails_is_reported_without_a_hold(runner) -> None:
    r, io, store, _ = runner(MemoryTransport(), defer_release=True)  # RESP-like: nothing writes later
    put(io, store, ["here"])
    r.submit(1, load=True, refs=refs(["here", "gone"]), slots=[0, 1])
    r.submit(2, load=True, refs=refs(["here"]), slots=[2])
    r.drain()
    outs = {o.job_id: o for o in r.take_finished()}
    assert outs[1].ok == (True, False) and outs[1].released is None
    assert outs[2].ok == (True,) and outs[2].released is None


@pytest.mark.parametrize("defer_release", [True, False])
def test_a_job_cancelled_at_shutdown_is_reported_only_after_its_read_stopped_writing(runner, defer_release) -> None:
    transport = SlowAbort()
    r, io, store, primary = runner(transport, defer_release=defer_release)
    r.submit(1, load=True, refs=refs(["never-answered"]), slots=[5])
    assert transport.started.wait(10)
    r.close(timeout=0.0)
    (out,) = r.take_finished()
    assert not any(out.ok)
    assert transport.wrote_after_cancel  # the late bytes landed before the job was reported
    assert out.released is None or out.released.is_set()
    primary[5 * BLOCK:6 * BLOCK] = b"\x00" * BLOCK  # vLLM reuses the slot: nothing overwrites it now
    time.sleep(0.3)
    assert primary[5 * BLOCK:6 * BLOCK] == b"\x00" * BLOCK


def test_slots_still_held_at_shutdown_are_released_once_the_store_is_closed(runner) -> None:
    transport = LateRelease()
    r, io, store, _ = runner(transport, defer_release=True)
    r.submit(1, load=True, refs=refs(["absent"]), slots=[0])
    wait_for(lambda: bool(r._finished))
    (out,) = r.take_finished()
    r.close(timeout=0.1)
    assert not out.released.is_set()
    io.run_sync(store.close(), timeout=5)
    io.stop()
    r.release_all()
    assert out.released.is_set() and r.pending() == 0


def test_jobs_submitted_after_close_fail_at_once(runner) -> None:
    r, *_ = runner(MemoryTransport(), defer_release=True)
    r.close(timeout=0.1)
    r.submit(7, load=True, refs=refs(["x"]), slots=[0])
    (out,) = r.take_finished()
    assert out.job_id == 7 and out.ok == (False,) and out.released is None
