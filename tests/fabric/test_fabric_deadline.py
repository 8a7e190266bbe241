"""A transfer to a client that stops making progress ends at its deadline with a TIMEOUT
reply, while the server's main thread keeps serving everyone else; the stalled transfer's
references are released once its operations end (client killed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SIZE = 256 << 20  # far more than the kernel's socket buffers: the write must stall


def _poll(pred, tries: int = 200, every: float = 0.05) -> bool:
    for _ in range(tries):
        if pred():
            return True
        time.sleep(every)
    return False


def test_stalled_target_times_out_and_main_thread_stays_responsive(start_server):
    srv = start_server("tcp;ofi_rxm", arena_mb=512, extra=("max_timeout_ms", "60000"))
    c = srv.client()
    c.execute_command("BLOB.TCP_SET", b"big", os.urandom(SIZE))
    used_before = srv.info()["arena_used_bytes"]
    helper = subprocess.Popen([sys.executable, str(HERE / "stall_client.py"), str(srv.port), str(SIZE), "1000"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert helper.stdout.readline().strip() == "sent"
        # While the fabric thread is stuck on the stopped target, the main thread answers.
        for _ in range(20):
            assert c.ping()
            c.set(b"other", b"x")
        assert _poll(lambda: srv.info()["xfers_timedout"] == 1), srv.info()
        info = srv.info()
        assert info["xfers_failed"] == 0 and info["rma_gets"] == 1
    finally:
        os.kill(helper.pid, signal.SIGKILL)
        helper.wait()
    # The client is gone: its connection resets, the in-flight ops fail, the transfer's
    # reference on the value is dropped and the session is removed.
    c.delete(b"big")
    assert _poll(lambda: srv.info()["arena_used_bytes"] == 0 and srv.info()["sessions"] == 0), srv.info()
    assert used_before >= SIZE


async def test_a_stalled_peer_holds_up_only_its_own_transfers(start_server):
    """A worker (or a tenant's hostile process) that stops making progress in the middle of a
    large RMA GET keeps its own operations in flight for as long as it likes (up to the
    TIMEOUT it asked for); every other peer's transfers still move at once."""
    from lmcache_valkey.transport.fabric import FabricTransport

    srv = start_server("tcp;ofi_rxm", arena_mb=512, extra=("max_timeout_ms", "600000"))
    c = srv.client()
    c.execute_command("BLOB.TCP_SET", b"big", os.urandom(SIZE))
    small = os.urandom(1 << 20)
    c.execute_command("BLOB.TCP_SET", b"small", small)
    helper = subprocess.Popen([sys.executable, str(HERE / "stall_client.py"), str(srv.port), str(SIZE), "600000",
                               "warm", "small"], stdout=subprocess.PIPE, text=True)
    try:
        assert helper.stdout.readline().strip() == "sent"
        # The stalled GET fills its window of operations (the warm-up GET was one more).
        assert _poll(lambda: srv.info()["ops_posted"] >= 65), srv.info()
        async with FabricTransport("127.0.0.1", srv.port, bulk_fallback=False) as other:
            buf = bytearray(len(small))
            other.register_buffer(buf)
            for _ in range(3):
                buf[:] = bytes(len(buf))
                assert await other.get_into(b"small", [memoryview(buf)], 10) == len(small)
                assert buf == small
            assert other.peer_proof is True  # the address proof went through as well
        info = srv.info()
        assert info["xfers_timedout"] == 0 and info["proofs_failed"] == 0, info  # the stalled GET still waits
    finally:
        os.kill(helper.pid, signal.SIGKILL)
        helper.wait()


def test_client_unblock_cannot_answer_a_transfer_the_server_still_runs(start_server):
    """Only the fabric thread's end of a transfer answers its client. (CLIENT UNBLOCK used to
    end the block with an error while the server kept writing into the client's buffer,
    which the client had every reason to reuse once answered.)"""
    srv = start_server("tcp;ofi_rxm", arena_mb=512, extra=("max_timeout_ms", "600000"))
    c = srv.client()
    c.execute_command("BLOB.TCP_SET", b"big", os.urandom(SIZE))
    c.execute_command("BLOB.TCP_SET", b"small", b"s" * 4096)
    helper = subprocess.Popen([sys.executable, str(HERE / "stall_client.py"), str(srv.port), str(SIZE), "600000",
                               "warm", "small"], stdout=subprocess.PIPE, text=True)
    try:
        assert helper.stdout.readline().strip() == "sent"
        assert _poll(lambda: c.info("clients")["blocked_clients"] == 1)
        blocked = [x for x in c.client_list() if "b" in x["flags"]]  # flag b: blocked
        assert len(blocked) == 1, c.client_list()
        assert c.execute_command("CLIENT", "UNBLOCK", blocked[0]["id"]) == 0
        assert c.execute_command("CLIENT", "UNBLOCK", blocked[0]["id"], "ERROR") == 0
        assert c.info("clients")["blocked_clients"] == 1 and srv.info()["xfers_timedout"] == 0
    finally:
        os.kill(helper.pid, signal.SIGKILL)
        helper.wait()
