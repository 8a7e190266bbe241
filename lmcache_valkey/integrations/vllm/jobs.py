"""Store and load jobs between vLLM's primary CPU tier and the store, run on the private loop.

vLLM hands the tier a job (keys + primary-tier slots) and polls for its result later; the
caller's thread only submits. Every block travels between its slot of the primary view and
Valkey without an intermediate copy: a store sends the header and then the slot itself; a
load reads the value's payload straight into the slot (RESP ``readinto``, or the server's
RMA write into the registered primary region).

Buffer ownership (docs/layers.md): vLLM keeps a job's slots pinned until the tier reports
the job. A job is reported only once nothing can touch its slots any more: with RESP that
is when the store call returned; with RMA a missed block's slot is handed back by the
store only when the server's transfer is known to be over (its reply, or the transport
revoking the link it used: docs/fabric-buffer-ownership.md), and the job waits for it
(``ChunkStore.load_into``). So a job never reports a slot the network may still write, and
``drain`` is bounded by the deadlines (plus the fabric's drain grace).

Never imports: ``vllm``. Keys arrive as :class:`ChunkRef`, slots as indices into the view.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Sequence

from ...codec import ChunkLayout, ChunkMeta
from ...session import StoreSession
from ...store import ChunkRef

log = logging.getLogger(__name__)

DRAIN_WARN_EVERY_S = 5.0


@dataclass(frozen=True)
class JobOutcome:
    job_id: int
    load: bool
    ok: tuple[bool, ...]  # per key, in the job's order
    nbytes: int  # bytes moved for the keys that succeeded
    seconds: float  # from submission to the end of the transfer


class JobRunner:
    """Runs jobs on ``session``'s loop; results are collected with :meth:`take_finished`.

    ``view`` is the primary tier as one flat byte view; slot ``i`` is
    ``view[i * block_bytes : (i + 1) * block_bytes]``. Thread-safe: vLLM's thread submits
    and collects, the loop thread completes.
    """

    def __init__(self, session: StoreSession, view: memoryview, block_bytes: int) -> None:
        if block_bytes <= 0 or view.nbytes % block_bytes:
            raise ValueError(f"a primary view of {view.nbytes} bytes is not made of {block_bytes}-byte blocks")
        self._session = session
        self._view = view
        self._bs = block_bytes
        # Every value of the namespace (which covers the block size) is one block of bytes:
        # a value holding anything else can never be served here.
        self._layout = ChunkLayout(shapes=((block_bytes,),), dtypes=("uint8",), fmt=0)
        self._slots = view.nbytes // block_bytes
        self._lock = threading.Lock()
        self._inflight: dict[int, concurrent.futures.Future[JobOutcome]] = {}
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
        submitted = time.perf_counter()
        with self._lock:
            if self._closed:
                self._finished.append(JobOutcome(job_id, load, (False,) * len(refs), 0, 0.0))
                return
            fut = self._session.io.submit(self._run(job_id, load, list(refs), [int(s) for s in slots], submitted))
            self._inflight[job_id] = fut
        fut.add_done_callback(lambda f: self._done(job_id, load, len(refs), submitted, f))

    def take_finished(self) -> list[JobOutcome]:
        out = []
        while True:
            try:
                out.append(self._finished.popleft())
            except IndexError:
                return out

    def pending(self) -> int:
        with self._lock:
            return len(self._inflight)

    def drain(self) -> None:
        """Block until every submitted job has finished (its outcome is then queued).

        Bounded by the store's deadlines (see the module docstring); a warning every few
        seconds says what is still running."""
        started = time.monotonic()
        while True:
            with self._lock:
                futs = list(self._inflight.values())
            if not futs:
                return
            _, not_done = concurrent.futures.wait(futs, timeout=DRAIN_WARN_EVERY_S)
            if not_done:
                log.warning("lmcache-valkey vLLM tier: still draining %d job(s) after %.0f s",
                            len(not_done), time.monotonic() - started)

    def close(self, timeout: float) -> None:
        """Refuse new jobs; wait up to ``timeout`` for those in flight, then cancel the rest
        (a cancelled RESP read aborts its connection before the job ends; RMA buffers are
        released when the store closes)."""
        with self._lock:
            self._closed = True
            futs = list(self._inflight.values())
        if not futs:
            return
        _, not_done = concurrent.futures.wait(futs, timeout=timeout)
        for fut in not_done:
            fut.cancel()
        if not_done:
            log.warning("lmcache-valkey vLLM tier: cancelled %d job(s) still running at shutdown", len(not_done))
            concurrent.futures.wait(not_done, timeout=1.0)

    def _done(self, job_id: int, load: bool, n: int, submitted: float,
              fut: concurrent.futures.Future[JobOutcome]) -> None:
        try:
            outcome = fut.result()
        except BaseException as e:  # cancelled at shutdown, or a bug: the job failed, it is still reported
            if not isinstance(e, (concurrent.futures.CancelledError, asyncio.CancelledError)):
                log.error("lmcache-valkey vLLM tier: job %d failed unexpectedly: %r", job_id, e)
            outcome = JobOutcome(job_id, load, (False,) * n, 0, time.perf_counter() - submitted)
        with self._lock:
            self._inflight.pop(job_id, None)
            self._finished.append(outcome)

    # ---------------------------------------------------------------------- the loop

    async def _run(self, job_id: int, load: bool, refs: list[ChunkRef], slots: list[int],
                   submitted: float) -> JobOutcome:
        ok = [False] * len(refs)
        valid = [i for i, s in enumerate(slots) if 0 <= s < self._slots]
        if len(valid) != len(slots):
            log.error("lmcache-valkey vLLM tier: job %d names slots outside the primary tier (%d slots): %s",
                      job_id, self._slots, [s for s in slots if not 0 <= s < self._slots])
        if valid:
            views = [self._view[slots[i] * self._bs:(slots[i] + 1) * self._bs] for i in valid]
            done = await (self._load if load else self._store)([refs[i] for i in valid], views)
            del views  # no slice of the primary region outlives its job (vLLM unmaps it at shutdown)
            for i, d in zip(valid, done):
                ok[i] = d
        return JobOutcome(job_id, load, tuple(ok), sum(ok) * self._bs, time.perf_counter() - submitted)

    async def _store(self, refs: list[ChunkRef], views: list[memoryview]) -> list[bool]:
        lay = self._layout
        items = [(r, ChunkMeta(shapes=lay.shapes, dtypes=lay.dtypes, fmt=lay.fmt, key=r.key_string), v)
                 for r, v in zip(refs, views)]
        return await self._session.store.put_many(items)

    async def _load(self, refs: list[ChunkRef], views: list[memoryview]) -> list[bool]:
        # RMA: the server may still be writing into a missed slot; the job is held until the
        # transport says its transfer is over (at once with RESP).
        results = await self._session.store.load_into(list(zip(refs, views)), layout=self._layout)
        ok = []
        for ref, r in zip(refs, results):
            good = r is not None and r.nbytes == self._bs
            if r is not None and not good:
                log.warning("lmcache-valkey vLLM tier: block %s holds %d bytes, not %d: a miss",
                            ref.chunk_id, r.nbytes, self._bs)
            ok.append(good)
        return ok


__all__ = ["JobOutcome", "JobRunner"]
