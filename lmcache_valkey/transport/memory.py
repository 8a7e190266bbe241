"""An in-memory transport: the RESP client's surface over a dict, for tests without a server.

The idea of httpx's ``MockTransport``: everything above the transport (the store, tiering,
an engine adapter) runs against :class:`MemoryTransport` in microseconds, with no socket and
no Valkey process. It keeps the semantics those layers rely on: values land in the caller's
buffers (a shorter value fills only the start, a longer one is cut), ``set`` takes parts,
keys expire (``ttl_s``, ``PX``/``PXAT``/``PEXPIRE``, on an injectable clock), ``SCAN``
patterns match like Valkey's (``*``, ``?``, ``[...]``), ``OBJECT IDLETIME`` and ``INFO
memory`` report idle times and the bytes held against ``maxmemory``, and the commands tiering
sends (strings, lists with a blocking ``BLPOP``, hashes, sorted sets) behave as on a server. It evicts
nothing and runs no scripts (``EVAL`` is refused, as a server with scripting disabled does).
Set ``down = True`` and every call raises ``ConnectionLost``, as a dead server would.

Real-server tests stay: this is for fast tests of the logic above a transport.

Never imports: the store, tiering, the integrations.
"""

from __future__ import annotations

import asyncio
import fnmatch
import re
import time
from collections import deque
from typing import Any, AsyncIterator, Callable, Sequence

from ..codec import scatter
from ..config import Settings
from ..errors import ConnectionLost, ServerError, TransportError

Buffer = bytes | bytearray | memoryview


class _Entry:
    __slots__ = ("value", "expires_at", "touched")

    def __init__(self, value: Any, expires_at: float | None, now: float) -> None:
        self.value = value  # bytes | deque[bytes] | dict[bytes, bytes]
        self.expires_at = expires_at  # clock seconds, None = never
        self.touched = now


class _ZSet(dict):
    """member -> score"""


