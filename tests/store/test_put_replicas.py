"""``put_replicas``: a user who cannot afford to lose an acknowledged put in a failover asks
for it to be on N replicas first (WAIT after each SET, on the SET's connection). A put the
replicas did not confirm in time is not acknowledged, and is counted; one they did is on
the replica, byte-exact, the moment the put returns."""

from __future__ import annotations

import os
import signal
import time

import pytest

from lmcache_valkey import acl, metrics
from lmcache_valkey.codec import HEADER_SIZE, ChunkMeta
from lmcache_valkey.errors import ConfigError
from lmcache_valkey.keys import make_namespace
from lmcache_valkey.store import ChunkRef, open_store
from support.acl_lines import setuser
from support.servers import ValkeyServer

pytestmark = pytest.mark.timeout(90)

NS = make_namespace("lmcv", "default", {"model": "put-replicas-test"})
SIZE = (1 << 20) + 17
META = ChunkMeta(shapes=((SIZE,),), dtypes=("uint8",), fmt=0)


def ref(name: str) -> ChunkRef:
    return ChunkRef(NS.chunk_id(name), name)


def not_replicated() -> float:
    return metrics.ERRORS.labels("put", "replicas")._value.get()


@pytest.fixture
def replica(valkey_server):
    r = ValkeyServer(args=["--replicaof", "127.0.0.1", str(valkey_server.port)]).start()
    try:
        r.wait_linked()
        yield r
    finally:
        try:
            os.kill(r.pid, signal.SIGCONT)  # a test that paused it and failed
        except (OSError, TypeError):
            pass
        r.stop()


async def test_an_acknowledged_put_is_already_on_the_replica(valkey_server, replica) -> None:
    store = await open_store(valkey_server.settings(transport="tcp", put_replicas=1), NS)
    try:
        chunks = {f"c{i}": os.urandom(SIZE) for i in range(6)}
        ok = await store.put_many([(ref(n), META, v) for n, v in chunks.items()])
        assert ok == [True] * len(chunks)
        for name, value in chunks.items():  # read at once: nothing waited for the replica here
            stored = replica.cmd("GET", NS.data_key(ref(name).chunk_id))
            assert stored is not None and stored[HEADER_SIZE:] == value
    finally:
        await store.close()


async def test_a_put_no_replica_confirms_is_not_acknowledged(valkey_server, replica) -> None:
    os.kill(replica.pid, signal.SIGSTOP)  # a paused replica: linked, but it acknowledges nothing
    durable = await open_store(valkey_server.settings(transport="tcp", put_replicas=1, op_timeout_s=1), NS)
    plain = await open_store(valkey_server.settings(transport="tcp", op_timeout_s=1), NS)
    try:
        before = not_replicated()
        started = time.monotonic()
        assert await durable.put(ref("paused"), META, os.urandom(SIZE)) is False
        assert time.monotonic() - started < 5  # bounded by the put's deadline, not the replica
        assert not_replicated() == before + 1
        # Without the setting the same put is acknowledged by the primary alone.
        assert await plain.put(ref("plain"), META, os.urandom(SIZE)) is True
        os.kill(replica.pid, signal.SIGCONT)
        value = os.urandom(SIZE)
        assert await durable.put(ref("resumed"), META, value) is True
        assert replica.cmd("GET", NS.data_key(ref("resumed").chunk_id))[HEADER_SIZE:] == value
    finally:
        os.kill(replica.pid, signal.SIGCONT)
        await durable.close()
        await plain.close()


async def test_a_confined_worker_puts_durably_under_the_line_doctor_prints(valkey_server, replica) -> None:
    setuser(valkey_server, acl.worker_line("w", "default", durable=True), "pw")
    setuser(valkey_server, acl.worker_line("plain", "default"), "pw")
    settings = dict(transport="tcp", put_replicas=1, op_timeout_s=2, password="pw")
    durable = await open_store(valkey_server.settings(username="w", **settings), NS)
    refused = await open_store(valkey_server.settings(username="plain", **settings), NS)
    try:
        assert await durable.put(ref("allowed"), META, os.urandom(SIZE)) is True
        before = metrics.ERRORS.labels("put", "acl")._value.get()
        assert await refused.put(ref("no-wait"), META, os.urandom(SIZE)) is False  # WAIT: NOPERM
        assert metrics.ERRORS.labels("put", "acl")._value.get() == before + 1
    finally:
        await durable.close()
        await refused.close()


def test_put_replicas_needs_the_tcp_transport(valkey_server) -> None:
    with pytest.raises(ConfigError, match="put_replicas"):
        valkey_server.settings(put_replicas=1)  # transport auto may pick the fabric
    with pytest.raises(ConfigError, match="put_replicas"):
        valkey_server.settings(transport="tcp", put_replicas=17)
    assert valkey_server.settings(transport="tcp", put_replicas=2).put_replicas == 2
