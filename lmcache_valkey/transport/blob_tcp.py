"""The ``blob-tcp`` transport: values stored as valkey-large-object objects, moved inline
over RESP with ``BLOB.TCP_SET`` / ``BLOB.TCP_GET`` -- for servers where RDMA is unavailable
(ElastiCache distributed KV caching over TCP, or either module self-hosted).

Everything else is the RESP transport's: slot routing and MOVED/ASK in Valkey Cluster, TLS,
striping over connections, deadlines, and the ``TCP_GET`` reply's payload received straight
into the caller's buffers (no copy). Lookups and deletes use the core ``EXISTS`` / ``UNLINK``,
which work on large-object keys. Differences from string values:

- a TTL follows as ``PEXPIRE`` in a second round trip (the documented ``TCP_SET`` takes no
  expiry), only when one is configured;
- no range read: a chunk header is read with a header-sized ``TCP_GET`` (the rest of the
  value is received and dropped).

Knows nothing of keys or chunks; never imports the store.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Sequence

from ..errors import FabricUnavailable, ServerError, TransportError
from . import read_window
from .fabric import commands
from .resp import RespClient
from .resp.parser import encode_command
from .resp.pool import Op

__all__ = ["BlobTcpClient", "probe_key"]

# Values at least this large are set one by one when they carry a TTL (see set_many); smaller
# ones are pipelined as one batch, their EXPIREs after them.
_LARGE = 256 << 10


def probe_key(settings: Any) -> bytes:
    """A key inside the tenant's namespace (its ACL user may name it) that no chunk uses:
    ``BLOB.INFO`` of it answers nil where the large-object commands exist."""
    return f"{settings.key_prefix}:{settings.tenant}:probe:large-object".encode()


class BlobTcpClient(RespClient):
    GET_VERB = commands.TCP_GET.encode()
    SET_VERB = commands.TCP_SET.encode()

    async def getrange_into(self, key: bytes, start: int, buf: memoryview, *, timeout: float) -> int | None:
        """Large objects have no range read: the value's start through a header-sized window."""
        return await read_window(self, key, start, buf, timeout)

    async def start(self) -> None:
        await super().start()
        await self.probe()

    async def probe(self) -> None:
        """Whether the large-object commands are there, asked with a documented command
        (``BLOB.INFO`` of a missing key answers nil) -- no ``MODULE LIST``, no ``CONFIG``,
        which managed services refuse. Raises FabricUnavailable when they are not."""
        key = probe_key(self.settings)
        try:
            reply = await self._node_call(self._route(key), (commands.INFO, key), self.settings.connect_timeout_s)
        except ServerError as e:
            raise FabricUnavailable(f"the server does not answer {commands.INFO} (no large-object module?): {e}") from e
        if reply is not None:
            raise FabricUnavailable(f"unexpected {commands.INFO} reply for a missing key: {reply!r}")

    async def set(self, key: bytes, parts: Sequence[bytes | memoryview], *, ttl_s: float | None,
                  timeout: float) -> None:
        started = time.monotonic()
        await super().set(key, parts, ttl_s=None, timeout=timeout)
        if ttl_s:
            (err,) = await self._expire([key], ttl_s, timeout - (time.monotonic() - started))
            if err is not None:
                raise err

    async def set_many(
        self, items: Sequence[tuple[bytes, Sequence[bytes | memoryview]]], *, ttl_s: float | None, timeout: float
    ) -> list[TransportError | None]:
        if ttl_s and len(items) > 1 and any(sum(memoryview(p).nbytes for p in parts) >= _LARGE for _, parts in items):
            # Each large value's EXPIRE right behind its own SET: one EXPIRE round after all
            # the SETs would leave every stored value without its TTL when the deadline runs
            # out in the SET round.
            return list(await asyncio.gather(*(self._set_one(k, parts, ttl_s, timeout) for k, parts in items)))
        started = time.monotonic()
        results = await super().set_many(items, ttl_s=None, timeout=timeout)
        if ttl_s:
            stored = [i for i, r in enumerate(results) if r is None]
            errs = await self._expire([items[i][0] for i in stored], ttl_s, timeout - (time.monotonic() - started))
            for i, err in zip(stored, errs):
                results[i] = err
        return results

    async def _set_one(self, key: bytes, parts: Sequence[bytes | memoryview], ttl_s: float,
                       timeout: float) -> TransportError | None:
        try:
            await self.set(key, parts, ttl_s=ttl_s, timeout=timeout)
        except TransportError as e:
            return e
        return None

    async def _expire(self, keys: Sequence[bytes], ttl_s: float, timeout: float) -> list[TransportError | None]:
        if not keys:
            return []
        ms = max(1, int(ttl_s * 1000))
        ops = [Op(i, (encode_command((commands.EXPIRE, k, ms)),), None, k) for i, k in enumerate(keys)]
        out: list[TransportError | None] = []
        for r in await self._run(ops, large=False, timeout=max(0.001, timeout)):
            if isinstance(r, TransportError):
                out.append(r)
            elif r != 1:  # 0: the key vanished between the two commands (deleted, evicted)
                out.append(ServerError(f"{commands.EXPIRE} did not apply (reply {r!r})"))
            else:
                out.append(None)
        return out


async def open_blob_tcp(settings: Any) -> BlobTcpClient:
    client = BlobTcpClient(settings)
    try:
        await client.start()
    except BaseException:
        await asyncio.shield(client.close())
        raise
    return client