class MemoryTransport:
    """A store transport and RESP-client stand-in that keeps everything in this process."""

    supports_release_callbacks = False  # the caller's buffers are written before a call returns

    def __init__(self, settings: Settings | None = None, *, maxmemory: int = 0,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings or Settings()
        self.maxmemory = maxmemory
        self.clock = clock
        self.down = False
        self.calls: dict[str, int] = {}  # command name -> count (for tests that count round trips)
        self._data: dict[bytes, _Entry] = {}
        self._pushed = asyncio.Event()

    # --- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        self._check("START")

    async def close(self) -> None:
        pass

    def register(self, addr: int, length: int) -> bool:
        return False  # nothing moves by RMA

    @property
    def is_cluster(self) -> bool:
        return False

    # --- the store's contract ------------------------------------------------------------------
    async def get_into(self, key: bytes, bufs: Sequence[memoryview], *, timeout: float) -> int | None:
        self._check("GET")
        return self._read_into(key, bufs)

    async def get_many_into(
        self, items: Sequence[tuple[bytes, Sequence[memoryview]]], *, timeout: float
    ) -> list[int | None | TransportError]:
        self._check("GET")
        return [self._read_into(k, bufs) for k, bufs in items]

    async def getrange_into(self, key: bytes, start: int, buf: memoryview, *, timeout: float) -> int | None:
        self._check("GETRANGE")
        v = self._string(key)
        if v is None or start >= len(v):
            return None
        n = min(len(buf), len(v) - start)
        memoryview(buf).cast("B")[:n] = v[start : start + n]
        return n

    async def set(self, key: bytes, parts: Sequence[Buffer], *, ttl_s: float | None, timeout: float) -> None:
        self._check("SET")
        self._put(key, b"".join(bytes(p) for p in parts), ttl_s)

    async def set_many(
        self, items: Sequence[tuple[bytes, Sequence[Buffer]]], *, ttl_s: float | None, timeout: float
    ) -> list[TransportError | None]:
        self._check("SET")
        for key, parts in items:
            self._put(key, b"".join(bytes(p) for p in parts), ttl_s)
        return [None] * len(items)

    async def exists_many(self, keys: Sequence[bytes], *, timeout: float, prefix: bool = False) -> list[bool]:
        self._check("EXISTS")
        return [self._live(k) is not None for k in keys]

    def exists_many_blocking(self, keys: Sequence[bytes], *, timeout: float,
                             prefix: bool = False) -> list[bool] | None:
        return None  # lookups run on the store's loop, like every other call

    async def exists_many_on_caller_loop(self, keys: Sequence[bytes], *, timeout: float,
                                         prefix: bool = False) -> list[bool] | None:
        return None

    async def delete(self, keys: Sequence[bytes], *, timeout: float) -> int:
        self._check("UNLINK")
        return await _unlink(self, *keys)

    async def scan_iter(self, match: bytes, count: int = 1000) -> AsyncIterator[bytes]:
        self._check("SCAN")
        pattern = re.compile(fnmatch.translate(match.decode("latin-1")).encode("latin-1"), re.S)
        for k in [k for k in self._data if pattern.match(k)]:
            if self._live(k) is not None:
                yield k

    async def ping(self, *, timeout: float) -> None:
        self._check("PING")

    # --- commands (what tiering sends) ---------------------------------------------------------
    async def command(self, *args: bytes | str | int | float, key: bytes | None = None, timeout: float) -> Any:
        name = _text(args[0]).upper()
        if name == "OBJECT":
            name = "OBJECT " + _text(args[1]).upper()
            args = (name, *args[2:])
        self._check(name)
        fn = _COMMANDS.get(name)
        if fn is None:
            raise ServerError(f"ERR unknown command '{name}' (the memory transport runs no scripts)")
        return await fn(self, *[_bytes(a) for a in args[1:]])

    async def transaction(self, *commands: Sequence[bytes | str | int | float], key: bytes,
                          timeout: float) -> list[Any]:
        """MULTI ... EXEC: the commands run one after the other, nothing in between."""
        self._check("MULTI")
        return [await self.command(*c, key=key, timeout=timeout) for c in commands]

    async def command_all_primaries(self, *args: bytes | str | int | float, timeout: float) -> list[Any]:
        return [await self.command(*args, timeout=timeout)]

    # --- state -----------------------------------------------------------------------------------
    def _check(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        if self.down:
            raise ConnectionLost("memory transport: down")

    def _live(self, key: bytes) -> _Entry | None:
        e = self._data.get(key)
        if e is not None and e.expires_at is not None and self.clock() >= e.expires_at:
            del self._data[key]
            return None
        return e

    def _string(self, key: bytes, touch: bool = True) -> bytes | None:
        e = self._live(key)
        if e is None:
            return None
        if not isinstance(e.value, bytes):
            raise ServerError("WRONGTYPE Operation against a key holding the wrong kind of value")
        if touch:
            e.touched = self.clock()
        return e.value

    def _read_into(self, key: bytes, bufs: Sequence[memoryview]) -> int | None:
        v = self._string(key)
        if v is None:
            return None
        scatter(v, [memoryview(b) for b in bufs])
        return len(v)

    def _put(self, key: bytes, value: Any, ttl_s: float | None) -> None:
        now = self.clock()
        self._data[key] = _Entry(value, now + ttl_s if ttl_s else None, now)

    def used_memory(self) -> int:
        total = 0
        for k, e in list(self._data.items()):
            if self._live(k) is None:
                continue
            v = e.value
            if isinstance(v, _ZSet):
                total += len(k) + sum(len(m) + 8 for m in v)
                continue
            total += len(k) + (len(v) if isinstance(v, bytes) else sum(len(x) for x in (v.values() if isinstance(v, dict) else v)))
        return total

    def _container(self, key: bytes, kind: type) -> Any:
        e = self._live(key)
        if e is None:
            return None
        if not isinstance(e.value, kind):
            raise ServerError("WRONGTYPE Operation against a key holding the wrong kind of value")
        return e.value


# --- command implementations (RESP replies as the client returns them) ---------------------------
async def _get(t: MemoryTransport, key: bytes) -> bytes | None:
    return t._string(key)


async def _set(t: MemoryTransport, key: bytes, value: bytes, *opts: bytes) -> bytes:
    t._put(key, value, None)
    o = [x.upper() for x in opts]
    if b"PX" in o:
        t._data[key].expires_at = t.clock() + int(opts[o.index(b"PX") + 1]) / 1000
    elif b"PXAT" in o:
        t._data[key].expires_at = int(opts[o.index(b"PXAT") + 1]) / 1000
    elif b"EX" in o:
        t._data[key].expires_at = t.clock() + int(opts[o.index(b"EX") + 1])
    return b"OK"


async def _pttl(t: MemoryTransport, key: bytes) -> int:
    e = t._live(key)
    if e is None:
        return -2
    return -1 if e.expires_at is None else max(0, int((e.expires_at - t.clock()) * 1000))


async def _pexpire(t: MemoryTransport, key: bytes, ms: bytes) -> int:
    e = t._live(key)
    if e is None:
        return 0
    e.expires_at = t.clock() + int(ms) / 1000
    return 1


async def _exists(t: MemoryTransport, *keys: bytes) -> int:
    return sum(t._live(k) is not None for k in keys)


async def _unlink(t: MemoryTransport, *keys: bytes) -> int:
    return sum(t._live(k) is not None and t._data.pop(k, None) is not None for k in keys)


async def _idletime(t: MemoryTransport, key: bytes) -> int | None:
    e = t._live(key)
    return None if e is None else int(t.clock() - e.touched)


async def _info(t: MemoryTransport, *section: bytes) -> bytes:
    return b"# Memory\r\nused_memory:%d\r\nmaxmemory:%d\r\nmaxmemory_policy:allkeys-lru\r\n" % (
        t.used_memory(), t.maxmemory)


async def _flushall(t: MemoryTransport, *opts: bytes) -> bytes:
    t._data.clear()
    return b"OK"


async def _hset(t: MemoryTransport, key: bytes, *pairs: bytes) -> int:
    h = t._container(key, dict)
    if h is None:
        h = {}
        t._put(key, h, None)
    added = 0
    for f, v in zip(pairs[::2], pairs[1::2]):
        added += f not in h
        h[f] = v
    return added


async def _hkeys(t: MemoryTransport, key: bytes) -> list[bytes]:
    return list(t._container(key, dict) or ())


async def _hdel(t: MemoryTransport, key: bytes, *fields: bytes) -> int:
    h = t._container(key, dict) or {}
    n = sum(h.pop(f, None) is not None for f in fields)
    if not h:
        t._data.pop(key, None)
    return n


async def _hlen(t: MemoryTransport, key: bytes) -> int:
    return len(t._container(key, dict) or ())


async def _hexists(t: MemoryTransport, key: bytes, field: bytes) -> int:
    return int(field in (t._container(key, dict) or ()))


async def _rpush(t: MemoryTransport, key: bytes, *values: bytes) -> int:
    q = t._container(key, deque)
    if q is None:
        q = deque()
        t._put(key, q, None)
    q.extend(values)
    t._pushed.set()
    return len(q)


def _pop(t: MemoryTransport, key: bytes, n: int) -> list[bytes]:
    q = t._container(key, deque) or deque()
    out = [q.popleft() for _ in range(min(n, len(q)))]
    if not q:
        t._data.pop(key, None)
    return out


async def _lpop(t: MemoryTransport, key: bytes, count: bytes | None = None) -> Any:
    got = _pop(t, key, 1 if count is None else int(count))
    if count is None:
        return got[0] if got else None
    return got or None


async def _blpop(t: MemoryTransport, *args: bytes) -> list[bytes] | None:
    *keys, block = args
    loop = asyncio.get_running_loop()
    end = loop.time() + float(block) if float(block) > 0 else None
    while True:
        for k in keys:
            got = _pop(t, k, 1)
            if got:
                return [k, got[0]]
        left = None if end is None else end - loop.time()
        if left is not None and left <= 0:
            return None
        t._pushed.clear()
        try:
            await asyncio.wait_for(t._pushed.wait(), left)
        except asyncio.TimeoutError:
            return None


async def _ltrim(t: MemoryTransport, key: bytes, start: bytes, stop: bytes) -> bytes:
    q = t._container(key, deque)
    if q is not None:
        items = list(q)
        s, e = int(start), int(stop)
        kept = items[s if s >= 0 else max(0, len(items) + s) : (e + 1 if e >= 0 else len(items) + e + 1) or None]
        q.clear()
        q.extend(kept)
    return b"OK"


async def _llen(t: MemoryTransport, key: bytes) -> int:
    return len(t._container(key, deque) or ())


async def _zadd(t: MemoryTransport, key: bytes, *pairs: bytes) -> int:
    z = t._container(key, _ZSet)
    if z is None:
        z = _ZSet()
        t._put(key, z, None)
    added = 0
    for score, m in zip(pairs[::2], pairs[1::2]):
        added += m not in z
        z[m] = float(score)
    return added


async def _zrem(t: MemoryTransport, key: bytes, *members: bytes) -> int:
    z = t._container(key, _ZSet) or {}
    n = sum(z.pop(m, None) is not None for m in members)
    if not z:
        t._data.pop(key, None)
    return n


async def _zrange(t: MemoryTransport, key: bytes, start: bytes, stop: bytes) -> list[bytes]:
    ranked = [m for m, _ in sorted((t._container(key, _ZSet) or {}).items(), key=lambda kv: (kv[1], kv[0]))]
    s, e = int(start), int(stop)
    s = s if s >= 0 else max(0, len(ranked) + s)
    e = e if e >= 0 else len(ranked) + e
    return ranked[s : e + 1]


_COMMANDS: dict[str, Callable[..., Any]] = {
    "GET": _get, "SET": _set, "PTTL": _pttl, "PEXPIRE": _pexpire, "EXISTS": _exists, "UNLINK": _unlink,
    "DEL": _unlink, "OBJECT IDLETIME": _idletime, "INFO": _info, "FLUSHALL": _flushall, "HSET": _hset,
    "HKEYS": _hkeys, "HDEL": _hdel, "HLEN": _hlen, "HEXISTS": _hexists, "RPUSH": _rpush, "LPOP": _lpop,
    "BLPOP": _blpop, "LTRIM": _ltrim, "LLEN": _llen, "ZADD": _zadd, "ZREM": _zrem, "ZRANGE": _zrange,
}


def _text(v: bytes | str | int | float) -> str:
    return v.decode() if isinstance(v, (bytes, bytearray)) else str(v)


def _bytes(v: bytes | str | int | float) -> bytes:
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    return str(v).encode()


__all__ = ["MemoryTransport"]
