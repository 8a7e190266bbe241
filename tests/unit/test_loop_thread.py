"""A result that completes while LMCache gives up on it is released, never leaked."""

import asyncio
import time

from lmcache_valkey.loop_thread import LoopThread


def test_results_racing_with_cancellation_reach_the_orphan_handler():
    made, released, delivered = [], [], []
    lt = LoopThread()

    async def work():
        time.sleep(0.05)  # keeps the private loop busy, so the cancel races with completion
        made.append(1)
        return "buffer"

    async def caller():
        try:
            delivered.append(await asyncio.wait_for(lt.run(work(), on_orphan=released.append), 0.02))
        except asyncio.TimeoutError:
            pass

    async def many():
        await asyncio.gather(*(caller() for _ in range(20)))

    try:
        asyncio.run(many())
        lt.run_sync(asyncio.sleep(0), timeout=30)  # FIFO barrier: every earlier task has settled
        assert made, "nothing ran"
        assert len(released) + len(delivered) == len(made)
    finally:
        lt.stop()


def test_run_sync_gives_up_with_a_deadline_error():
    import pytest

    from lmcache_valkey.errors import DeadlineExceeded

    lt = LoopThread()
    try:
        with pytest.raises(DeadlineExceeded):
            lt.run_sync(asyncio.sleep(5), timeout=0.05)
        assert lt.run_sync(asyncio.sleep(0, result=7), timeout=5) == 7
    finally:
        lt.stop()


def test_stop_ends_every_task_while_the_loop_still_runs():
    """A task still waiting when the engine closes (a load whose release callbacks have not
    all come) is cancelled and finishes on the running loop: its cleanup may call back into
    the loop. Left pending, it would be destroyed with the closed loop and its cleanup would
    run at garbage collection, on a closed loop ("Event loop is closed", unraisable)."""
    import gc
    import sys

    unraisable, cleaned = [], []
    lt = LoopThread()
    loop = lt.loop
    started = asyncio.Event()  # of the private loop: set from within it

    async def load_waiting_for_releases():
        try:
            started.set()
            await asyncio.Event().wait()  # a release that never comes before close
        finally:
            # what store.load_into's release callback does from a transport's thread
            loop.call_soon_threadsafe(cleaned.append, "called back")

    old_hook = sys.unraisablehook
    sys.unraisablehook = unraisable.append
    try:
        lt.submit(load_waiting_for_releases())
        lt.run_sync(started.wait(), timeout=10)
        lt.stop()
        gc.collect()
    finally:
        sys.unraisablehook = old_hook
    assert loop.is_closed()
    assert not unraisable, [str(u.exc_value) for u in unraisable]
    assert cleaned == ["called back"]  # the callback ran on the loop, before it closed


def test_run_hands_back_results_errors_and_cancellation_across_loops():
    """What the engine's loop awaits behaves as if the coroutine ran there: its value, its
    exception (the same object), and a cancellation of the caller reaching the private task."""
    lt = LoopThread()
    private_saw: list[str] = []

    async def fails():
        raise KeyError("no such chunk")

    async def waits():
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            private_saw.append("cancelled")
            raise

    async def caller():
        assert await lt.run(asyncio.sleep(0, result="value")) == "value"
        try:
            await lt.run(fails())
        except KeyError as e:
            assert e.args == ("no such chunk",)
        else:
            raise AssertionError("the private coroutine's error was not raised")
        t = asyncio.ensure_future(lt.run(waits()))
        await asyncio.sleep(0.1)
        t.cancel()
        try:
            await t
        except asyncio.CancelledError:
            pass
        else:
            raise AssertionError("cancelled, yet it returned")

    try:
        asyncio.run(caller())
        lt.run_sync(asyncio.sleep(0), timeout=30)  # FIFO barrier: the cancel has been handled
        assert private_saw == ["cancelled"]
    finally:
        lt.stop()


def test_a_result_whose_caller_loop_has_closed_goes_to_the_orphan_handler():
    """The engine's loop closed while a load was on its way: the result is released, not lost."""
    import threading

    lt = LoopThread()
    released: list[str] = []
    go = threading.Event()

    async def slow():
        await asyncio.get_running_loop().run_in_executor(None, go.wait, 30)
        return "buffer"

    async def caller():
        asyncio.ensure_future(lt.run(slow(), on_orphan=released.append))
        await asyncio.sleep(0.1)  # started on the private loop; then this loop ends

    try:
        caller_loop = asyncio.new_event_loop()
        caller_loop.run_until_complete(caller())
        caller_loop.close()
        go.set()
        deadline = time.monotonic() + 30
        while not released and time.monotonic() < deadline:
            time.sleep(0.01)
        assert released == ["buffer"]
    finally:
        lt.stop()


def test_a_result_handed_over_just_as_the_caller_is_cancelled_goes_to_the_orphan_handler():
    """The private task finished and its result reached the caller's loop, but the caller was
    cancelled before it resumed (LMCache's timeout firing in that instant): the caller sees the
    cancellation, so the result must be released, not dropped. The engine's loop is held busy
    for a moment so that the hand-over and the cancel queue up back to back."""
    lt = LoopThread()
    released: list[str] = []

    async def caller():
        engine_loop = asyncio.get_running_loop()
        me = asyncio.current_task()

        async def load():
            engine_loop.call_soon_threadsafe(time.sleep, 1.0)  # the engine's loop is busy
            # runs after LoopThread's own completion callback: the cancel queues behind it
            asyncio.current_task().add_done_callback(lambda _: engine_loop.call_soon_threadsafe(me.cancel))
            await asyncio.sleep(0.05)
            return "buffer"

        try:
            await lt.run(load(), on_orphan=released.append)
        except asyncio.CancelledError:
            return "cancelled"
        return "delivered"

    try:
        outcome = asyncio.run(caller())
        assert (outcome, released) in (("cancelled", ["buffer"]), ("delivered", []))
        assert outcome == "cancelled"  # (the ordering above makes it so; else this test checks nothing)
    finally:
        lt.stop()


def test_run_refuses_what_is_not_a_coroutine_at_once():
    """(Handed to the private loop, it would fail there and leave the caller waiting.)"""
    import pytest

    lt = LoopThread()

    async def caller():
        with pytest.raises(TypeError, match="needs a coroutine"):
            await lt.run(asyncio.sleep)  # the function, not a call of it

    try:
        asyncio.run(caller())
    finally:
        lt.stop()
