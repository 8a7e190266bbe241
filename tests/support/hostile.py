"""A RESP server that lies: an honest little key-value store whose replies a test overrides.

It runs its own asyncio loop on a thread, so a client that blocks its event loop (a huge
allocation, a CPU loop) cannot stop the server from sending, and the test sees what the
client does with what arrives. It reads commands with its own few lines (not the parser
under test).

``HostileServer(lie)``: ``lie(name, args)`` returns the raw bytes to send for that
command, ``PAUSE`` (answer nothing, ever), ``CLOSE`` (drop the connection), or ``None``
(answer honestly: SET, GET, GETRANGE, EXISTS, UNLINK, PING, INFO, CLUSTER SLOTS).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable

PAUSE = object()
CLOSE = object()

Lie = Callable[[bytes, list[bytes]], Any]


def bulk(b: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(b), b)


def _commands(buf: bytearray) -> list[list[bytes]]:
    """Take every complete command (an array of bulk strings) off the front of ``buf``."""
    out = []
    while True:
        pos, args = 0, []
        end = buf.find(b"\r\n", pos)
        if end < 0 or buf[:1] != b"*":
            return out
        n, pos = int(buf[1:end]), end + 2
        for _ in range(n):
            end = buf.find(b"\r\n", pos)
            if end < 0:
                return out
            size = int(buf[pos + 1:end])
            if len(buf) < end + 2 + size + 2:
                return out
            args.append(bytes(buf[end + 2:end + 2 + size]))
            pos = end + 2 + size + 2
        del buf[:pos]
        out.append(args)


class HostileServer:
    def __init__(self, lie: Lie, *, cluster: bool = False) -> None:
        self.lie = lie
        self.cluster = cluster
        self.data: dict[bytes, bytes] = {}
        self.commands: list[bytes] = []  # names, in arrival order
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, name="hostile-resp", daemon=True)

    # --- lifecycle -------------------------------------------------------------------

    def __enter__(self) -> "HostileServer":
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(asyncio.start_server(self._serve, "127.0.0.1", 0), self._loop)
        self._server = fut.result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: Any) -> None:
        async def stop() -> None:
            assert self._server is not None
            self._server.close()
            for w in list(self._writers):
                w.transport.abort()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    @property
    def url(self) -> str:
        return f"valkey://127.0.0.1:{self.port}"

    # --- serving ---------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        pending = bytearray()
        paused = False
        try:
            while True:
                data = await reader.read(1 << 20)
                if not data:
                    return
                pending += data
                for args in _commands(pending):
                    name = args[0].upper()
                    self.commands.append(name)
                    if paused:
                        continue  # a paused server keeps reading but never answers again
                    reply = self.lie(name, args[1:])
                    if reply is None:
                        reply = self._honest(name, args[1:])
                    if reply is PAUSE:
                        paused = True
                        continue
                    if reply is CLOSE:
                        writer.transport.abort()
                        return
                    writer.write(reply)
                await writer.drain()
        except (ConnectionError, OSError):
            return
        finally:
            self._writers.discard(writer)

    def _honest(self, name: bytes, args: list[bytes]) -> bytes:
        d = self.data
        if name == b"SET":
            d[args[0]] = args[1]
            return b"+OK\r\n"
        if name == b"GET":
            v = d.get(args[0])
            return b"$-1\r\n" if v is None else bulk(v)
        if name == b"GETRANGE":
            v = d.get(args[0], b"")
            return bulk(v[int(args[1]):int(args[2]) + 1])
        if name == b"EXISTS":
            return b":%d\r\n" % sum(a in d for a in args)
        if name in (b"UNLINK", b"DEL"):
            return b":%d\r\n" % sum(d.pop(a, None) is not None for a in args)
        if name == b"PING":
            return b"+PONG\r\n"
        if name == b"INFO":
            return bulk(b"# Cluster\r\ncluster_enabled:%d\r\n" % self.cluster)
        if name == b"CLUSTER" and args and args[0].upper() == b"SLOTS":
            return b"*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n" + bulk(b"127.0.0.1") + b":%d\r\n" % self.port
        return b"-ERR unknown command\r\n"
