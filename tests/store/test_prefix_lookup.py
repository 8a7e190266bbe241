"""A prefix lookup on a standalone server asks for counts of blocks of keys (one EXISTS per
16 keys, then per key of one block at most), and answers exactly what asking per key would:
on the engine's thread, on the store's loop and on the engine's loop; holes after the prefix
or inside its first block; a server that refuses multi-key EXISTS; a server that lies."""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest
from support import sessions
from support.hostile import HostileServer
from support.servers import ValkeyCluster

from lmcache_valkey import metrics
from lmcache_valkey.config import settings_from_mapping
from lmcache_valkey.keys import make_namespace

pytestmark = pytest.mark.timeout(120)

NS = make_namespace("lmcv", "team-a", {"model": "prefix-lookups"})
N = 100  # keys per lookup: six full blocks of 16 and one of 4


def opened(settings: Any, tiering: Any = None):
    return sessions.opened(settings, NS, tiering)


def ids(prefix: str, n: int = N) -> list[str]:
    return [NS.chunk_id(f"{prefix}-{i}") for i in range(n)]


put = sessions.put_small


def exists_calls(server) -> int:
    stats = server.cmd("INFO", "commandstats").decode()
    if "cmdstat_exists:" not in stats:
        return 0
    return int(stats.split("cmdstat_exists:calls=")[1].split(",")[0])


# which of the N keys are stored -> the prefix a lookup must answer
PATTERNS = {
    "all": (set(range(N)), N),
    "none": (set(), 0),
    "one full block": (set(range(16)), 16),
    "mid block": (set(range(40)), 40),
    "mid block, more after a hole": (set(range(40)) | set(range(60, N)), 40),
    "a hole in the first block": (set(range(N)) - {3}, 3),
    "the first missing": (set(range(1, N)), 0),
    "only the last": ({N - 1}, 0),
    "all but the last": (set(range(N - 1)), N - 1),
    "the last block's first only": (set(range(97)), 97),
}


@pytest.mark.parametrize("pattern", list(PATTERNS))
async def test_every_path_answers_the_prefix_asking_per_key_would(valkey_server, pattern: str) -> None:
    stored, want = PATTERNS[pattern]
    with opened(valkey_server.settings(transport="tcp")) as session:
        keys = ids(pattern.replace(" ", "-"))
        if stored:
            put(session, [keys[i] for i in sorted(stored)])
        store = session.store
        assert store.contains_prefix_blocking(keys) == want  # the engine's thread
        assert session.contains_prefix(keys, 5) == want
        assert session.run_sync(store.contains_prefix(keys), 5) == want  # the store's loop
        assert await session.contains_prefix_async(keys, 5) == want  # the engine's loop
        assert await store.contains_prefix_on_caller_loop(keys) == want  # (over the lane's idle connection)
        # a lookup of every key still answers every key
        assert session.run_sync(store.contains_each(keys), 5) == [i in stored for i in range(N)]
        assert store.contains_each_blocking(keys) == [i in stored for i in range(N)]


def test_the_server_runs_one_exists_per_block_and_per_key_of_one_block_at_most(valkey_server) -> None:
    with opened(valkey_server.settings(transport="tcp")) as session:
        keys = ids("counted", 512)
        put(session, keys[:300])
        store = session.store
        assert store.contains_prefix_blocking(keys[:300]) == 300  # (connections open)
        valkey_server.cmd("CONFIG", "RESETSTAT")
        assert store.contains_prefix_blocking(keys[:256]) == 256  # a full hit: 16 blocks
        assert exists_calls(valkey_server) == 16
        valkey_server.cmd("CONFIG", "RESETSTAT")
        assert store.contains_prefix_blocking(keys) == 300  # 32 blocks, then the 16 keys of block 19
        assert exists_calls(valkey_server) == 32 + 16
        valkey_server.cmd("CONFIG", "RESETSTAT")
        assert session.run_sync(store.contains_prefix(keys), 5) == 300  # the same on the loop's path
        assert exists_calls(valkey_server) == 32 + 16
        valkey_server.cmd("CONFIG", "RESETSTAT")
        assert store.contains_prefix_blocking(keys[:20]) == 20  # few keys: per key
        assert exists_calls(valkey_server) == 20


