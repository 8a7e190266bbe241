"""A GET that misses its deadline gives its buffers back (LMCache hands them to other
chunks), and a server paused for any length of time -- before it read the command, or with
writes already queued -- never writes into them afterwards: the transport closes the link
the transfer used (connections, endpoint, keys) before it lets the buffers go."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest

from lmcache_valkey.errors import TransportError
from lmcache_valkey.transport.fabric import FabricTransport, commands

MiB = 1 << 20
SIZE = 64 * MiB
PATTERN = 0x5A
GUARD_S = 60.0  # turns a hang into a failure; not a performance bound


def _wait_until(pred, seconds: float = GUARD_S, every: float = 0.02) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(every)
    return False


def _transfers_ended(info: dict) -> bool:
    """Every RMA GET the server started has ended (done, failed or timed out)."""
    return info["xfers_ok"] + info["xfers_failed"] + info["xfers_timedout"] >= info["rma_gets"]


@pytest.mark.parametrize("provider", ["tcp;ofi_rxm", "sockets"])
@pytest.mark.parametrize("pause", ["before-the-command", "mid-transfer"])
def test_a_paused_server_never_writes_into_buffers_given_back(start_server, provider, pause):
    srv = start_server(provider, arena_mb=2 * SIZE // MiB)
    value = os.urandom(SIZE)
    srv.client().execute_command(commands.TCP_SET, b"big", value)
    paused = False

    def stop() -> None:
        nonlocal paused
        os.kill(srv.proc.pid, signal.SIGSTOP)
        paused = True

    async def body() -> None:
        nonlocal paused
        async with FabricTransport("127.0.0.1", srv.port, provider=provider, connections=2,
                                   drain_grace_s=0.5, bulk_fallback=False) as t:
            arena = bytearray(SIZE)
            t.register_buffer(arena)
            mv = memoryview(arena)
            assert await t.get_into(b"big", [mv], 10) == SIZE  # sessions and provider links are up
            mv[:] = bytes(SIZE)
            released = threading.Event()
            if pause == "before-the-command":
                stop()
                get = asyncio.create_task(t.get_into(b"big", [mv], 1.0, on_release=released.set))
            else:
                get = asyncio.create_task(t.get_into(b"big", [mv], 1.0, on_release=released.set))
                # Stop the server once the first bytes landed: the rest is posted or queued.
                landed = await asyncio.to_thread(_wait_until, lambda: mv[:4096] != bytes(4096), 10, 0.0005)
                stop()
                assert landed and mv[-4096:] != value[-4096:], "the transfer finished before the pause"
            with pytest.raises(TransportError):
                await get
            # The buffers come back while the server is still stopped ...
            assert await asyncio.to_thread(released.wait, GUARD_S), "the buffers were never given back"
            assert t.stats["revocations"] >= 1
            # ... LMCache hands them to other chunks ...
            mv[:] = bytes([PATTERN]) * SIZE
            os.kill(srv.proc.pid, signal.SIGCONT)
            paused = False
            # ... and whatever the server still does for that GET ends without a byte landing.
            assert await asyncio.to_thread(_wait_until, lambda: _transfers_ended(srv.info())), srv.info()
            await asyncio.sleep(0.5)
            assert mv.tobytes().count(PATTERN) == SIZE, "a late write reached a buffer that was given back"
            # The transport carries on with a new link (new address, new keys).
            assert await t.get_into(b"big", [mv], 10) == SIZE and mv == value

    try:
        asyncio.run(body())
    finally:
        if paused:
            os.kill(srv.proc.pid, signal.SIGCONT)


async def test_a_cancelled_get_against_a_healthy_server_releases_without_revoking(start_server):
    """A caller that stops waiting costs no revocation when the server answers within its
    deadline: the buffers go back when the reply arrives."""
    srv = start_server("tcp;ofi_rxm")
    srv.client().execute_command(commands.TCP_SET, b"k", os.urandom(16 * MiB))

    async with FabricTransport("127.0.0.1", srv.port) as t:
        arena = bytearray(16 * MiB)
        t.register_buffer(arena)
        released = asyncio.Event()
        task = asyncio.create_task(t.get_into(b"k", [memoryview(arena)], 5, on_release=released.set))
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.wait_for(released.wait(), GUARD_S)
        assert t.stats["revocations"] == 0

