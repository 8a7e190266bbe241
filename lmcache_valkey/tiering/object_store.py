"""Object (cold) tier on S3-compatible storage. The only module that imports aiobotocore.

- Credentials: the standard AWS chain (env, profile, IMDS/IRSA); ``endpoint_url`` for
  S3-compatible stores (MinIO, Ceph, moto).
- Layout: ``<s3_prefix>/<tenant>/<key prefix>/<namespace digest>/<chunk id>``, one object
  per chunk holding the Valkey value verbatim (codec header + payload). The object key
  alone maps back to the data key; metadata ``lmcv-key``/``lmcv-len``/``lmcv-exp`` is
  written too. A listing therefore rebuilds the index after a restart.
- Writes are write-behind: :meth:`write` puts the value on a bounded queue (backlog is a
  metric); a full queue drops the chunk, counted and logged, never silently. Durability
  starts when the upload completes (reported as ``landed``). :meth:`flush` drains.
- Large values use multipart upload; large reads use parallel ranged GETs into one buffer.
- Conditional put (``If-None-Match: *``) keeps concurrent writers from clobbering; a store
  that refuses the header is remembered and written to without it.
- Every request is bounded by ``s3_timeout_s`` as a whole (:meth:`ObjectTier._io`), not only
  by the client's socket timers, which let an upload into a black hole hang for good.
- Retries with exponential backoff and a circuit breaker: while open, reads are misses at
  once and uploads wait in the queue. An upload is dropped (counted) after ``s3_max_retries``
  failures while the breaker is closed, or at once when the store refuses it for good (4xx);
  refusals are not fed to the breaker.
- Uploads carry the write's ticket (:class:`~.tiers.TierEvents`): one the ledger no longer
  wants (a delete meanwhile) is dropped before, or undone after, its upload; a bad object is
  deleted with ``If-Match`` on the ETag that was read.

botocore/aiohttp errors are mapped here to :mod:`lmcache_valkey.errors`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import random
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Sequence

import aiobotocore.session
from aiobotocore.config import AioConfig
from botocore.exceptions import BotoCoreError, ClientError

from .. import codec
from ..errors import ConnectionLost, CorruptChunk, DeadlineExceeded, TransportError
from .. import metrics
from .buffers import BufferPool
from .markers import split_data_key
from .policy import CircuitBreaker
from .tiers import ChunkRead, Found, NoEvents, Pins, Removal, TierEvents
from .settings import TieringSettings

log = logging.getLogger(__name__)

_MISSING = {"NoSuchKey", "404", "NotFound"}
_READ_BLOCK = 1 << 20
_PRECONDITION = {"PreconditionFailed", "412"}  # 409 ConditionalRequestConflict: a race, retried
_UNSUPPORTED = {"NotImplemented", "501", "InvalidArgument"}
_ETAG = "\0etag"  # where _get_ranges leaves the object's ETag in the metadata dict


def _map_error(e: BaseException) -> TransportError:
    if isinstance(e, TransportError):
        return e
    if isinstance(e, asyncio.TimeoutError):
        return DeadlineExceeded(f"object store: {e or 'no answer within s3_timeout_s'}")
    if isinstance(e, ClientError):
        code = str(e.response.get("Error", {}).get("Code", ""))
        return TransportError(f"object store: {code}: {e}")
    return ConnectionLost(f"object store: {type(e).__name__}: {e}")


class ObjectRejected(TransportError):
    """The store refused the request for good (a 4xx other than 408/409/429): retrying
    cannot help, and it says nothing about the store's health (not fed to the breaker)."""

    cause = "rejected"


_TRANSIENT_4XX = {408, 409, 429}


def _status(e: ClientError) -> int:
    try:
        return int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    except (TypeError, ValueError):
        return 0


def _permanent(e: BaseException) -> bool:
    if not isinstance(e, ClientError):
        return False
    code = _code(e)
    if code in {"RequestTimeout", "RequestTimeTooSkewed", "SlowDown", "Throttling", "ConditionalRequestConflict",
                "OperationAborted", "InternalError", "ServiceUnavailable"}:
        return False
    st = _status(e)
    if not st and code.isdigit():
        st = int(code)
    if not st and code in {"NoSuchBucket", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                           "EntityTooLarge", "MetadataTooLarge", "InvalidBucketName", "KeyTooLongError"}:
        return True
    return 400 <= st < 500 and st not in _TRANSIENT_4XX


