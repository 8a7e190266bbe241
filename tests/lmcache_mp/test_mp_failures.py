"""A dead or stalled Valkey costs an MP server at most its deadlines, and it recovers by itself.

Through LMCache's storage manager: a prefetch while Valkey is down or paused finishes as a
miss (LMCache recomputes), a store finishes as failed without accounting bytes, no task stays
running, and once Valkey is back the same instances store and load again.
"""

from __future__ import annotations

import os
import signal

import pytest
from mphelp import CHUNK_BYTES, adapter_of, keys, prefetch, read, wait_for, wait_stored, want, write

from support.servers import ValkeyServer

pytestmark = pytest.mark.timeout(180)

FAST = {"op_timeout_s": 1.0, "lookup_timeout_s": 0.5, "connect_timeout_s": 0.5}


@pytest.fixture
def server():
    s = ValkeyServer().start()
    yield s
    if s.proc is not None and s.pid:
        os.kill(s.pid, signal.SIGCONT)
    s.stop()
    s.cleanup()


def _idle(sm) -> None:
    wait_for(lambda: adapter_of(sm).report_status()["running_tasks"] == {"store": 0, "lookup": 0, "load": 0},
             30, "no task left running")


def test_a_killed_server_fails_tasks_then_the_instances_recover(server, managers):
    params = {"url": server.url, "tenant": "t1", **FAST}
    writer, reader = managers(params), managers(params)
    write(writer, keys(range(4)), range(4))
    wait_stored(writer, 4 * CHUNK_BYTES)

    server.kill9()
    r = prefetch(reader, keys(range(4)))
    assert r.l2_hit_count == 0 and r.l1_hit_count == 0
    write(writer, keys(range(10, 14)), range(10, 14))  # its store task fails
    _idle(writer)
    _idle(reader)
    assert adapter_of(writer).get_usage().total_bytes_used == 4 * CHUNK_BYTES  # failed stores add nothing
    assert adapter_of(reader).report_status()["is_healthy"] is False
    assert adapter_of(reader).report_status()["locked_keys"] == 0

    server.restart()  # same port, empty
    wait_for(lambda: adapter_of(reader).report_status()["is_healthy"], 30, "reconnect")
    write(writer, keys(range(20, 24)), range(20, 24))
    wait_stored(writer, 8 * CHUNK_BYTES)
    r = prefetch(reader, keys(range(20, 24)))
    assert r.l2_hit_count == 4
    assert read(reader, keys(range(20, 24))) == want(range(20, 24))


def test_a_paused_server_turns_lookups_and_loads_into_misses_while_it_is_still_paused(server, managers):
    params = {"url": server.url, "tenant": "t1", **FAST}
    writer, reader = managers(params), managers(params)
    write(writer, keys(range(4)), range(4))
    wait_stored(writer, 4 * CHUNK_BYTES)

    os.kill(server.pid, signal.SIGSTOP)  # accepts connections, answers nothing
    try:
        r = prefetch(reader, keys(range(4)))
        assert r.l2_hit_count == 0
        _idle(reader)
        assert open(f"/proc/{server.pid}/stat").read().split(")")[-1].split()[0] == "T", "finished only after resume"
    finally:
        os.kill(server.pid, signal.SIGCONT)
    r = prefetch(reader, keys(range(4)))
    assert r.l2_hit_count == 4
    assert read(reader, keys(range(4))) == want(range(4))
