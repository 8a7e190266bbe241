"""RMA on the large-object path in Valkey Cluster (slot routing, per-node sessions, MOVED)
and with TLS on the control connections, through the real store."""

from __future__ import annotations

import asyncio
import os
import shutil

import pytest

from lmcache_valkey.codec import ChunkMeta
from lmcache_valkey.config import settings_from_mapping
from lmcache_valkey.keys import make_namespace
from lmcache_valkey.store import ChunkRef, open_store
from lmcache_valkey.transport.fabric import ClusterFabricTransport
from lmcache_valkey.transport.resp.cluster import key_slot
from support.servers import DEBIAN_VALKEY, ValkeyCluster, ValkeyServer, make_tls_files

MiB = 1 << 20
PROVIDER = "tcp;ofi_rxm"


def _module(module_so) -> list[str]:
    return ["--loadmodule", str(module_so), "provider", PROVIDER, "bind", "127.0.0.1", "arena_mb", "128"]


def _info(server) -> dict:
    raw = server.cmd("INFO", "lmcvblob").decode()
    return {k.removeprefix("lmcvblob_"): int(v) for k, v in
            (line.split(":", 1) for line in raw.splitlines() if ":" in line and not line.startswith("#"))
            if v.strip().isdigit()}


def _settings(url: str, **kw):
    raw = {"url": url, "transport": "fabric", "fabric_provider": PROVIDER, "fabric_bind_addr": "127.0.0.1", **kw}
    return settings_from_mapping(raw, env={})


async def _put_all(store, ns, arena: memoryview, n: int, size: int) -> list[tuple[ChunkRef, bytes]]:
    out = []
    for i in range(n):
        payload = os.urandom(size)
        arena[i * size : (i + 1) * size] = payload
        ref = ChunkRef(ns.chunk_id(f"k{i}"), f"k{i}")
        assert await store.put(ref, ChunkMeta(((size,),), ("uint8",), 1, f"k{i}"), arena[i * size : (i + 1) * size])
        out.append((ref, payload))
    return out


def _cluster(module_so, tmp_path, tls: bool) -> ValkeyCluster:
    if not tls:
        return ValkeyCluster(3, args=_module(module_so)).start()
    if not shutil.which(DEBIAN_VALKEY):
        pytest.skip(f"{DEBIAN_VALKEY} (TLS build) not installed")
    return ValkeyCluster(3, binary=DEBIAN_VALKEY, tls=make_tls_files(tmp_path / "tls"), args=_module(module_so)).start()


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_rma_in_a_cluster_routes_by_slot_and_follows_moved(module_so, tmp_path, tls):
    """Also the managed setup: cluster mode with TLS required on every node (control
    connections and cluster bus), one proven session per node."""
    c = _cluster(module_so, tmp_path, tls)
    try:
        async def body():
            ns = make_namespace("lmcv", "t", {"model": "m"})
            store = await open_store(_settings(c.url, **({"tls_ca_file": c.tls.ca_file} if tls else {})), ns)
            try:
                assert store.transport_name == "fabric" and isinstance(store.transport, ClusterFabricTransport)
                arena = bytearray(64 * MiB)
                store.register_memory(*_address(arena))
                mv = memoryview(arena)
                size = 2 * MiB
                chunks = await _put_all(store, ns, mv, 12, size)
                out = mv[32 * MiB :]
                for ref, payload in chunks:
                    got = await store.get_into(ref, out[:size])
                    assert got is not None and out[:size] == payload
                # Move the slot of the first chunk to another node: the next get meets MOVED,
                # the transport updates its map and reads from the new owner.
                key = ns.data_key(chunks[0][0].chunk_id)
                slot = key_slot(key)
                src = c.owner_of(slot)
                c.migrate_slot(slot, next(s for s in c.servers if s is not src))
                got = await store.get_into(chunks[0][0], out[:size])
                assert got is not None and out[:size] == chunks[0][1]
                assert store.transport.stats["bulk_fallbacks"] == 0
                assert store.transport.peer_proof is True
            finally:
                await store.close()

        asyncio.run(body())
        infos = [_info(s) for s in c.servers]
        assert sum(i["rma_sets"] for i in infos) == 12
        assert sum(1 for i in infos if i["rma_gets"]) >= 2, infos  # the reads spread over the nodes
        assert sum(i["proofs_ok"] for i in infos) >= 3  # a proven session on every node
    finally:
        c.cleanup()


def test_rma_with_tls_on_the_control_connections(module_so, tmp_path):
    if not shutil.which(DEBIAN_VALKEY):
        pytest.skip(f"{DEBIAN_VALKEY} (TLS build) not installed")
    tls = make_tls_files(tmp_path / "tls")
    with ValkeyServer(binary=DEBIAN_VALKEY, tls=tls, args=_module(module_so)) as srv:
        async def body():
            ns = make_namespace("lmcv", "t", {"model": "m"})
            store = await open_store(_settings(srv.url, tls_ca_file=tls.ca_file), ns)
            try:
                assert store.transport_name == "fabric"
                arena = bytearray(16 * MiB)
                store.register_memory(*_address(arena))
                mv = memoryview(arena)
                (ref, payload), = await _put_all(store, ns, mv, 1, 4 * MiB)
                got = await store.get_into(ref, mv[8 * MiB : 12 * MiB])
                assert got is not None and mv[8 * MiB : 12 * MiB] == payload
            finally:
                await store.close()

        asyncio.run(body())
        info = _info(srv)
        assert info["rma_gets"] == 1 and info["rma_sets"] == 1


def _address(buf: bytearray) -> tuple[int, int]:
    import ctypes

    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf)), len(buf)
