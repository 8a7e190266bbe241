"""Server killed mid-transfer: every operation ends with a typed error (never a hang),
and the same transport works again once a server is back on the port."""

from __future__ import annotations

import asyncio
import os

from lmcache_valkey.errors import TransportError
from lmcache_valkey.transport.fabric import FabricTransport

MiB = 1 << 20
SIZE = 32 * MiB
OP_TIMEOUT = 5.0
HANG_GUARD = OP_TIMEOUT + 10.0  # not a performance bound: only turns a hang into a failure


async def test_server_killed_mid_transfer_then_recovery(start_server):
    srv = start_server("tcp;ofi_rxm")
    results: list[object] = []

    async with FabricTransport("127.0.0.1", srv.port, connections=4) as t:
        arena = bytearray(8 * SIZE)
        t.register_buffer(arena)
        mv = memoryview(arena)
        mv[:SIZE] = os.urandom(SIZE)
        await t.set_from(b"big", [mv[:SIZE]], None, OP_TIMEOUT)
        stop = asyncio.Event()

        async def worker(i: int):
            dst = mv[(i + 1) * SIZE : (i + 2) * SIZE]
            while not stop.is_set():
                try:
                    if i % 2:
                        await asyncio.wait_for(t.get_into(b"big", [dst], OP_TIMEOUT), HANG_GUARD)
                    else:
                        await asyncio.wait_for(t.set_from(b"w%d" % i, [dst], None, OP_TIMEOUT), HANG_GUARD)
                    results.append("ok")
                except TransportError as exc:
                    results.append(exc)
                    return

        workers = [asyncio.create_task(worker(i)) for i in range(4)]
        while results.count("ok") < 8:
            await asyncio.sleep(0.01)
        srv.kill()  # SIGKILL by PID while transfers are running
        done, pending = await asyncio.wait(workers, timeout=HANG_GUARD + 5)
        stop.set()
        assert not pending, "an operation hung after the server died"
        errors = [r for r in results if r != "ok"]
        assert len(errors) == 4 and all(isinstance(e, TransportError) for e in errors)

        # Restart on the same port; the same transport reconnects and HELLOs again.
        srv.start()
        assert await t.get_into(b"big", [mv[SIZE : 2 * SIZE]], OP_TIMEOUT) is None
        await t.set_from(b"again", [mv[:SIZE]], None, OP_TIMEOUT)
        assert await t.get_into(b"again", [mv[SIZE : 2 * SIZE]], OP_TIMEOUT) == SIZE
        assert mv[:SIZE] == mv[SIZE : 2 * SIZE]



async def test_cancelled_caller_leaves_buffers_held_until_the_server_replies(start_server):
    srv = start_server("tcp;ofi_rxm")

    async with FabricTransport("127.0.0.1", srv.port, connections=1) as t:
        arena = bytearray(2 * SIZE)
        t.register_buffer(arena)
        mv = memoryview(arena)
        mv[:SIZE] = os.urandom(SIZE)
        await t.set_from(b"big", [mv[:SIZE]], None, OP_TIMEOUT)
        released = asyncio.Event()
        task = asyncio.create_task(t.get_into(b"big", [mv[SIZE:]], OP_TIMEOUT, on_release=released.set))
        await asyncio.sleep(0)  # the command is on its way
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        # The transfer goes on in the background with the buffer still referenced ...
        assert t.pending_ops == 1 and not released.is_set()
        await asyncio.wait_for(released.wait(), OP_TIMEOUT + 5)
        assert t.pending_ops == 0
        # ... and it completed into the buffer before the buffer was released.
        assert mv[:SIZE] == mv[SIZE:]