def test_prefix_lookup_per_key_asks_one_exists_per_key(valkey_server) -> None:
    with opened(valkey_server.settings(transport="tcp", prefix_lookup="per_key")) as session:
        keys = ids("per-key-setting")
        put(session, keys[:40])
        assert session.store.contains_prefix_blocking(keys) == 40
        valkey_server.cmd("CONFIG", "RESETSTAT")
        assert session.store.contains_prefix_blocking(keys) == 40
        assert exists_calls(valkey_server) == N


def test_a_cluster_node_addressed_as_standalone_is_asked_per_key_after_refusing_once() -> None:
    with ValkeyCluster(1) as cluster:
        node = cluster.servers[0]
        with opened(cluster.settings(transport="tcp", cluster="no")) as session:
            keys = ids("one-node-cluster")
            put(session, keys[:40])
            assert session.contains_prefix(keys, 5) == 40  # CROSSSLOT, then per key
            node.cmd("CONFIG", "RESETSTAT")
            assert session.store.contains_prefix_blocking(keys) == 40
            assert exists_calls(node) == N  # per key at once: no multi-key EXISTS tried again


def _hostile_settings(srv: HostileServer) -> Any:
    return settings_from_mapping({"url": srv.url, "transport": "tcp", "lookup_timeout_s": 0.5, "cluster": "no"},
                                 env={})


def _lookup_errors() -> float:
    return sum(metrics.ERRORS.labels("lookup", c)._value.get() for c in metrics.ERROR_CAUSES)


@pytest.mark.parametrize("count", [b":17\r\n", b":-1\r\n", b"$2\r\n16\r\n", b"+16\r\n"],
                         ids=["more-than-the-block", "negative", "a-bulk", "a-status"])
def test_a_block_count_that_cannot_be_is_a_counted_miss_never_a_hit(count: bytes) -> None:
    def lie(name: bytes, args: list[bytes]) -> bytes | None:
        return count if name == b"EXISTS" and len(args) > 1 else None

    with HostileServer(lie) as srv, opened(_hostile_settings(srv)) as session:
        keys = ids("lying-count")
        put(session, keys)
        errors = _lookup_errors()
        assert session.contains_prefix(keys, 5) == 0
        assert session.run_sync(session.store.contains_prefix(keys), 5) == 0
        assert _lookup_errors() == errors + 2


def test_a_lane_connection_that_answered_more_counts_than_asked_is_not_used_again() -> None:
    def lie(name: bytes, args: list[bytes]) -> bytes | None:
        if name == b"EXISTS" and len(args) > 1 and args[0] == keys[96]:  # the last block
            return b":4\r\n:4\r\n"  # one reply too many, in the same write as the last one
        return None

    chunk_ids = ids("extra-count")
    keys = [NS.data_key(c) for c in chunk_ids]
    with HostileServer(lie) as srv, opened(_hostile_settings(srv)) as session:
        put(session, chunk_ids)
        lane = session.store.transport._blocking
        errors = _lookup_errors()
        assert session.store.contains_prefix_blocking(chunk_ids) == 0  # a counted miss
        assert _lookup_errors() == errors + 1
        assert not lane._idle.get(session.store.transport._primary)  # that connection was dropped


def test_an_error_reply_to_a_block_count_is_asked_again_per_key() -> None:
    """(An error that may pass, such as a failover's READONLY, is not remembered: the next
    lookup tries the counts again.)"""
    def lie(name: bytes, args: list[bytes]) -> bytes | None:
        return b"-READONLY not now\r\n" if name == b"EXISTS" and len(args) > 1 else None

    with HostileServer(lie) as srv, opened(_hostile_settings(srv)) as session:
        keys = ids("error-count")
        put(session, keys[:50])
        for _ in range(2):
            del srv.commands[:]
            assert session.contains_prefix(keys, 5) == 50
            # counts tried on the lane, again on the loop's path, then per key there
            assert srv.commands.count(b"EXISTS") == 2 * 7 + N


