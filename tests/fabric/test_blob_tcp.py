"""The ``blob-tcp`` transport: chunks stored as large objects and moved inline with
BLOB.TCP_SET / BLOB.TCP_GET, through the real store, on a standalone server, a 3-node
Cluster and a TLS server -- and a clear refusal where the commands are missing."""

from __future__ import annotations

import asyncio
import os
import shutil

import pytest

from lmcache_valkey.codec import ChunkMeta
from lmcache_valkey.config import settings_from_mapping
from lmcache_valkey.errors import FabricUnavailable
from lmcache_valkey.keys import make_namespace
from lmcache_valkey.store import ChunkRef, open_store
from support.servers import DEBIAN_VALKEY, ValkeyCluster, ValkeyServer, make_tls_files

MiB = 1 << 20


def _module(module_so) -> list[str]:
    return ["--loadmodule", str(module_so), "provider", "none", "arena_mb", "128"]


async def _round_trip(settings, n_chunks: int = 6) -> dict:
    ns = make_namespace("lmcv", settings.tenant, {"model": "m"})
    store = await open_store(settings, ns)
    try:
        assert store.transport_name == "blob-tcp"
        payloads = [os.urandom(MiB + i) for i in range(n_chunks)]
        refs = [ChunkRef(ns.chunk_id(f"k{i}"), f"k{i}") for i in range(n_chunks)]
        for ref, p in zip(refs, payloads):
            assert await store.put(ref, ChunkMeta(((len(p),),), ("uint8",), 1, ref.key_string), memoryview(p))
        assert await store.contains_prefix([r.chunk_id for r in refs]) == n_chunks
        for ref, p in zip(refs, payloads):
            out = bytearray(len(p))
            got = await store.get_into(ref, memoryview(out))
            assert got is not None and got.nbytes == len(p) and out == p
        keys = [ns.data_key(r.chunk_id) for r in refs]
        return {"keys": keys, "store": store}
    except BaseException:
        await store.close()
        raise


def test_chunks_round_trip_as_large_objects_with_their_ttl(module_so):
    with ValkeyServer(args=_module(module_so)) as srv:
        settings = settings_from_mapping({"url": srv.url, "transport": "blob-tcp", "ttl_s": 600}, env={})

        async def body():
            r = await _round_trip(settings)
            try:
                for k in r["keys"]:
                    assert srv.cmd("TYPE", k) == b"lmcvblob0"  # a module value, not a string
                    assert 0 < srv.cmd("PTTL", k) <= 600_000
                assert srv.cmd("BLOB.INFO", r["keys"][0], "LEN") > MiB  # header + payload
            finally:
                await r["store"].close()

        asyncio.run(body())


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_blob_tcp_across_a_cluster(module_so, tmp_path, tls):
    if tls and not shutil.which(DEBIAN_VALKEY):
        pytest.skip(f"{DEBIAN_VALKEY} (TLS build) not installed")
    c = ValkeyCluster(3, binary=DEBIAN_VALKEY if tls else None, tls=make_tls_files(tmp_path / "tls") if tls else None,
                      args=_module(module_so)).start()
    try:
        settings = c.settings(transport="blob-tcp")

        async def body():
            r = await _round_trip(settings, n_chunks=12)
            try:
                per_node = [s.cmd("DBSIZE") for s in c.servers]
                assert sum(per_node) == 12 and sum(1 for n in per_node if n) >= 2, per_node
            finally:
                await r["store"].close()

        asyncio.run(body())
    finally:
        c.cleanup()


def test_blob_tcp_over_tls(module_so, tmp_path):
    if not shutil.which(DEBIAN_VALKEY):
        pytest.skip(f"{DEBIAN_VALKEY} (TLS build) not installed")
    tls = make_tls_files(tmp_path / "tls")
    with ValkeyServer(binary=DEBIAN_VALKEY, tls=tls, args=_module(module_so)) as srv:
        settings = settings_from_mapping({"url": srv.url, "transport": "blob-tcp", "tls_ca_file": tls.ca_file},
                                         env={})

        async def body():
            r = await _round_trip(settings, n_chunks=2)
            await r["store"].close()

        asyncio.run(body())


async def test_a_server_without_the_commands_is_refused_with_the_reason(valkey_server):
    settings = settings_from_mapping({"url": valkey_server.url, "transport": "blob-tcp"}, env={})

    with pytest.raises(FabricUnavailable, match="BLOB.INFO"):
        await open_store(settings, make_namespace("lmcv", "t", {"model": "m"}))



def test_rdma_is_a_name_for_the_fabric_transport():
    assert settings_from_mapping({"url": "valkey://h:1", "transport": "rdma"}, env={}).transport == "fabric"
    assert settings_from_mapping({"url": "valkey://h:1", "transport": "BLOB-TCP"}, env={}).transport == "blob-tcp"
