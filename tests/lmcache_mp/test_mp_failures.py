"""A dead or stalled Valkey costs an MP server at most its deadlines, and it recovers by itself.

Through LMCache's storage manager: a prefetch while Valkey is down or paused finishes as a
miss (LMCache recomputes), a store finishes as failed without accounting bytes, no task stays
running, and once Valkey is back the same instances store and load again.
"""

from __future__ import annotations

import gc
import os
import signal

import pytest
from mphelp import CHUNK_BYTES, T1, adapter_of, keys, prefetch, read, wait_for, wait_stored, want, write

from support.servers import ValkeyServer

# A callback that raises where nothing can catch it (a load's release callback on a closed
# loop, "Event loop is closed") fails the test instead of passing as a logged warning.
pytestmark = [pytest.mark.timeout(180), pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")]

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
    params = {"url": server.url, **T1, **FAST}
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
    for sm in (writer, reader):  # each reconnects (after its back-off) on its own
        wait_for(lambda: adapter_of(sm).report_status()["is_healthy"], 30, "reconnect")
    write(writer, keys(range(20, 24)), range(20, 24))
    wait_stored(writer, 8 * CHUNK_BYTES)
    r = prefetch(reader, keys(range(20, 24)))
    assert r.l2_hit_count == 4
    assert read(reader, keys(range(20, 24))) == want(range(20, 24))


def test_a_paused_server_turns_lookups_and_loads_into_misses_while_it_is_still_paused(server, managers):
    params = {"url": server.url, **T1, **FAST}
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


def _direct_adapter(url: str, n: int, size: int):
    """Our adapter as LMCache's factory builds it, over LMCache MemoryObjs in one L1 buffer."""
    import argparse
    import json

    import torch
    from lmcache.cli.commands.bench.l2_adapter_bench.data import create_l1_memory_desc, make_memory_objects
    from lmcache.v1.distributed.l2_adapters import create_l2_adapter
    from lmcache.v1.distributed.l2_adapters.config import parse_args_to_l2_adapters_config
    from mphelp import spec

    cfg = parse_args_to_l2_adapters_config(argparse.Namespace(l2_adapter=[json.dumps(spec({"url": url, **FAST}))]))
    buffer = torch.zeros(2 * n * size, dtype=torch.uint8)
    adapter = create_l2_adapter(cfg.adapters[0], l1_memory_desc=create_l1_memory_desc(buffer))
    return adapter, make_memory_objects(buffer, n, size, 0, fill_offset=1), make_memory_objects(buffer, n, size, n * size)


def test_a_server_killed_during_a_load_fails_it_and_close_still_returns(server):
    import torch

    n, size = 32, 4 << 20
    adapter, src, dst = _direct_adapter(server.url, n, size)
    try:
        ks = keys(range(n))
        stored: dict = {}
        tid = adapter.submit_store_task(ks, src)
        wait_for(lambda: stored.update(adapter.pop_completed_store_tasks()) or tid in stored, 60, "store")
        assert stored[tid].is_successful()
        tid = adapter.submit_load_task(ks, dst)
        server.kill9()  # while 128 MiB are on their way
        loaded: list = []
        wait_for(lambda: loaded.append(adapter.query_load_result(tid)) or loaded[-1] is not None, 60, "the load")
        bits = loaded[-1]  # however far it got: what it reports loaded is byte-exact
        assert all(torch.equal(src[i].raw_data, dst[i].raw_data) for i in range(n) if bits.test(i))
        # then a paused server: a load in flight, and close() must still return
        server.restart()
        wait_for(lambda: adapter.report_status()["is_healthy"], 30, "reconnect")
        stored.clear()
        tid = adapter.submit_store_task(ks[:4], src[:4])
        wait_for(lambda: stored.update(adapter.pop_completed_store_tasks()) or tid in stored, 60, "store")
        assert stored[tid].is_successful()
        os.kill(server.pid, signal.SIGSTOP)
        adapter.submit_load_task(ks[:4], dst[:4])
    finally:
        adapter.close()  # bounded: pytest's timeout fails the test if it is not
        gc.collect()  # the load that was in flight is over: nothing of it runs on the closed loop
    assert adapter.report_status()["is_healthy"] is False
