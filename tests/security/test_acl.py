"""The ACL lines we document are allow-lists: every verb outside them is refused with NOPERM
on Valkey 9.1, Valkey 8.0 and Redis 7.0, and what they allow works only on the tenant's keys."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lmcache_valkey import acl
from support.acl_lines import acl_lines, setuser
from support.servers import DEBIAN_REDIS, DEBIAN_VALKEY, ValkeyServer

ROOT = Path(__file__).resolve().parents[2]
OWN, OWN2, OTHER = "lmcv:team-a:ns:c:{01}", "lmcv:team-a:ns:c:{02}", "lmcv:team-b:ns:c:{01}"
OWN_LIST, OTHER_LIST = "lmcv:team-a:_tierd:req", "lmcv:team-b:_tierd:req"

# Verbs no worker and no tierd may run: the keyspace, the server and other clients.
REFUSED = [
    ("FLUSHALL",), ("FLUSHDB",), ("SWAPDB", "0", "1"), ("RESTORE", OWN2, "0", "\x00"), ("KEYS", "*"),
    ("RANDOMKEY",), ("DBSIZE",), ("CLIENT", "LIST"), ("CLIENT", "KILL", "ID", "999999"), ("CLIENT", "PAUSE", "10"),
    ("CLIENT", "SETNAME", "x"), ("CONFIG", "GET", "maxmemory"), ("CONFIG", "SET", "maxmemory", "1"),
    ("DEBUG", "SLEEP", "0"), ("SHUTDOWN", "NOSAVE"), ("MONITOR",), ("MIGRATE", "127.0.0.1", "1", OWN, "0", "100"),
    ("MOVE", OWN, "1"), ("COPY", OWN, OWN2, "DB", "1"), ("RENAME", OWN, OWN2), ("DUMP", OWN),
    ("OBJECT", "ENCODING", OWN), ("MEMORY", "USAGE", OWN), ("SORT", OWN_LIST), ("ACL", "WHOAMI"), ("ACL", "LIST"),
    ("ACL", "SETUSER", "x"), ("MODULE", "LIST"), ("SCRIPT", "FLUSH"), ("FUNCTION", "FLUSH"), ("PUBLISH", "ch", "x"),
    ("SUBSCRIBE", "ch"), ("SAVE",), ("BGSAVE",), ("BGREWRITEAOF",), ("REPLICAOF", "NO", "ONE"), ("FAILOVER", "ABORT"),
    ("LATENCY", "RESET"), ("SLOWLOG", "GET"), ("WAIT", "0", "0"), ("SELECT", "1"), ("MSET", OWN, "1"),
    ("EXPIRE", OWN, "1"), ("APPEND", OWN, "x"), ("SETRANGE", OWN, "0", "x"), ("HGETALL", OWN_LIST),
    # listing key names (ACL key patterns do not filter SCAN) and scripts (they may run forever)
    ("SCAN", "0"), ("SCAN", "0", "MATCH", "lmcv:team-a:*"), ("EVAL", "return 1", "0"), ("EVALSHA", "0" * 40, "0"),
    ("FCALL", "f", "0"), ("SCRIPT", "KILL"),
]
REFUSED_WORKER = REFUSED + [("INFO",), ("OBJECT", "IDLETIME", OWN), ("LPOP", OWN_LIST), ("HKEYS", OWN_LIST),
                            ("PTTL", OWN), ("ZADD", "lmcv:team-a:_tierd:ram", "1", OWN), ("MULTI",)]
# What each principal sends, on its own keys (allowed) and on another tenant's (refused).
ALLOWED_WORKER = [("GET", OWN), ("SET", OWN, "v"), ("GETRANGE", OWN, "0", "1"), ("EXISTS", OWN), ("UNLINK", OWN2),
                  ("PING",), ("RPUSH", OWN_LIST, "x"), ("LTRIM", OWN_LIST, "0", "-1"), ("BLPOP", OWN_LIST, "0.01"),
                  ("HSET", "lmcv:team-a:_tierd:del", OWN, "1")]
ALLOWED_TIERD = [("GET", OWN), ("SET", OWN, "v", "PXAT", "99999999999999"), ("PTTL", OWN), ("EXISTS", OWN),
                 ("UNLINK", OWN2), ("OBJECT", "IDLETIME", OWN), ("ZADD", "lmcv:team-a:_tierd:ram", "1", OWN),
                 ("ZRANGE", "lmcv:team-a:_tierd:ram", "0", "9"), ("ZREM", "lmcv:team-a:_tierd:ram", OWN),
                 ("INFO", "memory"), ("RPUSH", OWN_LIST, "x"), ("LPOP", OWN_LIST, "1"), ("BLPOP", OWN_LIST, "0.01"),
                 ("PEXPIRE", OWN_LIST, "60000"), ("HSET", "lmcv:team-a:_tierd:del", OWN, "1"),
                 ("HKEYS", "lmcv:team-a:_tierd:del"), ("HDEL", "lmcv:team-a:_tierd:del", OWN)]


def _other(args: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(a.replace("lmcv:team-a:", "lmcv:team-b:") for a in args)


SERVERS = [pytest.param(None, id="valkey-9.1")] + [
    pytest.param(path, id=name, marks=pytest.mark.skipif(not os.path.exists(path), reason=f"{path} missing"))
    for path, name in ((DEBIAN_VALKEY, "valkey-8.0"), (DEBIAN_REDIS, "redis-7.0"))]


def _run(server: ValkeyServer, user: str, args: tuple[str, ...]):
    try:
        return server.cmd(*args, auth=(user, "pw"))
    except Exception as e:  # noqa: BLE001 - error replies come back as exceptions
        return e


def _refused(r) -> bool:
    return isinstance(r, Exception) and ("NOPERM" in str(r) or "no permissions" in str(r))


@pytest.fixture(scope="module")
def documented() -> dict[str, str]:
    """The lines configs/multi-tenant.yaml tells a user to copy."""
    return acl_lines((ROOT / "configs" / "multi-tenant.yaml").read_text())


@pytest.mark.parametrize("binary", SERVERS)
def test_the_documented_worker_and_tierd_lines_refuse_everything_else(binary, documented):
    # DEBUG and MODULE enabled: refused by the ACL, not by the server's protection
    with ValkeyServer(binary=binary, args=["--enable-debug-command", "yes", "--enable-module-command", "yes"]) as server:
        server.cmd("SET", OWN, "v")
        server.cmd("SET", OTHER, "theirs")
        worker = setuser(server, documented["team-a"], "pw")
        tierd = setuser(server, documented["lmcv-tierd"], "pw")
        wrong = []
        for user, refused, allowed in ((worker, REFUSED_WORKER, ALLOWED_WORKER), (tierd, REFUSED, ALLOWED_TIERD)):
            for args in refused:
                if not _refused(r := _run(server, user, args)):
                    wrong.append(f"{user} may run {args}: {r!r}")
            for args in allowed:
                if _refused(r := _run(server, user, args)):
                    wrong.append(f"{user} may not run {args}: {r!r}")
                if args[0] != "PING" and args[0] != "INFO" \
                        and not _refused(r := _run(server, user, _other(args))):
                    wrong.append(f"{user} reaches another tenant with {_other(args)}: {r!r}")
        assert not wrong, "\n".join(wrong)
        assert server.cmd("GET", OTHER) == b"theirs" and server.cmd("DBSIZE") >= 2


def test_the_lines_we_print_are_the_allow_lists(documented):
    """configs/multi-tenant.yaml, docs/security.md and the chart's values comment print the
    lines `lmcache_valkey.acl` builds (the chart's notes: tests/chart)."""
    want = {acl.operator_line("lmcv-ops", password="OPS_PASSWORD"),
            acl.tierd_line("lmcv-tierd", "team-a", password="TIERD_PASSWORD"),
            acl.worker_line("team-a", "team-a", password="TEAM_A_PASSWORD", tiering=True)}
    assert want <= set(documented.values())
    docs = acl_lines((ROOT / "docs" / "security.md").read_text())
    assert want | {acl.monitor_line()} <= set(docs.values()), set(docs.values())
    values = acl_lines((ROOT / "charts" / "lmcache-valkey" / "values.yaml").read_text())
    assert {acl.tierd_line("lmcv-tierd", "default", password="TIERD_PASSWORD"),
            acl.worker_line("default-workers", "default", password="A_PASSWORD", tiering=True),
            acl.monitor_line()} <= set(values.values())
    fabric = acl_lines((ROOT / "configs" / "fabric.yaml").read_text())
    assert fabric == {"default-workers": acl.worker_line("default-workers", "default", password="A_PASSWORD",
                                                         fabric=True)}


async def test_the_cluster_worker_line_serves_a_cluster(valkey_cluster):
    """With `+cluster|slots +asking` (and `cluster: yes`) a worker finds the slot map, stores and reads
    chunks on every shard, and no command is refused."""
    from lmcache_valkey.codec import ChunkMeta
    from lmcache_valkey.keys import make_namespace
    from lmcache_valkey.store import ChunkRef, open_store

    for s in valkey_cluster.servers:
        setuser(s, acl.worker_line("team-a", "team-a", cluster=True), "pw")
    ns = make_namespace("lmcv", "team-a", {"model": "m"}, secret=b"team-a-secret-0123456789")
    settings = valkey_cluster.settings(username="team-a", password="pw", tenant="team-a", transport="tcp", cluster="yes")

    store = await open_store(settings, ns)
    try:
        assert store.transport.is_cluster
        refs = [ChunkRef(ns.chunk_id(f"k{i}"), f"k{i}") for i in range(24)]
        meta = ChunkMeta(shapes=((64,),), dtypes=("uint8",), fmt=0)
        assert all(await store.put_many([(r, meta, memoryview(bytes([i]) * 64)) for i, r in enumerate(refs)]))
        assert await store.contains_prefix([r.chunk_id for r in refs]) == len(refs)
        assert await store.delete([r.chunk_id for r in refs[:3]]) == 3
    finally:
        await store.close()

    shards = {s.port for s in valkey_cluster.servers if s.cmd("DBSIZE")}
    assert len(shards) == len(valkey_cluster.servers)  # chunks on every shard
    for s in valkey_cluster.servers:
        assert s.cmd("ACL", "LOG") == []

    async def auto() -> None:  # `cluster: auto`: INFO is refused, CLUSTER SLOTS tells
        from dataclasses import replace

        store = await open_store(replace(settings, cluster="auto"), ns)
        try:
            assert store.transport.is_cluster
        finally:
            await store.close()

    await auto()
    refused = [dict(zip(e[::2], e[1::2]))[b"object"] for s in valkey_cluster.servers for e in s.cmd("ACL", "LOG")]
    assert refused == [b"info"]


def test_the_fabric_addition_names_every_command_of_the_dialect():
    from lmcache_valkey.transport.fabric import commands

    assert {c.lower() for c in commands.ALL} | {commands.EXPIRE.lower()} == set(acl.FABRIC)
    assert commands.DELETE.lower() in acl.WORKER  # the fabric transport deletes as the RESP one does
    assert "+blob.rdma_get" in acl.worker_line("a", "a", fabric=True) and "+blob.rdma_prove" in acl.worker_line("a", "a", fabric=True)
