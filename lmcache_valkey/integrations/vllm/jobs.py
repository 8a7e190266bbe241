"""Store and load jobs between vLLM's primary CPU tier and the store, run on the private loop.

vLLM hands the tier a job (keys + primary-tier slots) and polls for its result later; the
caller's thread only submits. Every block travels between its slot of the primary view and
Valkey without an intermediate copy: a store sends the header and then the slot itself; a
load reads the value's payload straight into the slot (RESP ``readinto``, or the server's
RMA write into the registered primary region).

Buffer ownership (docs/layers.md, docs/vllm-tier.md "Failed loads and late writes"): vLLM
keeps a job's slots pinned until the tier reports the job, and reuses a failed load's slots
as soon as it may. A load's slots stay *held* until no I/O of the job can touch them: its
task has ended (a RESP read cancelled mid-reply aborts its connection before the task ends)
and the store has handed back every slot that did not become a hit (with RMA, only once the
server's transfer is known to be over: its reply, or the transport revoking the link it
used at the deadline plus its drain grace, docs/fabric-buffer-ownership.md). The hold is a
``threading.Event`` (:attr:`JobOutcome.released`), so both bounds are the store's.

Two ways to report a load, by vLLM release (``defer_release``): without deferred release
(vLLM 0.32/0.33) a job is reported only once its hold is released, so a reported slot is
free; with it (0.34's ``JobResult.deferred_release``) a failed load is reported as soon as
its task ended, carrying the unreleased hold, and vLLM keeps those slots out of its free pool
until the event is set. :meth:`JobRunner.drain` waits for both jobs and holds.

Never imports: ``vllm``. Keys arrive as :class:`ChunkRef`, slots as indices into the view.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Sequence

from ...codec import ChunkLayout, ChunkMeta
from ...session import StoreSession
from ...store import ChunkRef

log = logging.getLogger(__name__)

DRAIN_WARN_EVERY_S = 5.0
# After its deadline at shutdown, how long a cancelled job gets to end on the loop.
CANCEL_WAIT_S = 1.0


@dataclass(frozen=True)
class JobOutcome:
    job_id: int
    load: bool
    ok: tuple[bool, ...]  # per key, in the job's order
    nbytes: int  # bytes moved for the keys that succeeded
    seconds: float  # from submission to the end of the transfer
    # Loads reported before their I/O was over (deferred release): set once no I/O of the
    # job can touch its slots. None: nothing could any more when the job was reported.
    released: threading.Event | None = None


class SlotHold:
    """The slots of one load that its I/O may still write into.

    :attr:`released` is set once the job's task has ended and every slot lent to the store
    is back: filled (a hit: that transfer is over) or handed back by the store's
    ``on_release`` (from any thread); or by :meth:`force` once the store is closed. Set
    once, never cleared; ``on_released`` runs once, on the thread that set it."""

    def __init__(self, on_released: Callable[[], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._lent: set[int] = set()
        self._running = True
        self._on_released = on_released
        self.released = threading.Event()

    def lend(self, items: Iterable[int]) -> None:
        with self._lock:
            self._lent.update(items)

    def back(self, items: Iterable[int]) -> None:
        with self._lock:
            self._lent.difference_update(items)
            fire = self._check()
        self._fire(fire)

    def ended(self) -> None:
        with self._lock:
            self._running = False
            fire = self._check()
        self._fire(fire)

    def force(self) -> None:
        with self._lock:
            self._running = False
            self._lent.clear()
            fire = self._check()
        self._fire(fire)

    def _check(self) -> bool:  # under the lock
        if self._running or self._lent or self.released.is_set():
            return False
        self.released.set()
        return True

    def _fire(self, fire: bool) -> None:
        if fire and self._on_released is not None:
            self._on_released()


class _Job:
    __slots__ = ("id", "load", "n", "submitted", "hold", "task", "cancelled")

    def __init__(self, job_id: int, load: bool, n: int, hold: SlotHold | None) -> None:
        self.id = job_id
        self.load = load
        self.n = n
        self.submitted = time.perf_counter()
        self.hold = hold
        self.task: asyncio.Task[JobOutcome] | None = None  # set on the loop
        self.cancelled = False

    def failed(self) -> JobOutcome:
        return JobOutcome(self.id, self.load, (False,) * self.n, 0, time.perf_counter() - self.submitted)


class JobRunner:
    """Runs jobs on ``session``'s loop; results are collected with :meth:`take_finished`.

    ``view`` is the primary tier as one flat byte view; slot ``i`` is
    ``view[i * block_bytes : (i + 1) * block_bytes]``. ``defer_release``: report a failed
    load while its I/O may still touch its slots, with the hold's event (vLLM 0.34+; module
    docstring). Thread-safe: vLLM's thread submits and collects, the loop thread completes.
    """

    def __init__(self, session: StoreSession, view: memoryview, block_bytes: int, *,
                 defer_release: bool = False) -> None:
        if block_bytes <= 0 or view.nbytes % block_bytes:
            raise ValueError(f"a primary view of {view.nbytes} bytes is not made of {block_bytes}-byte blocks")
        self._session = session
        self._view = view
        self._bs = block_bytes
        self.defer_release = defer_release
        # Every value of the namespace (which covers the block size) is one block of bytes:
        # a value holding anything else can never be served here.
        self._layout = ChunkLayout(shapes=((block_bytes,),), dtypes=("uint8",), fmt=0)
        self._slots = view.nbytes // block_bytes
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # a job ended, or a hold was released
        self._inflight: dict[int, _Job] = {}  # submitted, its task not ended
        self._waiting: dict[int, JobOutcome] = {}  # ended, reported once its hold is released
        self._holds: dict[int, SlotHold] = {}  # every load's hold until it is released
        self._finished: deque[JobOutcome] = deque()
        self._closed = False

    @property
    def block_bytes(self) -> int:
        return self._bs

    # ---------------------------------------------------------------- vLLM's thread

    def submit(self, job_id: int, *, load: bool, refs: Sequence[ChunkRef], slots: Sequence[int]) -> None:
        """Start a job; never blocks. Its :class:`JobOutcome` appears in :meth:`take_finished`."""
        if len(refs) != len(slots):
            raise ValueError(f"job {job_id}: {len(refs)} keys but {len(slots)} slots")
        hold = SlotHold(on_released=lambda: self._released(job_id)) if load else None
        job = _Job(job_id, load, len(refs), hold)
        with self._lock:
            if self._closed:
                self._finished.append(job.failed())
                return
            self._inflight[job_id] = job
            if hold is not None:
                self._holds[job_id] = hold
        try:
            self._session.io.loop.call_soon_threadsafe(self._start, job, list(refs), [int(s) for s in slots])
        except RuntimeError:  # the loop is closed: nothing ran, nothing touches the slots
            self._end(job, None)

    def take_finished(self) -> list[JobOutcome]:
        out = []
        while True:
            try:
                out.append(self._finished.popleft())
            except IndexError:
                return out

    def pending(self) -> int:
        """Jobs not reported yet, and loads whose slots are still held."""
        with self._lock:
            return len(self._inflight.keys() | self._waiting.keys() | self._holds.keys())

    def drain(self) -> None:
        """Block until every submitted job is queued for reporting and every load's hold is
        released (so, on vLLM 0.34, every deferred release reported is set).

        Bounded by the store's deadlines and the fabric's revocation (module docstring); a
        warning every few seconds says what is still running."""
        started = last = time.monotonic()
        with self._lock:
            while self._inflight or self._waiting or self._holds:
                self._changed.wait(timeout=DRAIN_WARN_EVERY_S)
                if (now := time.monotonic()) - last >= DRAIN_WARN_EVERY_S:
                    last = now
                    log.warning("lmcache-valkey vLLM tier: still draining %d job(s), %d load(s) holding slots, "
                                "after %.0f s", len(self._inflight), len(self._holds), now - started)

    def close(self, timeout: float) -> None:
        """Refuse new jobs; wait up to ``timeout`` for those in flight, then cancel the rest
        (a cancelled RESP read aborts its connection before its task ends) and report every
        job still unreported as failed. Slots still held stay held until :meth:`release_all`,
        which the owner calls once the store is closed."""
        with self._lock:
            self._closed = True
            deadline = time.monotonic() + timeout
            while (self._inflight or self._waiting) and (left := deadline - time.monotonic()) > 0:
                self._changed.wait(timeout=left)
            stuck = list(self._inflight.values())
        for job in stuck:
            job.cancelled = True
            try:
                self._session.io.loop.call_soon_threadsafe(self._cancel, job)
            except RuntimeError:
                pass
        with self._lock:
            deadline = time.monotonic() + CANCEL_WAIT_S
            while stuck and any(j.id in self._inflight for j in stuck) and (left := deadline - time.monotonic()) > 0:
                self._changed.wait(timeout=left)
            still = [j for j in stuck if j.id in self._inflight]
            # Ended but waiting for their holds (without deferred release): reported now.
            for job_id, outcome in self._waiting.items():
                self._finished.append(outcome)
            self._waiting.clear()
        if stuck:
            log.warning("lmcache-valkey vLLM tier: cancelled %d job(s) still running at shutdown", len(stuck))
        for job in still:  # reported failed now; the loop's late end of the job is ignored
            self._end(job, None, task_over=False)

    def release_all(self) -> None:
        """The store is closed (its loop stopped, its fabric endpoints closed): no I/O can
        touch the primary region any more, so every hold still open is released."""
        with self._lock:
            holds = list(self._holds.values())
        for hold in holds:
            hold.force()

    # ---------------------------------------------------------------------- the loop

    def _start(self, job: _Job, refs: list[ChunkRef], slots: list[int]) -> None:
        if job.cancelled:  # cancelled before it started: nothing ran
            self._end(job, None)
            return
        job.task = asyncio.get_running_loop().create_task(self._run(job, refs, slots))
        job.task.add_done_callback(lambda t: self._task_done(job, t))

    def _cancel(self, job: _Job) -> None:
        if job.task is not None:
            job.task.cancel()

    def _task_done(self, job: _Job, task: asyncio.Task[JobOutcome]) -> None:
        outcome = None
        if not task.cancelled():
            e = task.exception()
            if e is None:
                outcome = task.result()
            else:  # a bug: the job failed, it is still reported
                log.error("lmcache-valkey vLLM tier: job %d failed unexpectedly: %r", job.id, e)
        self._end(job, outcome)

    def _end(self, job: _Job, outcome: JobOutcome | None, *, task_over: bool = True) -> None:
        """Queue the job's outcome (failed when None): now, or, without deferred release,
        once its hold is released. ``task_over``: its task has ended or never ran (so a RESP
        read can no longer write). Any thread; a job is reported once."""
        if task_over and job.hold is not None:
            job.hold.ended()
        if outcome is None:
            outcome = job.failed()
        with self._lock:
            if self._inflight.pop(job.id, None) is None:
                return  # reported already, at shutdown
            hold = job.hold
            if hold is None or hold.released.is_set():
                self._finished.append(outcome)
            elif self.defer_release:  # vLLM holds the slots until the event is set
                self._finished.append(replace(outcome, released=hold.released))
            elif self._closed:  # shutdown without deferred release: reported as before 0.34
                self._finished.append(outcome)
            else:
                self._waiting[job.id] = outcome
            self._changed.notify_all()

    def _released(self, job_id: int) -> None:  # a hold was released, on any thread
        with self._lock:
            self._holds.pop(job_id, None)
            outcome = self._waiting.pop(job_id, None)
            if outcome is not None:
                self._finished.append(outcome)
            self._changed.notify_all()

    async def _run(self, job: _Job, refs: list[ChunkRef], slots: list[int]) -> JobOutcome:
        ok = [False] * len(refs)
        valid = [i for i, s in enumerate(slots) if 0 <= s < self._slots]
        if len(valid) != len(slots):
            log.error("lmcache-valkey vLLM tier: job %d names slots outside the primary tier (%d slots): %s",
                      job.id, self._slots, [s for s in slots if not 0 <= s < self._slots])
        if valid:
            views = [self._view[slots[i] * self._bs:(slots[i] + 1) * self._bs] for i in valid]
            vrefs = [refs[i] for i in valid]
            if job.hold is not None:
                done = await self._load(vrefs, views, job.hold)
            else:
                done = await self._store(vrefs, views)
            del views  # no slice of the primary region outlives its job (vLLM unmaps it at shutdown)
            for i, d in zip(valid, done):
                ok[i] = d
        return JobOutcome(job.id, job.load, tuple(ok), sum(ok) * self._bs, time.perf_counter() - job.submitted)

    async def _store(self, refs: list[ChunkRef], views: list[memoryview]) -> list[bool]:
        lay = self._layout
        items = [(r, ChunkMeta(shapes=lay.shapes, dtypes=lay.dtypes, fmt=lay.fmt, key=r.key_string), v)
                 for r, v in zip(refs, views)]
        return await self._session.store.put_many(items)

    async def _load(self, refs: list[ChunkRef], views: list[memoryview], hold: SlotHold) -> list[bool]:
        # Every slot is lent to the store until it is a hit or the store hands it back
        # (RESP: before get_many_into returns or raises; RMA: once the server's transfer
        # is over, maybe later, from the transport's thread).
        hold.lend(range(len(refs)))
        results = await self._session.store.get_many_into(
            list(zip(refs, views)), on_release=lambda i: hold.back((i,)), layout=self._layout)
        hold.back(i for i, r in enumerate(results) if r is not None)
        ok = []
        for ref, r in zip(refs, results):
            good = r is not None and r.nbytes == self._bs
            if r is not None and not good:
                log.warning("lmcache-valkey vLLM tier: block %s holds %d bytes, not %d: a miss",
                            ref.chunk_id, r.nbytes, self._bs)
            ok.append(good)
        return ok


__all__ = ["JobOutcome", "JobRunner", "SlotHold"]