def _code(e: BaseException) -> str:
    if isinstance(e, ClientError):
        return str(e.response.get("Error", {}).get("Code", "")) or str(
            e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "")
        )
    return ""


@dataclass
class _Item:
    key: bytes
    value: memoryview
    expires_ms: int
    queued_at: float
    ticket: int | None = None


class ObjectTier:
    """A :class:`~.tiers.LowerTier` on an S3-compatible store (``remote``: a removal may fail
    or hang, so the manager records it as an intent and retries it)."""

    name = "s3"
    remote = True

    def __init__(self, ts: TieringSettings, *, events: TierEvents | None = None) -> None:
        if not ts.s3_bucket:
            raise ValueError("object tier needs s3_bucket")
        self.ts = ts
        self.bucket = ts.s3_bucket
        self.prefix = ts.s3_prefix.strip("/")
        self.events: TierEvents = events or NoEvents()
        self.breaker = CircuitBreaker(ts.breaker_failures, ts.breaker_reset_s,
                                      on_change=lambda s: metrics.set_breaker_state(self.name, s))
        self.pins = Pins()
        self.buffers = BufferPool(256 << 20)
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()  # bounded by backlog (queued + uploading)
        self._holding = 0  # items taken off the queue but not finished
        self._bytes = 0  # value bytes queued or uploading (bounded by flush_queue_max_bytes)
        self._idle = asyncio.Event()
        self._idle.set()
        self._workers: list[asyncio.Task] = []
        self._stack = contextlib.AsyncExitStack()
        self._client = None
        self._conditional = True
        self._unflushed = 0  # drops not yet reported by a drain (take_unflushed)
        self._conditional_delete = True  # DELETE with If-Match, until the store refuses it
        self._sem = asyncio.Semaphore(ts.s3_concurrency)
        self.stats = {
            "enqueued": 0, "dropped": 0, "uploaded": 0, "upload_failures": 0, "retries": 0,
            "reads": 0, "hits": 0, "misses": 0, "corrupt": 0, "deleted": 0, "bytes_uploaded": 0,
            "bytes_read": 0, "breaker_rejections": 0, "conditional_exists": 0, "multipart": 0,
            "rejected": 0, "gave_up": 0, "format_misses": 0, "delete_skipped_newer": 0, "bad_keys": 0,
        }

    # --- naming ----------------------------------------------------------------------------
    def object_key(self, data_key: bytes) -> str:
        """The object key of a data key. Every segment is checked first (ValueError): a key
        like ``...:c:{../../tenant-b/...}`` never becomes another tenant's object key."""
        prefix, tenant, digest, cid = split_data_key(data_key)
        return f"{self.prefix}/{tenant}/{prefix}/{digest}/{cid}"

    def data_key_of(self, object_key: str) -> bytes | None:
        """The data key an object holds, or None for an object outside the layout (a listing
        skips it: someone else's object, or one named against the key grammar)."""
        rest = object_key[len(self.prefix) + 1 :] if object_key.startswith(self.prefix + "/") else None
        if rest is None:
            return None
        parts = rest.split("/")
        if len(parts) != 4:
            return None
        tenant, prefix, digest, cid = parts
        key = f"{prefix}:{tenant}:{digest}:c:{{{cid}}}".encode()
        try:
            split_data_key(key)
        except ValueError:
            return None
        return key

    def tenant_prefix(self, tenant: str) -> str:
        return f"{self.prefix}/{tenant}/"

    # --- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        session = aiobotocore.session.get_session()
        cfg = AioConfig(
            retries={"max_attempts": 1, "mode": "standard"},  # we retry ourselves (breaker)
            max_pool_connections=max(10, self.ts.s3_concurrency * 2),
            connect_timeout=min(5.0, self.ts.s3_timeout_s),
            read_timeout=self.ts.s3_timeout_s,
        )
        self._client = await self._stack.enter_async_context(
            session.create_client("s3", endpoint_url=self.ts.s3_endpoint_url, region_name=self.ts.s3_region, config=cfg)
        )
        metrics.set_breaker_state(self.name, "closed")
        for i in range(self.ts.s3_concurrency):
            self._workers.append(asyncio.create_task(self._uploader(), name=f"lmcv-s3-upload-{i}"))

    async def close(self, drain_timeout: float | None = 0.0) -> int:
        """Stop; first drain the backlog for up to ``drain_timeout`` s. Returns chunks left."""
        if drain_timeout:
            await self.flush(drain_timeout)
        left = self.backlog
        for w in self._workers:
            w.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers.clear()
        if left:
            log.warning("object tier: %d chunk(s) not flushed at close (counted as drops)", left)
            self.stats["dropped"] += left
            metrics.record_flush_drop(self.name, left)
        await self._stack.aclose()
        return left

    # --- write-behind ----------------------------------------------------------------------
    @property
    def backlog(self) -> int:
        return self._queue.qsize() + self._holding

    @property
    def backlog_bytes(self) -> int:
        return self._bytes

    async def write(self, key: bytes, parts: Sequence[bytes | bytearray | memoryview], *, expires_ms: int = 0,
                    ticket: int | None = None) -> bool:
        """Queue a chunk value for upload (write-behind). False (counted, logged) when the
        queue is full (``flush_queue_max`` chunks or ``flush_queue_max_bytes`` bytes).

        With a ``ticket``, ``events.wanted`` is asked before and after the upload (a delete
        meanwhile drops or undoes it) and the outcome is reported: ``landed`` or ``dropped``."""
        try:
            self.object_key(key)
        except ValueError as e:
            self.stats["bad_keys"] += 1
            log.warning("object tier: upload refused: %s", e)
            return False
        views = [memoryview(p).cast("B") for p in parts]
        mv = views[0] if len(views) == 1 else memoryview(b"".join(views))
        if self.backlog < self.ts.flush_queue_max and (
            self._bytes + mv.nbytes <= self.ts.flush_queue_max_bytes or not self.backlog
        ):
            self._bytes += mv.nbytes
            self._queue.put_nowait(_Item(key, mv, expires_ms, time.monotonic(), ticket))
        else:
            self.stats["dropped"] += 1
            self._unflushed += 1
            metrics.record_flush_drop(self.name)
            metrics.record_error("flush", "overflow")
            if self.stats["dropped"] in (1, 10, 100) or self.stats["dropped"] % 1000 == 0:
                log.warning("object tier: flush queue full (%d); %d chunk(s) dropped so far",
                            self.ts.flush_queue_max, self.stats["dropped"])
            return False
        self._idle.clear()
        self.stats["enqueued"] += 1
        metrics.set_flush_backlog(self.name, self.backlog)
        return True

    def take_unflushed(self) -> int:
        """Uploads dropped (queue full, refused, retries exhausted) since the last call: an
        empty backlog after an outage may only mean the uploads were given up."""
        n, self._unflushed = self._unflushed, 0
        return n

    async def flush(self, timeout: float | None = None) -> bool:
        """Wait until the backlog is empty. True when drained within ``timeout`` (drops are
        not failures here: :meth:`take_unflushed` tells them)."""
        try:
            await asyncio.wait_for(self._wait_idle(), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    async def _wait_idle(self) -> None:
        while self.backlog:
            self._idle.clear()
            await self._idle.wait()

    async def _uploader(self) -> None:
        while True:
            item = await self._queue.get()
            self._holding += 1
            try:
                await self._upload_item(item)
            finally:
                self._holding -= 1
                self._bytes -= item.value.nbytes
                self._queue.task_done()
                metrics.set_flush_backlog(self.name, self.backlog)
                if not self.backlog:
                    self._idle.set()

    async def _upload_item(self, item: _Item) -> None:
        """Upload one queued chunk. Transient failures are retried with backoff; a failure
        while the breaker is closed counts against the item, which is dropped (counted) after
        ``s3_max_retries`` retries; a failed half-open probe (the store looks down) does not
        count: the item waits in the backlog. A permanent refusal (4xx) is dropped at once,
        counted, and not fed to the breaker."""
        attempt = 0
        while True:
            if item.ticket is not None and not self.events.wanted(self.name, item.key, item.ticket):
                return  # deleted while queued
            if not self.breaker.allow():
                await asyncio.sleep(self.breaker.retry_in())
                continue
            probe = self.breaker.probing
            t0 = time.perf_counter()
            try:
                await self.put(item.key, [item.value], expires_ms=item.expires_ms, _gated=True)
            except ObjectRejected as e:
                if probe:
                    self.breaker.release_probe()
                self.stats["rejected"] += 1
                self._drop_item(item, "rejected", f"refused by the store ({e})")
                return
            except TransportError as e:
                self.breaker.failure()
                if not probe:
                    attempt += 1
                if attempt > self.ts.s3_max_retries:
                    self.stats["gave_up"] += 1
                    self._drop_item(item, "io", f"failed {attempt} times ({e})")
                    return
                self.stats["retries"] += 1
                metrics.record_error("flush", "io")
                delay = min(2.0, 0.05 * (2 ** min(attempt, 6))) * (0.5 + random.random())
                (log.warning if attempt == 1 else log.debug)("object tier: upload failed (%s); retrying", e)
                await asyncio.sleep(delay)
                continue
            except BaseException:
                if probe:
                    self.breaker.release_probe()
                raise
            self.breaker.success()
            metrics.observe_latency("flush", self.name, "local", time.perf_counter() - t0)
            if item.ticket is not None and not self.events.landed(self.name, item.key, item.ticket,
                                                                  item.value.nbytes, item.expires_ms):
                with contextlib.suppress(TransportError):  # deleted during upload: undo
                    await self.delete_now(item.key)
            return

    def _drop_item(self, item: _Item, cause: str, why: str) -> None:
        self.stats["dropped"] += 1
        self._unflushed += 1
        metrics.record_flush_drop(self.name)
        metrics.record_error("flush", cause)
        log.warning("object tier: upload of %s dropped: %s", self.object_key(item.key), why)
        if item.ticket is not None:
            self.events.dropped(self.name, item.key, item.ticket)

    # --- direct operations -----------------------------------------------------------------
    async def _io(self, aw: Any) -> Any:
        """One request to the store (or one block of a body), bounded as a whole by
        ``s3_timeout_s`` (asyncio.TimeoutError, mapped by the callers to DeadlineExceeded).
        The client's own socket timers do not cover every wait: an upload into a black hole
        (connections accepted, nothing answered) never timed out, holding an upload worker
        and a share of the requests the store may have in flight for good (issue 28)."""
        return await asyncio.wait_for(aw, self.ts.s3_timeout_s)

    async def put(self, key: bytes, parts: Sequence[bytes | bytearray | memoryview], *, expires_ms: int = 0,
                  _gated: bool = False) -> None:
        """Upload now (no queue). Raises TransportError; already-present is success."""
        if not _gated and not self.breaker.allow():
            self.stats["breaker_rejections"] += 1
            raise ConnectionLost("object store: circuit breaker open")
        views = [memoryview(p).cast("B") for p in parts]
        body = views[0] if len(views) == 1 else memoryview(b"".join(views))
        okey = self.object_key(key)
        meta = {"lmcv-key": base64.urlsafe_b64encode(key).decode(), "lmcv-len": str(body.nbytes),
                "lmcv-exp": str(expires_ms)}
        try:
            if body.nbytes >= self.ts.s3_multipart_threshold:
                await self._multipart(okey, body, meta)
            else:
                await self._put_object(okey, body, meta)
        except ClientError as e:
            if _code(e) in _PRECONDITION:
                self.stats["conditional_exists"] += 1
            elif _permanent(e):
                self.stats["upload_failures"] += 1
                raise ObjectRejected(f"object store: {_code(e)}: {e}") from None
            else:
                self._fail_direct(_gated)
                raise _map_error(e) from None
        except (BotoCoreError, OSError, asyncio.TimeoutError) as e:
            self._fail_direct(_gated)
            raise _map_error(e) from None
        except Exception as e:  # aiohttp errors and friends
            self._fail_direct(_gated)
            raise _map_error(e) from None
        if not _gated:
            self.breaker.success()
        self.stats["uploaded"] += 1
        self.stats["bytes_uploaded"] += body.nbytes
        metrics.record_put(self.name, "local", body.nbytes, True)
        metrics.record_demotion(self.name, body.nbytes)

    def available(self) -> bool:
        return self.breaker.state != self.breaker.OPEN

    def report(self) -> dict[str, Any]:
        return {**self.stats, "backlog": self.backlog, "queue_max": self.ts.flush_queue_max,
                "breaker": self.breaker.state}

    def _fail_direct(self, gated: bool) -> None:
        self.stats["upload_failures"] += 1
        if not gated:
            self.breaker.failure()

    async def _put_object(self, okey: str, body: memoryview, meta: dict[str, str]) -> None:
        obj = body.obj
        data = obj if isinstance(obj, (bytes, bytearray)) and len(obj) == body.nbytes else bytes(body)
        async with self._sem:
            await self._if_none_match(self._client.put_object, Bucket=self.bucket, Key=okey, Body=data,
                                      Metadata=meta, ContentLength=body.nbytes)

    async def _if_none_match(self, call: Any, **kw: Any) -> None:
        """``call`` with ``If-None-Match: *`` (a chunk id names its content: "already exists" is
        success); a store that refuses the header is remembered and written to unconditionally."""
        if self._conditional:
            try:
                await self._io(call(IfNoneMatch="*", **kw))
                return
            except ClientError as e:
                if _code(e) not in _UNSUPPORTED:
                    raise
                log.warning("object tier: store refuses conditional writes (%s); writing unconditionally", _code(e))
                self._conditional = False
        await self._io(call(**kw))

    async def _multipart(self, okey: str, body: memoryview, meta: dict[str, str]) -> None:
        self.stats["multipart"] += 1
        up = await self._io(self._client.create_multipart_upload(Bucket=self.bucket, Key=okey, Metadata=meta))
        uid = up["UploadId"]
        psize = self.ts.s3_part_bytes
        n = (body.nbytes + psize - 1) // psize

        async def part(i: int) -> dict:
            chunk = bytes(body[i * psize : min(body.nbytes, (i + 1) * psize)])
            async with self._sem:
                r = await self._io(self._client.upload_part(Bucket=self.bucket, Key=okey, UploadId=uid,
                                                            PartNumber=i + 1, Body=chunk))
            return {"PartNumber": i + 1, "ETag": r["ETag"]}

        try:
            parts = await asyncio.gather(*(part(i) for i in range(n)))
            await self._if_none_match(self._client.complete_multipart_upload, Bucket=self.bucket, Key=okey,
                                      UploadId=uid, MultipartUpload={"Parts": list(parts)})
        except BaseException:
            with contextlib.suppress(Exception):
                await self._io(self._client.abort_multipart_upload(Bucket=self.bucket, Key=okey, UploadId=uid))
            raise

    async def head(self, key: bytes) -> int | None:
        """Stored value length, or None when absent."""
        info = await self.head_info(key)
        return None if info is None else info.value_len

    async def expiry_of(self, key: bytes) -> Found | None:
        return await self.head_info(key)

    async def head_info(self, key: bytes) -> Found | None:
        """Length, mtime and expiry (``lmcv-exp``) of a stored chunk, or None when absent."""
        try:
            async with self._sem:
                r = await self._io(self._client.head_object(Bucket=self.bucket, Key=self.object_key(key)))
        except ClientError as e:
            if _code(e) in _MISSING:
                return None
            raise _map_error(e) from None
        except Exception as e:
            raise _map_error(e) from None
        mtime = r["LastModified"].timestamp() if r.get("LastModified") else 0.0
        return Found(key, int(r["ContentLength"]), mtime, _int_or_zero((r.get("Metadata") or {}).get("lmcv-exp")))

    async def read(self, key: bytes, value_len: int | None = None) -> ChunkRead | None:
        """(codec header, payload) of a stored chunk, verified; None on a miss (absent, corrupt:
        counted, a corrupt object deleted). Raises TransportError when the store did not answer
        (breaker open, connection, timeout).

        Reads with parallel ranged GETs when the value is larger than ``s3_range_bytes``."""
        if not self.breaker.allow():
            self.stats["breaker_rejections"] += 1
            self.stats["misses"] += 1
            metrics.record_miss(self.name, "connection")
            raise ConnectionLost("object store: circuit breaker open")
        probe = self.breaker.probing  # this read is the half-open probe
        self.stats["reads"] += 1
        okey = self.object_key(key)
        t0 = time.perf_counter()
        with self.pins.pin(key):
            try:
                return await self._read_value(key, okey, value_len, t0)
            finally:
                if probe:  # a cancelled probe must not leave the breaker half-open for good
                    self.breaker.release_probe()

    async def _read_value(self, key: bytes, okey: str, value_len: int | None, t0: float) -> ChunkRead | None:
        try:
            if value_len is None:
                value_len = await self.head(key)
                if value_len is None:
                    self.breaker.success()
                    self.stats["misses"] += 1
                    metrics.record_miss(self.name, "absent")
                    self._gone(key)
                    return None
            buf = self.buffers.acquire(value_len)
            try:
                meta: dict[str, str] = {}
                got = await self._get_ranges(okey, memoryview(buf)[:value_len], value_len, meta)
            except BaseException:
                self.buffers.release(buf)
                raise
        except _Absent:
            self.breaker.success()
            self.stats["misses"] += 1
            metrics.record_miss(self.name, "absent")
            self._gone(key)
            return None
        except TransportError as e:
            self.breaker.failure()
            self.stats["misses"] += 1
            metrics.record_miss(self.name, e.cause)
            raise
        self.breaker.success()
        exp = _int_or_zero(meta.get("lmcv-exp"))
        if exp and exp <= int(time.time() * 1000):  # expired (the listing could not tell)
            self.buffers.release(buf)
            self.stats["misses"] += 1
            metrics.record_miss(self.name, "absent")
            etag = meta.get(_ETAG)
            self.pins.defer(key, lambda: self._delete_quiet(key, etag))
            self._gone(key)
            return None
        mv = memoryview(buf)[:value_len]
        try:
            if got != value_len:
                raise CorruptChunk("truncated", f"object of {got} bytes, expected {value_len}")
            header = codec.decode_header(mv[: codec.HEADER_SIZE])
            if header.payload_len != value_len - codec.HEADER_SIZE:
                raise CorruptChunk("truncated", "object length disagrees with its header")
            if codec.crc32c(mv[codec.HEADER_SIZE :]) != header.payload_crc:
                raise CorruptChunk("crc", "payload checksum mismatch")
        except CorruptChunk as c:
            if c.reason == "format":  # another format version (rolling upgrade): a miss, not ours to delete
                self.stats["format_misses"] += 1
                self.stats["misses"] += 1
                metrics.record_miss(self.name, "format")
                self._gone(key)
                self.buffers.release(buf)
                return None
            log.warning("object tier: corrupt object %s (%s); deleted", okey, c)
            self.stats["corrupt"] += 1
            self.stats["misses"] += 1
            metrics.record_miss(self.name, c.reason)
            etag = meta.get(_ETAG)
            self.pins.defer(key, lambda: self._delete_quiet(key, etag))
            self._gone(key)
            self.buffers.release(buf)
            return None
        self.stats["hits"] += 1
        self.stats["bytes_read"] += value_len
        metrics.observe_latency("get", self.name, "local", time.perf_counter() - t0)
        return ChunkRead(mv[: codec.HEADER_SIZE], mv[codec.HEADER_SIZE :], lambda: self.buffers.release(buf),
                         expires_ms=exp)

    def _gone(self, key: bytes) -> None:
        self.events.lost(self.name, key)

    async def _get_ranges(self, okey: str, dest: memoryview, total: int, meta: dict[str, str]) -> int:
        """Parallel ranged GETs into ``dest``; ``meta`` receives the object's metadata."""
        # about s3_range_bytes per range, equal parts, no tiny tail (a 512-byte GET costs a round trip)
        parts = max(1, round(total / self.ts.s3_range_bytes))
        step = -(-total // parts) if total else 1
        ranges = [(o, min(total, o + step)) for o in range(0, total, step)] or [(0, 0)]

        async def one(start: int, end: int) -> int:
            async with self._sem:
                try:
                    r = await self._io(self._client.get_object(Bucket=self.bucket, Key=okey,
                                                               Range=f"bytes={start}-{end - 1}"))
                except ClientError as e:
                    if _code(e) in _MISSING:
                        raise _Absent() from None
                    if _code(e) in {"InvalidRange", "416"}:
                        return 0
                    raise _map_error(e) from None
                except Exception as e:
                    raise _map_error(e) from None
                if start == 0:
                    meta.update(r.get("Metadata") or {})
                    if r.get("ETag"):
                        meta[_ETAG] = str(r["ETag"])
                body = r["Body"]
                try:
                    pos = start
                    stream = getattr(getattr(body, "raw_stream", None), "content", None)
                    if stream is not None and hasattr(stream, "readexactly"):
                        # aiohttp: 1 MiB blocks (few awaits, one copy each) beat readinto's
                        # socket-sized pieces by 20-40% on large objects.
                        while pos < end:
                            n = min(_READ_BLOCK, end - pos)
                            try:
                                block = await self._io(stream.readexactly(n))
                            except asyncio.IncompleteReadError as e:
                                dest[pos : pos + len(e.partial)] = e.partial
                                pos += len(e.partial)
                                break
                            dest[pos : pos + n] = block
                            pos += n
                    else:
                        while pos < end:
                            n = await self._io(body.readinto(dest[pos:end]))
                            if not n:
                                break
                            pos += n
                    return pos - start
                except Exception as e:
                    raise _map_error(e) from None
                finally:
                    body.close()

        counts = await asyncio.gather(*(one(s, e) for s, e in ranges))
        return sum(counts)

    async def remove(self, key: bytes) -> Removal:
        """Delete the object now (GONE; the store cannot tell whether it was there), or defer
        it while a read holds it (PENDING: ask again later). Raises TransportError (breaker
        open, store failing)."""
        if self.pins.pinned(key):
            self.pins.defer(key, lambda: self._delete_quiet(key))
            return Removal.PENDING
        await self.delete_now(key)
        return Removal.GONE

    async def delete_now(self, key: bytes) -> None:
        """DELETE the object (idempotent: absent is success), gated by the breaker."""
        if not self.breaker.allow():
            self.stats["breaker_rejections"] += 1
            raise ConnectionLost("object store: circuit breaker open")
        probe = self.breaker.probing
        try:
            async with self._sem:
                await self._io(self._client.delete_object(Bucket=self.bucket, Key=self.object_key(key)))
        except ClientError as e:
            if _code(e) not in _MISSING:
                if _permanent(e):
                    if probe:
                        self.breaker.release_probe()
                    raise ObjectRejected(f"object store: {_code(e)}: {e}") from None
                self.breaker.failure()
                raise _map_error(e) from None
        except asyncio.CancelledError:
            if probe:
                self.breaker.release_probe()
            raise
        except Exception as e:  # noqa: BLE001 - aiohttp/botocore errors, mapped
            self.breaker.failure()
            raise _map_error(e) from None
        self.breaker.success()
        self.stats["deleted"] += 1

    async def _delete_quiet(self, key: bytes, etag: str | None = None) -> None:
        """Best-effort delete of a copy found bad or expired. With ``etag`` (the copy that was
        read) the DELETE is conditional (If-Match): a newer object written since — the
        delete may have waited for reads to finish — is kept."""
        okey = self.object_key(key)
        try:
            if etag and self._conditional_delete:
                try:
                    await self._io(self._client.delete_object(Bucket=self.bucket, Key=okey, IfMatch=etag))
                    self.stats["deleted"] += 1
                    return
                except ClientError as e:
                    if _code(e) in _PRECONDITION or _code(e) in _MISSING:
                        self.stats["delete_skipped_newer"] += _code(e) in _PRECONDITION
                        return  # replaced (or gone) since it was read: not ours to delete
                    if _code(e) not in _UNSUPPORTED:
                        raise
                    self._conditional_delete = False
            await self._io(self._client.delete_object(Bucket=self.bucket, Key=okey))
            self.stats["deleted"] += 1
        except Exception as e:  # noqa: BLE001 - best effort; logged
            log.warning("object tier: delete of %s failed: %s", okey, e)

    async def inventory(self, tenant: str | None = None) -> AsyncIterator[Found]:
        """Every stored chunk of ``tenant`` (for rebuilding the ledger); a listing cannot tell
        an object's expiry (``expires_ms`` None: :meth:`expiry_of` reads it)."""
        prefix = self.tenant_prefix(tenant) if tenant else self.prefix + "/"
        paginator = self._client.get_paginator("list_objects_v2")
        try:
            async for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
                for o in page.get("Contents", ()):
                    key = self.data_key_of(o["Key"])
                    if key is None:
                        continue
                    yield Found(key, int(o["Size"]), o["LastModified"].timestamp(), None)
        except ClientError as e:
            raise _map_error(e) from None
        except (BotoCoreError, OSError) as e:
            raise _map_error(e) from None

    async def create_bucket(self) -> None:
        """For tests and first-time set-up: create the bucket if missing."""
        with contextlib.suppress(ClientError):
            kw = {}
            if self.ts.s3_region and self.ts.s3_region != "us-east-1":
                kw["CreateBucketConfiguration"] = {"LocationConstraint": self.ts.s3_region}
            await self._client.create_bucket(Bucket=self.bucket, **kw)


def _int_or_zero(v: object) -> int:
    try:
        return int(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0


class _Absent(Exception):
    pass


