"""A private asyncio loop on its own thread, and the bridges every engine adapter needs into it.

Why a private loop: engines call some storage methods synchronously (LMCache's
``exists_sync``, ``batched_contains``, ``remove_sync``; vLLM's and SGLang's tier
interfaces entirely), sometimes from their own event-loop thread, where blocking
on a coroutine of that same loop would deadlock. Running the store on our own
loop makes every sync twin a plain cross-thread wait with a deadline. Shared by
all adapters (docs/private-io-loop.md); it knows no engine.

Cancellation: when the engine cancels its future (LMCache's ``blocking_timeout_secs``), the
cancellation is forwarded to our task, which aborts its connection and then
releases what it allocated. A result that arrives after the caller has given
up is handed to ``on_orphan`` so it can be released, never leaked.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from typing import Any, Callable, Coroutine, TypeVar

from .errors import DeadlineExceeded

T = TypeVar("T")
log = logging.getLogger(__name__)


class LoopThread:
    def __init__(self, name: str = "lmcache-valkey-io") -> None:
        self.name = name
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run_sync(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run ``coro`` on the private loop and wait for it, at most ``timeout`` seconds."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("run_sync called from the store's own loop thread")
        fut = self.submit(coro)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise DeadlineExceeded(f"no answer within {timeout:.3f} s") from None

    async def run(
        self, coro: Coroutine[Any, Any, T], on_orphan: Callable[[T], None] | None = None
    ) -> T:
        """Await ``coro`` (run on the private loop) from another event loop.

        If the caller is cancelled, the private task is cancelled too, and a result that was
        already on its way is handed to ``on_orphan`` (to release it) instead of being
        dropped. ``on_orphan`` runs on the caller's thread, or on the private loop's where the
        caller's loop has closed: it must be thread-safe (LMCache's ``ref_count_down`` is).
        An error it raises is logged, never raised in the caller's place.

        One call is two cross-thread wake-ups and little else: the private task's outcome
        is handed straight to a future of the caller's loop. (Through a
        ``concurrent.futures.Future`` chained to both loops and a shield, as
        ``run_coroutine_threadsafe`` and ``wrap_future`` do, a round trip took ~150 µs of
        CPU on the 2-core benchmark machine instead of ~100.)
        """
        if not asyncio.iscoroutine(coro):  # (create_task would fail on the private loop, unheard)
            raise TypeError(f"LoopThread.run needs a coroutine, not {type(coro).__name__}")
        caller = asyncio.get_running_loop()
        done: asyncio.Future[T] = caller.create_future()
        task: asyncio.Task[T] | None = None
        # Set by the caller once it has given up (a plain flag: read on the private loop's
        # thread). From then on the private side releases the result itself instead of
        # handing it to a loop that may be shutting down and never run the hand-over.
        gave_up = False

        def release(value: T) -> None:
            if on_orphan is not None:
                try:
                    on_orphan(value)
                except Exception:
                    log.exception("releasing a result its caller gave up on failed")

        def orphan(f: asyncio.Future[T]) -> None:  # the private task, or ``done``
            if not f.cancelled() and f.exception() is None:
                release(f.result())

        def deliver(t: asyncio.Task[T]) -> None:  # on the caller's loop
            if done.cancelled():  # the caller gave up: what was made goes to on_orphan
                orphan(t)
            elif t.cancelled():
                done.cancel()
            elif (e := t.exception()) is not None:
                done.set_exception(e)
            else:
                done.set_result(t.result())

        def finished(t: asyncio.Task[T]) -> None:  # on the private loop
            if gave_up:
                orphan(t)
                return
            try:
                caller.call_soon_threadsafe(deliver, t)
            except RuntimeError:  # the caller's loop is closed: nobody can take the result
                orphan(t)

        def start() -> None:  # on the private loop
            nonlocal task
            task = self.loop.create_task(coro)
            task.add_done_callback(finished)

        def cancel_private() -> None:  # on the private loop, always after start (FIFO)
            if task is not None:
                task.cancel()

        try:
            self.loop.call_soon_threadsafe(start)
        except RuntimeError:  # the private loop is closed
            coro.close()
            raise
        try:
            return await done
        except asyncio.CancelledError:
            gave_up = True
            if done.done() and not done.cancelled():
                # The outcome was handed over, but the caller was cancelled before it resumed
                # (``done`` cannot be cancelled any more, so ``deliver`` did not orphan it).
                orphan(done)
            else:
                try:
                    self.loop.call_soon_threadsafe(cancel_private)
                except RuntimeError:  # the private loop closed meanwhile: its tasks are gone
                    pass
            raise

    def stop(self, timeout: float = 5.0) -> None:
        """Cancel every task still on the loop and let it finish there, then stop and close the
        loop (as ``asyncio.run`` ends): a task left pending would be destroyed with the loop,
        and its cleanup (a load's release callbacks, ``call_soon_threadsafe``) would run at
        garbage collection on a closed loop. The owner closes the store first, so that nothing
        a cancelled task held can still be written to."""
        if not self.loop.is_closed() and self._thread.is_alive():
            if threading.current_thread() is not self._thread:
                try:
                    self.submit(_end_tasks(timeout)).result(timeout + 1.0)
                except Exception:  # a task that ignores its cancellation: stop anyway, bounded
                    pass
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)
        if not self._thread.is_alive() and not self.loop.is_closed():
            self.loop.close()


async def _end_tasks(timeout: float) -> None:
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
    for t in tasks:
        t.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=timeout)
    await asyncio.get_running_loop().shutdown_asyncgens()

