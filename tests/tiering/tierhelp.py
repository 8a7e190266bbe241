"""Helpers and fixtures for tiering tests: a small-maxmemory Valkey (tests/support/servers.py), a real
ext4 directory (O_DIRECT), and a real moto S3 server on a free port. Servers stop by PID
(Valkey) or by their own handle (moto runs in a thread of this process)."""

from __future__ import annotations

import os
import socket
from dataclasses import replace
from typing import Any, Iterator

import pytest

from lmcache_valkey import codec
from lmcache_valkey.keys import Namespace
from lmcache_valkey.tiering.settings import TieringSettings, tiering_settings_from_mapping

from support.servers import ValkeyServer

MAXMEMORY = 8 << 20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoS3:
    """moto's S3 server in a thread; stop()/start() keep the in-process object state."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self._cls = ThreadedMotoServer
        self.port = _free_port()
        self.server = None
        self.url = f"http://127.0.0.1:{self.port}"
        self.bucket = f"lmcv-test-{os.urandom(4).hex()}"  # moto's state is per process: one bucket per test

    def start(self) -> None:
        self.server = self._cls(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def create_bucket(self) -> None:
        """Create this test's bucket through the object tier (from sync code)."""
        import asyncio

        from lmcache_valkey.tiering.object_store import ObjectTier

        async def create() -> None:
            o = ObjectTier(tiering_settings_from_mapping({"s3_bucket": self.bucket, "s3_endpoint_url": self.url}))
            await o.start()
            await o.create_bucket()
            await o.close()

        asyncio.run(create())


class StallProxy:
    """A TCP proxy in front of moto (same event loop as the test): ``stall = True`` makes the
    object store a black hole (connections accepted, nothing answered) without refusing
    connections, which is what a dead or overloaded store looks like."""

    def __init__(self, target_port: int) -> None:
        import asyncio

        self.target_port = target_port
        self.stall = False
        self._server: Any = None
        self._tasks: set[Any] = set()
        self._asyncio = asyncio

    async def start(self) -> str:
        self._server = await self._asyncio.start_server(self._conn, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _conn(self, r, w) -> None:
        asyncio = self._asyncio
        try:
            ur, uw = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            w.close()
            return

        async def pump(src, dst) -> None:
            try:
                while True:
                    data = await src.read(1 << 16)
                    if not data:
                        break
                    while self.stall:
                        await asyncio.sleep(0.05)
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                dst.close()

        ts = [asyncio.ensure_future(pump(r, uw)), asyncio.ensure_future(pump(ur, w))]
        self._tasks.update(ts)
        await asyncio.gather(*ts, return_exceptions=True)
        self._tasks.difference_update(ts)

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        if self._server is not None:
            self._server.close()


@pytest.fixture
def moto_s3(monkeypatch) -> Iterator[MotoS3]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    m = MotoS3()
    m.start()
    try:
        yield m
    finally:
        m.stop()


@pytest.fixture
def small_valkey() -> Iterator[ValkeyServer]:
    with ValkeyServer(args=["--maxmemory", str(MAXMEMORY), "--maxmemory-policy", "allkeys-lru"]) as s:
        yield s


@pytest.fixture
def nvme_dir(tmp_path) -> str:
    d = tmp_path / "nvme"
    d.mkdir()
    return str(d)


NS = Namespace(prefix="lmcv", tenant="t1", digest="0123456789abcdef0123456789abcdef")


def chunk(i: int, size: int = 256 << 10, ns: Namespace = NS) -> tuple[bytes, bytes]:
    """(data key, value = codec header + payload), payload unique per ``i``."""
    key_string = f"model@chunk{i}"
    payload = (i.to_bytes(4, "little") * (size // 4 + 1))[:size]
    payload = bytes(b ^ (j & 0xFF) for j, b in enumerate(payload[:4096])) + payload[4096:]
    meta = codec.ChunkMeta(shapes=((2, size // 4),), dtypes=("float16",), fmt=1, key=key_string)
    header = codec.encode_header(meta, payload, ns.digest_bytes, ns.key_digest(key_string), created_ms=1_700_000_000_000 + i)
    return ns.data_key(f"{i:032x}"), bytes(header) + payload


def tiering(**kw: Any) -> TieringSettings:
    base = {"tiering": "embedded", "admission": "always", "demote_interval_s": 3600, "s3_concurrency": 4,
            "breaker_failures": 3, "breaker_reset_s": 0.3}
    base.update(kw)
    return tiering_settings_from_mapping(base)


async def resp_client(server: ValkeyServer, **kw: Any):
    from lmcache_valkey.transport.resp import RespClient

    c = RespClient(server.settings(tenant="t1", **kw))
    await c.start()
    return c


async def ram_get(client, key: bytes, size: int) -> bytes | None:
    buf = bytearray(size)
    n = await client.get_into(key, [memoryview(buf)], timeout=5.0)
    if n is None:
        return None
    assert n == size
    return bytes(buf)


__all__ = ["StallProxy", "NS", "chunk", "tiering", "resp_client", "ram_get", "MAXMEMORY", "replace"]
