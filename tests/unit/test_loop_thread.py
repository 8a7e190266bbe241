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
