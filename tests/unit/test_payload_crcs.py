"""The put and get paths checksum a batch of payloads on worker threads, one run of
consecutive payloads per thread: every payload's CRC comes back, in order, whatever the mix
of sizes."""

from __future__ import annotations

import asyncio
import os
import random
import threading

import pytest

from lmcache_valkey import codec, store
from lmcache_valkey.store import _even_runs, _payload_crcs

KiB = 1 << 10


@pytest.mark.parametrize("sizes,n", [
    ([4] * 32, 2), ([4] * 3, 2), ([1, 100, 1], 2), ([5, 5], 8), ([1] * 5, 3), ([7], 4), ([0, 0, 9], 2),
])
def test_runs_cover_every_payload_once_in_order(sizes, n) -> None:
    runs = _even_runs(sizes, n)
    assert 1 <= len(runs) <= n
    assert [i for a, b in runs for i in range(a, b)] == list(range(len(sizes)))


def test_runs_share_the_bytes_evenly() -> None:
    runs = _even_runs([4 << 20] * 32, 4)
    assert [b - a for a, b in runs] == [8, 8, 8, 8]


def test_every_payload_gets_its_own_crc_in_order() -> None:
    rng = random.Random(3)
    sizes = [rng.choice([0, 1, 5 * KiB, store._CRC_THREAD_MIN, 600 * KiB, 2 << 20]) for _ in range(40)]
    payloads = []
    for n in sizes:  # some payloads in two parts, as a chunk with a separate header arrives
        data = os.urandom(n)
        cut = rng.randrange(n + 1)
        payloads.append((memoryview(data[:cut]), memoryview(data[cut:])))
    want = [codec.crc32c(bytes(a) + bytes(b)) for a, b in payloads]  # each payload whole, on this thread
    assert asyncio.run(_payload_crcs(payloads)) == want


def test_a_cancelled_batch_returns_only_once_no_worker_reads_its_buffers() -> None:
    """The caller may release its buffers the moment the cancellation reaches it."""
    payloads = [(memoryview(bytearray(1 << 20)),) for _ in range(16)]
    reading = []
    started, release = threading.Event(), threading.Event()
    real = store._crcs_of

    def held(part):
        # each run is held until the cancellation is on its way, so the test does not
        # depend on how fast a checksum is (ISA-L finishes a whole batch in milliseconds)
        reading.append(1)
        try:
            started.set()
            assert release.wait(30), "the test never released the worker"
            return real(part)
        finally:
            reading.pop()

    async def cancel_midway() -> None:
        task = asyncio.ensure_future(_payload_crcs(payloads))
        while not started.is_set():
            await asyncio.sleep(0.001)
        task.cancel()
        # the worker goes on reading for a while after the cancellation
        threading.Timer(0.05, release.set).start()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert release.is_set() and not reading, "a worker still reads the caller's buffers"

    store._crcs_of = held  # (looked up by name at each submit)
    try:
        asyncio.run(cancel_midway())
    finally:
        release.set()
        store._crcs_of = real
