"""Transports: RESP over TCP/TLS/Unix sockets, large objects (libfabric RMA, BLOB.TCP_*),
and an in-memory one for tests (``memory.MemoryTransport``). Each implements the store's
contract (``store.ChunkTransport``).

Knows nothing of keys or chunks; never imports the store.
"""

from __future__ import annotations

from typing import Any


async def read_window(transport: Any, key: bytes, start: int, buf: memoryview, timeout: float) -> int | None:
    """``getrange_into`` for a transport without a range read (large objects): the value's
    start through a window of ``len(buf)`` bytes (``start`` 0 only). Returns the value's
    length, or None when absent."""
    if start:
        raise ValueError("a large object is read from its start only (start=0)")
    (got,) = await transport.get_many_into([(key, [buf])], timeout=timeout)
    if isinstance(got, BaseException):
        raise got
    return got
