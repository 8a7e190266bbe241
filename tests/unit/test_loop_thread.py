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
