"""NVMe (warm) tier: one file per chunk in a fan-out directory, O_DIRECT, crash-safe.

File layout (all offsets 4096-aligned so that O_DIRECT works)::

    0      512 B   the chunk's codec header, verbatim (lmcache_valkey.codec)
    512    ...     tier record: magic b"LMCT", version, key length, CRC32C, value length,
                   expires (Unix ms, 0 = never), the Valkey data key
    4096   ...     payload, zero-padded to a multiple of 4096

The file is self-describing: :meth:`NvmeTier.start` rebuilds the index by reading the
first block of each file. Writes go to ``<name>.tmp.<rand>``, are fsynced, renamed over the
final name (the directory is fsynced too with ``nvme_fsync_dir``): a crash leaves either no
file or the complete new one, never a torn one (stale temp files are removed at start). Without
the directory fsync a crash may forget the last few renames — a cache miss, not corruption;
the object tier, not NVMe, is the durable copy. Reads verify header, tier
record and payload CRC32C; a bad file is a counted miss and is removed.

All file I/O runs in a thread pool. Buffers are anonymous ``mmap`` (page aligned). Where
the filesystem refuses O_DIRECT (tmpfs), the tier falls back to buffered I/O and logs a
warning once. A byte budget with LRU eviction bounds the directory; a write that does not
fit (budget, or ENOSPC from the filesystem) is refused and counted.

Never imports: aiobotocore, a transport, the store.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import fcntl
import hashlib
import logging
import mmap
import os
import struct
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, AsyncIterator, Sequence

from .. import codec
from ..errors import CorruptChunk
from .. import metrics
from .buffers import BufferPool
from .markers import split_data_key
from .tiers import ChunkRead, Found, NoEvents, Pins, Removal, TierEvents

log = logging.getLogger(__name__)

BLOCK = 4096
PRELUDE = BLOCK
_REC = struct.Struct("<4sHHIQQ")  # magic, version, key_len, crc, value_len, expires_ms
_REC_MAGIC = b"LMCT"
_REC_VERSION = 1
_KEY_MAX = PRELUDE - codec.HEADER_SIZE - _REC.size
_IO_PIECE = 64 << 20  # bytes per read/write syscall

O_DIRECT = getattr(os, "O_DIRECT", 0)


def _align(n: int) -> int:
    return (n + BLOCK - 1) // BLOCK * BLOCK


def aligned_buffer(n: int) -> mmap.mmap:
    """A page-aligned, zeroed buffer of at least ``n`` bytes (rounded up to BLOCK)."""
    return mmap.mmap(-1, max(_align(n), BLOCK))


@dataclass
class NvmeEntry:
    key: bytes
    value_len: int
    disk_bytes: int
    mtime: float
    expires_ms: int = 0


def _encode_record(key: bytes, value_len: int, expires_ms: int) -> bytes:
    if len(key) > _KEY_MAX:
        raise ValueError(f"data key of {len(key)} bytes is longer than {_KEY_MAX}")
    body = _REC.pack(_REC_MAGIC, _REC_VERSION, len(key), 0, value_len, expires_ms) + key
    crc = codec.crc32c(body)
    return _REC.pack(_REC_MAGIC, _REC_VERSION, len(key), crc, value_len, expires_ms) + key


def _decode_prelude(block: memoryview) -> tuple[bytes, int, int, codec.Header]:
    """(data key, value length, expires_ms, codec header) or raise CorruptChunk."""
    if block.nbytes < PRELUDE:
        raise CorruptChunk("truncated", "short prelude")
    header = codec.decode_header(block[: codec.HEADER_SIZE])
    magic, ver, klen, crc, vlen, exp = _REC.unpack_from(block, codec.HEADER_SIZE)
    if magic == _REC_MAGIC and ver != _REC_VERSION:
        raise CorruptChunk("format", f"tier record version {ver}, expected {_REC_VERSION}")
    if magic != _REC_MAGIC or klen > _KEY_MAX:
        raise CorruptChunk("foreign", "bad tier record")
    start = codec.HEADER_SIZE + _REC.size
    key = bytes(block[start : start + klen])
    body = bytearray(block[codec.HEADER_SIZE : start + klen])
    struct.pack_into("<I", body, 8, 0)
    if codec.crc32c(body) != crc:
        raise CorruptChunk("crc", "tier record checksum mismatch")
    if vlen != codec.HEADER_SIZE + header.payload_len:
        raise CorruptChunk("truncated", "tier record length disagrees with header")
    return key, vlen, exp, header


LOCK_NAME = ".lmcv-nvme.lock"


class NvmeDirInUse(RuntimeError):
    """Another process (or tier) holds the directory: two indexes over one directory would
    evict, overwrite and unlink each other's files."""