def test_a_server_that_never_takes_several_keys_is_asked_per_key_from_the_second_lookup_on() -> None:
    def lie(name: bytes, args: list[bytes]) -> bytes | None:
        return b"-ERR wrong number of arguments for 'exists' command\r\n" if name == b"EXISTS" and len(args) > 1 else None

    with HostileServer(lie) as srv, opened(_hostile_settings(srv)) as session:
        keys = ids("old-server")
        put(session, keys[:50])
        assert session.contains_prefix(keys, 5) == 50
        del srv.commands[:]
        assert session.contains_prefix(keys, 5) == 50
        assert srv.commands.count(b"EXISTS") == N


async def test_a_slow_refusal_of_the_counts_leaves_the_per_key_lookup_only_what_is_left() -> None:
    """The deadline covers both: counts refused after 0.3 s, per-key answers 0.3 s late, 0.5 s
    in all: past it, not a second deadline's worth later."""
    import time

    from lmcache_valkey.errors import DeadlineExceeded
    from lmcache_valkey.transport.resp import RespClient

    paused: set[str] = set()

    def lie(name: bytes, args: list[bytes]) -> bytes | None:
        if name != b"EXISTS":
            return None
        stage = "counts" if len(args) > 1 else "per key"
        if stage not in paused:  # (once per stage: this server answers in order)
            paused.add(stage)
            time.sleep(0.3)
        return b"-READONLY You can't write against a read only replica.\r\n" if stage == "counts" else None

    keys = [NS.data_key(c) for c in ids("slow-refusal")]
    with HostileServer(lie) as srv:
        for k in keys:
            srv.data[k] = b"v"
        client = RespClient(_hostile_settings(srv))
        await client.start()
        try:
            with pytest.raises(DeadlineExceeded):
                await client.exists_many(keys, timeout=0.5, prefix=True)
        finally:
            await client.close()


def test_an_engines_lookup_retried_on_the_loop_gets_only_what_the_lane_left_of_its_deadline() -> None:
    """The lane's try (counts refused after 0.3 s: it leaves the answer to the loop) and the
    loop's (the same again) share the engine's 0.5 s: a counted miss then, not an answer
    ~0.7 s after the engine asked."""
    import time

    from lmcache_valkey.session import LOOP_GRACE_S

    def lie(name: bytes, args: list[bytes]) -> bytes | None:
        if name == b"EXISTS" and len(args) > 1:
            if args[0] == keys[0]:  # the first block of each try
                time.sleep(0.3)
            return b"-READONLY You can't write against a read only replica.\r\n"
        return None

    chunk_ids = ids("slow-lane")
    keys = [NS.data_key(c) for c in chunk_ids]
    with HostileServer(lie) as srv, opened(_hostile_settings(srv)) as session:
        put(session, chunk_ids[:50])
        errors = _lookup_errors()
        started = time.monotonic()
        assert session.contains_prefix(chunk_ids, 0.5) == 0
        assert time.monotonic() - started < 0.5 + LOOP_GRACE_S
        assert _lookup_errors() == errors + 1


def test_with_tiering_a_lookup_asks_per_key_for_values_and_markers(valkey_server, tmp_path) -> None:
    """A tiered store needs every chunk's answer (its marker may stand for a value that
    went to NVMe): no counts there."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tiering"))
    from tierhelp import tiering

    with opened(valkey_server.settings(transport="tcp"), tiering(nvme_dir=str(tmp_path / "nvme"))) as session:
        keys = ids("tiered")
        put(session, keys[:40])
        assert session.store.contains_prefix_blocking(keys) == 40
        valkey_server.cmd("CONFIG", "RESETSTAT")
        assert session.store.contains_prefix_blocking(keys) == 40
        assert exists_calls(valkey_server) >= 2 * N  # (and the tier manager may look misses up too)
