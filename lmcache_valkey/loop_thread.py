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
import threading
from typing import Any, Callable, Coroutine, TypeVar

from .errors import DeadlineExceeded

T = TypeVar("T")


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

        If the caller is cancelled, the private task is cancelled too, but its future is
        left to settle on its own: a result that was already on its way is handed to
        ``on_orphan`` (to release it) instead of being dropped by a cancelled future.
        """
        # Never cancel the cross-thread future itself: a result racing with the cancel
        # would be dropped by it. Cancel the private task instead, or stop it from starting.
        state: dict[str, Any] = {"task": None, "cancelled": False}

        async def wrapper() -> T:
            if state["cancelled"]:
                coro.close()
                raise asyncio.CancelledError
            state["task"] = asyncio.current_task()
            return await coro

        def cancel_private() -> None:
            state["cancelled"] = True
            task = state["task"]
            if task is not None and not task.done():
                task.cancel()

        fut = asyncio.run_coroutine_threadsafe(wrapper(), self.loop)
        try:
            return await asyncio.shield(asyncio.wrap_future(fut))
        except asyncio.CancelledError:
            self.loop.call_soon_threadsafe(cancel_private)
            if on_orphan is not None:
                fut.add_done_callback(lambda f: _hand_orphan(f, on_orphan))
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


def _hand_orphan(fut: concurrent.futures.Future[Any], on_orphan: Callable[[Any], None]) -> None:
    if fut.cancelled() or fut.exception() is not None:
        return
    on_orphan(fut.result())