class NvmeTier:
    """A :class:`~.tiers.LowerTier` on a local directory (``remote`` is False: a removal is
    done when :meth:`remove` returns, and a write is durable when :meth:`write` returns)."""

    name = "nvme"
    remote = False

    def __init__(
        self,
        root: str,
        budget_bytes: int,
        *,
        direct: bool = True,
        threads: int = 4,
        events: TierEvents | None = None,
        fsync: bool = True,
        fsync_dir: bool = False,
    ) -> None:
        self.root = os.path.abspath(root)
        self.budget = budget_bytes
        self.want_direct = direct and bool(O_DIRECT)
        self.direct = False
        self.fsync = fsync
        self.fsync_dir = fsync_dir
        self._dirs: set[str] = set()
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="lmcv-nvme")
        self._lru: OrderedDict[bytes, NvmeEntry] = OrderedDict()
        self._used = 0
        self._reserved = 0
        self._writing: dict[bytes, asyncio.Future] = {}
        self.pins = Pins()
        self.buffers = BufferPool()
        self.events: TierEvents = events or NoEvents()
        self._lock_fd: int | None = None
        self.stats = {
            "writes": 0, "reads": 0, "hits": 0, "misses": 0, "corrupt": 0, "evicted": 0,
            "refused_budget": 0, "refused_enospc": 0, "write_errors": 0, "bytes_written": 0, "bytes_read": 0, "zero_copy_reads": 0,
            "format_skipped": 0,
        }

    # --- paths ---------------------------------------------------------------------------
    def path_of(self, key: bytes) -> str:
        """The file of a (checked) data key: a digest of it, so no key can name a path."""
        h = hashlib.blake2b(key, digest_size=16).hexdigest()
        return os.path.join(self.root, h[:2], h[2:4], h)

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    # --- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Create the directory, probe O_DIRECT, rebuild the index from file headers."""
        os.makedirs(self.root, exist_ok=True)
        self._lock()
        self.direct = self.want_direct and await self._run(self._probe_direct)
        if self.want_direct and not self.direct:
            log.warning("nvme tier: %s refuses O_DIRECT; using buffered I/O (slower, page cache)", self.root)
        entries, corrupt, skipped = await self._run(self._scan)
        self.stats["format_skipped"] += skipped
        for e in sorted(entries, key=lambda e: e.mtime):
            self._lru[e.key] = e
            self._used += e.disk_bytes
        self.stats["corrupt"] += corrupt
        for _ in range(corrupt):
            metrics.record_miss(self.name, "crc")
        self._usage()

    async def inventory(self, tenant: str) -> AsyncIterator[Found]:
        """The files read at :meth:`start` (one tier per directory: every file is ours)."""
        for e in list(self._lru.values()):
            yield Found(e.key, e.value_len, e.mtime, e.expires_ms)

    async def close(self, drain_timeout: float = 0.0) -> int:
        # wait for the file I/O in flight without blocking the event loop
        await asyncio.to_thread(self._pool.shutdown, True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None
        return 0

    async def flush(self, timeout: float | None = None) -> bool:
        return True  # writes are durable when they return

    def take_unflushed(self) -> int:
        return 0  # no write-behind: a write that fails says so to its caller

    def available(self) -> bool:
        return True

    async def expiry_of(self, key: bytes) -> Found | None:
        e = self._lru.get(key)
        return None if e is None else Found(e.key, e.value_len, e.mtime, e.expires_ms)

    def report(self) -> dict[str, Any]:
        return {**self.stats, "used_bytes": self._used, "budget_bytes": self.budget, "direct_io": self.direct}

    def _lock(self) -> None:
        """One tier per directory: take an exclusive flock, or fail loudly."""
        path = os.path.join(self.root, LOCK_NAME)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            raise NvmeDirInUse(
                f"nvme_dir {self.root!r} is in use by another process (lock {path} held): give each "
                f"tier manager (tierd or embedded worker) its own nvme_dir"
            ) from e
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def _probe_direct(self) -> bool:
        if not O_DIRECT:
            return False
        path = os.path.join(self.root, f".probe.{os.getpid()}")
        try:
            fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC | O_DIRECT, 0o600)
        except OSError:
            return False
        try:
            buf = aligned_buffer(BLOCK)
            os.write(fd, buf)
            return True
        except OSError:
            return False
        finally:
            os.close(fd)
            try:
                os.unlink(path)
            except OSError:
                pass

    def _scan(self) -> tuple[list[NvmeEntry], int, int]:
        entries: list[NvmeEntry] = []
        corrupt = skipped = 0
        buf = aligned_buffer(PRELUDE)
        for dirpath, _dirs, files in os.walk(self.root):
            for name in files:
                path = os.path.join(dirpath, name)
                if name == LOCK_NAME:
                    continue
                if ".tmp." in name or name.startswith(".probe.") or ".gone." in name:
                    _unlink(path)  # a write that never committed, or a removal that did not finish
                    continue
                try:
                    st = os.stat(path)
                    n = self._pread_into(path, memoryview(buf), 0, PRELUDE)
                    key, vlen, exp, _h = _decode_prelude(memoryview(buf)[:n])
                    try:
                        split_data_key(key)
                    except ValueError:
                        raise CorruptChunk("foreign", "the file names a key outside the key schema") from None
                    if self.path_of(key) != path:
                        raise CorruptChunk("foreign", "file name does not match its key")
                    if st.st_size < PRELUDE + vlen - codec.HEADER_SIZE:
                        raise CorruptChunk("truncated", "file shorter than its header says")
                except CorruptChunk as e:
                    if e.reason == "format":  # another format version (rolling upgrade): not ours to delete
                        skipped += 1
                        continue
                    log.warning("nvme tier: removing unreadable chunk file %s (%s)", path, e)
                    corrupt += 1
                    _unlink(path)
                    continue
                except OSError as e:
                    log.warning("nvme tier: removing unreadable chunk file %s (%s)", path, e)
                    corrupt += 1
                    _unlink(path)
                    continue
                entries.append(NvmeEntry(key, vlen, st.st_size, st.st_mtime, exp))
        if skipped:
            log.warning("nvme tier: %d chunk file(s) of another format version left in place (not indexed)", skipped)
        return entries, corrupt, skipped

    # --- queries ---------------------------------------------------------------------------
    def __contains__(self, key: bytes) -> bool:
        return key in self._lru

    def value_len(self, key: bytes) -> int | None:
        e = self._lru.get(key)
        return e.value_len if e else None

    def entries(self) -> list[NvmeEntry]:
        return list(self._lru.values())

    @property
    def used_bytes(self) -> int:
        return self._used

    def _usage(self) -> None:
        metrics.set_tier_usage(self.name, self._used, self.budget)

    # --- write -----------------------------------------------------------------------------
    async def write(self, key: bytes, parts: Sequence[bytes | bytearray | memoryview], *, expires_ms: int = 0,
                    ticket: int | None = None) -> bool:
        """Store a chunk value (codec header + payload, possibly split in ``parts``).

        Returns True when the file is durable (with a ``ticket``, reported as ``landed``
        first); False when refused (budget, ENOSPC, error)."""
        if key in self._lru or key in self._writing:
            ok = key in self._lru or await asyncio.shield(self._writing[key])
            if ok and ticket is not None:
                self._landed(key, ticket, self._lru[key].value_len, expires_ms)
            return ok
        split_data_key(key)  # ValueError: only keys of the schema, every segment checked, reach the disk
        views = [memoryview(p).cast("B") for p in parts]
        value_len = sum(v.nbytes for v in views)
        disk = PRELUDE + _align(value_len - codec.HEADER_SIZE)
        if value_len < codec.HEADER_SIZE:
            raise ValueError("a chunk value is at least its header")
        if not self._make_room(disk):
            self.stats["refused_budget"] += 1
            metrics.record_admission(self.name, False)
            metrics.record_error("demote", "overflow")
            return False
        fut = asyncio.get_running_loop().create_future()
        self._writing[key] = fut
        self._reserved += disk
        ok = False
        t0 = time.perf_counter()
        try:
            ok = await self._run(self._write_file, key, views, value_len, disk, expires_ms)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                self.stats["refused_enospc"] += 1
                metrics.record_admission(self.name, False)
                log.warning("nvme tier: disk full, chunk refused (%s)", e)
            else:
                self.stats["write_errors"] += 1
                log.warning("nvme tier: write failed: %s", e)
            metrics.record_error("demote", "io")
        finally:
            self._reserved -= disk
            del self._writing[key]
            fut.set_result(ok)
        if ok:
            self._lru[key] = NvmeEntry(key, value_len, disk, time.time(), expires_ms)
            self._used += disk
            self.stats["writes"] += 1
            self.stats["bytes_written"] += value_len
            metrics.record_admission(self.name, True)
            metrics.record_put(self.name, "local", value_len, True)
            metrics.observe_latency("demote", self.name, "local", time.perf_counter() - t0)
            self._usage()
            if ticket is not None:
                self._landed(key, ticket, value_len, expires_ms)
        return ok

    def _landed(self, key: bytes, ticket: int, value_len: int, expires_ms: int) -> None:
        if not self.events.landed(self.name, key, ticket, value_len, expires_ms):
            self._drop(key, report=False)  # stale (deleted while written): never served

    def _make_room(self, need: int) -> bool:
        if need > self.budget:
            return False
        for key in list(self._lru):
            if self._used + self._reserved + need <= self.budget:
                break
            if self.pins.pinned(key):
                continue
            self._drop(key, evicted=True)
        return self._used + self._reserved + need <= self.budget

    def _write_file(self, key: bytes, views: list[memoryview], value_len: int, disk: int, expires_ms: int) -> bool:
        path = self.path_of(key)
        parent = os.path.dirname(path)
        if parent not in self._dirs:
            os.makedirs(parent, exist_ok=True)
            self._dirs.add(parent)
        buf = self.buffers.acquire(disk)
        try:
            return self._write_from(buf, path, key, views, value_len, disk, expires_ms)
        finally:
            self.buffers.release(buf)

    def _write_from(self, buf: mmap.mmap, path: str, key: bytes, views: list[memoryview], value_len: int,
                    disk: int, expires_ms: int) -> bool:
        header = bytearray(codec.HEADER_SIZE)
        # Gather the value: first HEADER_SIZE bytes -> header, the rest -> payload at PRELUDE.
        pos = 0
        for v in views:
            n = v.nbytes
            if pos < codec.HEADER_SIZE:
                h = min(n, codec.HEADER_SIZE - pos)
                header[pos : pos + h] = v[:h]
                if n > h:
                    buf[PRELUDE : PRELUDE + n - h] = v[h:]
            else:
                off = PRELUDE + pos - codec.HEADER_SIZE
                buf[off : off + n] = v
            pos += n
        buf[: codec.HEADER_SIZE] = header
        rec = _encode_record(key, value_len, expires_ms)
        buf[codec.HEADER_SIZE : PRELUDE] = rec + bytes(PRELUDE - codec.HEADER_SIZE - len(rec))
        tail = PRELUDE + value_len - codec.HEADER_SIZE
        if tail < disk:
            buf[tail:disk] = bytes(disk - tail)  # pooled buffer: zero the padding
        tmp = f"{path}.tmp.{os.getpid()}.{os.urandom(4).hex()}"
        flags = os.O_CREAT | os.O_WRONLY | os.O_EXCL | (O_DIRECT if self.direct else 0)
        fd = os.open(tmp, flags, 0o600)
        try:
            mv = memoryview(buf)
            off = 0
            while off < disk:
                n = os.pwrite(fd, mv[off : min(disk, off + _IO_PIECE)], off)
                off += n
            if self.fsync:
                os.fdatasync(fd)  # data + what is needed to read it back (size, extents)
        except BaseException:
            os.close(fd)
            _unlink(tmp)
            raise
        os.close(fd)
        os.replace(tmp, path)
        if self.fsync_dir:
            dfd = os.open(os.path.dirname(path), os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        return True

    # --- read ------------------------------------------------------------------------------
    def _pread_into(self, path: str, dest: memoryview, offset: int, length: int) -> int:
        """Read ``length`` bytes at ``offset`` (both BLOCK-aligned) into aligned ``dest``."""
        fd = os.open(path, os.O_RDONLY | (O_DIRECT if self.direct else 0))
        try:
            done = 0
            while done < length:
                n = os.preadv(fd, [dest[done : min(length, done + _IO_PIECE)]], offset + done)
                if n <= 0:
                    break
                done += n
            return done
        finally:
            os.close(fd)

    def _read_file(self, key: bytes, e: NvmeEntry) -> tuple[mmap.mmap, codec.Header]:
        buf = self.buffers.acquire(e.disk_bytes)
        try:
            return self._read_to(buf, key, e)
        except BaseException:
            self.buffers.release(buf)
            raise

    def _read_to(self, buf: mmap.mmap, key: bytes, e: NvmeEntry) -> tuple[mmap.mmap, codec.Header]:
        path = self.path_of(key)
        mv = memoryview(buf)
        try:
            n = self._pread_into(path, mv, 0, e.disk_bytes)
            pkey, vlen, _exp, header = _decode_prelude(mv[:n])
            if pkey != key:
                raise CorruptChunk("foreign", "file holds another key")
            plen = header.payload_len
            if n < PRELUDE + plen:
                raise CorruptChunk("truncated", f"file holds {n - PRELUDE} payload bytes, header says {plen}")
            if codec.crc32c(mv[PRELUDE : PRELUDE + plen]) != header.payload_crc:
                raise CorruptChunk("crc", "payload checksum mismatch")
            return buf, header
        finally:
            mv.release()

    async def read(self, key: bytes, value_len: int | None = None) -> ChunkRead | None:
        """The chunk's codec header and payload as views of one pooled aligned buffer, or None.

        Verified (header, tier record, CRC32C). A corrupt file is counted and removed.
        Call ``release()`` on the result when done with the views."""
        e = self._lru.get(key)
        if e is None:
            self.stats["misses"] += 1
            metrics.record_miss(self.name, "absent")
            return None
        self._lru.move_to_end(key)
        self.stats["reads"] += 1
        t0 = time.perf_counter()
        with self.pins.pin(key):
            try:
                buf, header = await self._run(self._read_file, key, e)
            except CorruptChunk as c:
                self._corrupt(key, c)
                return None
            except FileNotFoundError:
                self._drop(key)
                self.stats["misses"] += 1
                metrics.record_miss(self.name, "absent")
                return None
            except OSError as err:
                log.warning("nvme tier: read of %s failed: %s", self.path_of(key), err)
                self.stats["misses"] += 1
                metrics.record_miss(self.name, "error")
                return None
        mv = memoryview(buf)
        self.stats["hits"] += 1
        self.stats["bytes_read"] += e.value_len
        metrics.observe_latency("get", self.name, "local", time.perf_counter() - t0)
        return ChunkRead(mv[: codec.HEADER_SIZE], mv[PRELUDE : PRELUDE + header.payload_len],
                         lambda: self.buffers.release(buf))

    async def read_into(self, key: bytes, dest: memoryview) -> codec.Header | None:
        """Read the payload straight into ``dest`` (exactly the payload length); returns the
        verified header, or None (miss; ``dest`` may then hold garbage).

        One ``preadv`` scatters the first block into a scratch buffer and the payload into
        ``dest`` with no copy when O_DIRECT allows it (``dest`` page-aligned, its length a
        multiple of 4096) or when the tier runs buffered; otherwise it goes through a pooled
        aligned buffer (one copy)."""
        e = self._lru.get(key)
        dest = memoryview(dest).cast("B")
        if e is None or dest.nbytes != e.value_len - codec.HEADER_SIZE:
            self.stats["misses"] += 1
            metrics.record_miss(self.name, "absent" if e is None else "oversized")
            return None
        if self.direct and not (dest.nbytes % BLOCK == 0 and _address(dest) % BLOCK == 0):
            got = await self.read(key)
            if got is None:
                return None
            try:
                dest[:] = got.payload
                return codec.decode_header(got.header)
            finally:
                got.release()
        self._lru.move_to_end(key)
        self.stats["reads"] += 1
        with self.pins.pin(key):
            try:
                header = await self._run(self._scatter_read, key, dest)
            except CorruptChunk as c:
                self._corrupt(key, c)
                return None
            except OSError as err:
                if isinstance(err, FileNotFoundError):
                    self._drop(key)
                self.stats["misses"] += 1
                metrics.record_miss(self.name, "absent" if isinstance(err, FileNotFoundError) else "error")
                return None
        self.stats["hits"] += 1
        self.stats["zero_copy_reads"] += 1
        self.stats["bytes_read"] += e.value_len
        return header

    def _scatter_read(self, key: bytes, dest: memoryview) -> codec.Header:
        scratch = self.buffers.acquire(PRELUDE)
        try:
            fd = os.open(self.path_of(key), os.O_RDONLY | (O_DIRECT if self.direct else 0))
            try:
                n = os.preadv(fd, [memoryview(scratch)[:PRELUDE], dest], 0)
            finally:
                os.close(fd)
            pkey, _vlen, _exp, header = _decode_prelude(memoryview(scratch)[:PRELUDE])
            if pkey != key:
                raise CorruptChunk("foreign", "file holds another key")
            if n < PRELUDE + header.payload_len or header.payload_len != dest.nbytes:
                raise CorruptChunk("truncated", "file shorter than its header says")
            if codec.crc32c(dest) != header.payload_crc:
                raise CorruptChunk("crc", "payload checksum mismatch")
            return header
        finally:
            self.buffers.release(scratch)

    def _corrupt(self, key: bytes, c: CorruptChunk) -> None:
        if c.reason == "format":  # another format version: a miss; the file stays (not ours to delete)
            self.stats["format_skipped"] += 1
            self.stats["misses"] += 1
            metrics.record_miss(self.name, "format")
            self._forget(key)
            return
        log.warning("nvme tier: corrupt chunk file %s (%s); removed", self.path_of(key), c)
        self.stats["corrupt"] += 1
        self.stats["misses"] += 1
        metrics.record_miss(self.name, c.reason)
        self._drop(key, evicted=True)

    # --- remove ----------------------------------------------------------------------------
    def _forget(self, key: bytes) -> None:
        """Un-index a file without touching it."""
        e = self._lru.pop(key, None)
        if e is None:
            return
        self._used -= e.disk_bytes
        self._usage()
        self.events.lost(self.name, key)

    def _doom(self, key: bytes) -> None:
        """Remove a chunk's file. While a read holds it, the file is renamed to a unique name
        at once (a newer copy written meanwhile keeps the real name) and unlinked at the last
        unpin; otherwise it is unlinked now."""
        path = self.path_of(key)
        if self.pins.pinned(key):
            doomed = f"{path}.gone.{os.urandom(4).hex()}"
            try:
                os.rename(path, doomed)  # open descriptors keep reading the old file
            except FileNotFoundError:
                return
            self.pins.defer(key, lambda: _unlink(doomed))
        else:
            _unlink(path)

    def _drop(self, key: bytes, *, evicted: bool = False, report: bool = True) -> None:
        e = self._lru.pop(key, None)
        if e is None:
            return
        self._used -= e.disk_bytes
        if evicted:
            self.stats["evicted"] += 1
        self._doom(key)
        self._usage()
        if report:
            self.events.lost(self.name, key)

    async def remove(self, key: bytes) -> Removal:
        """Delete a chunk's file (renamed now, unlinked when the reads holding it finish)."""
        e = self._lru.pop(key, None)
        if e is None:
            return Removal.ABSENT
        self._used -= e.disk_bytes
        if self.pins.pinned(key):
            self._doom(key)
        else:
            await self._run(_unlink, self.path_of(key))
        self._usage()
        return Removal.GONE


def _address(view: memoryview) -> int:
    """Start address of a writable buffer (to test O_DIRECT alignment)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
