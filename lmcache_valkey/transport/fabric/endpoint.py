"""Client-side libfabric endpoint: RDM endpoint/AV/CQ for one provider, memory
registration, and the progress thread.

The client is the RMA *target*: the server's fi_write/fi_read land in or come from memory
registered here. The progress thread parks in ``fi_cq_sread`` (the cffi call releases the
GIL) so manual-progress providers keep moving without a spinning thread; it also reaps
completions of operations this side initiates (the raw-bandwidth benchmark).
Never speaks RESP; knows nothing of keys (docs/fabric-threading.md).
"""

from __future__ import annotations

import logging
import secrets
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from lmcache_valkey.errors import FabricUnavailable, TransportError

from .binding import load

log = logging.getLogger(__name__)

PROVIDERS = ("tcp;ofi_rxm", "sockets", "shm", "efa", "verbs;ofi_rxm")
_PROGRESS_WAIT_MS = 100
_POLL_MIN_US = 20
_POLL_MAX_US = 1000
# The longest string address accepted from a peer (the reference module keeps 256 bytes).
MAX_STR_ADDR = 256


class FabricError(TransportError):
    """A libfabric call failed on this side (registration, posting, address insert)."""


@dataclass
class MemoryRegion:
    """One registration: [addr, addr+length) is readable/writable by peers holding ``key``."""

    addr: int
    length: int
    key: int
    desc: Any  # cdata void*: local descriptor for operations this side initiates
    virt_addr: bool  # FI_MR_VIRT_ADDR: peers address by virtual address, else by offset
    cuda_device: int | None
    _mr: Any = field(repr=False, default=None)
    _owner: Any = field(repr=False, default=None)  # keeps a registered Python buffer alive

    def contains(self, addr: int, length: int) -> bool:
        return self.addr <= addr and addr + length <= self.addr + self.length

    def remote_addr(self, addr: int) -> int:
        """The address a peer must use for local ``addr`` (honours FI_MR_VIRT_ADDR)."""
        return addr if self.virt_addr else addr - self.addr


class FabricEndpoint:
    """An open RDM endpoint plus its progress thread. Thread-safe (FI_THREAD_SAFE)."""

    def __init__(self, provider: str = "tcp;ofi_rxm", node: str | None = "127.0.0.1", *, hmem: bool = False) -> None:
        self._ffi, self._lib = load()
        ffi, lib = self._ffi, self._lib
        err = ffi.new("char[512]")
        # shm names its endpoints itself (an IP as its node would make processes collide)
        # and efa picks a device, not an IP: only IP-based providers get the node.
        use_node = node if node and not provider.startswith(("shm", "efa")) else None
        ep = lib.lmcv_ep_open(provider.encode(), use_node.encode() if use_node else ffi.NULL, int(hmem), err, 512)
        if ep == ffi.NULL:
            raise FabricUnavailable(f"cannot open libfabric provider {provider!r}: {ffi.string(err).decode()}")
        self._ep = ep
        self.provider = ffi.string(lib.lmcv_ep_provider(ep)).decode()
        self.mr_mode = int(lib.lmcv_ep_mr_mode(ep))
        self.max_msg_size = int(lib.lmcv_ep_max_msg(ep))
        self.delivery_complete = bool(lib.lmcv_ep_delivery_complete(ep))
        self.waitable = bool(lib.lmcv_ep_waitable(ep))
        # FI_ADDR_STR (shm): addresses are names of varying length ("fi_shm://<pid>:..."),
        # not fixed-size binary records.
        self.addr_is_str = bool(lib.lmcv_ep_addr_is_str(ep))
        self.hmem = hmem
        buf, n = ffi.new("char[512]"), ffi.new("size_t *", 512)
        rc = lib.lmcv_ep_name(ep, buf, n)
        if rc:
            lib.lmcv_ep_close(ep)
            raise FabricUnavailable(f"fi_getname: {self.strerror(rc)}")
        self.name: bytes = ffi.buffer(buf, n[0])[:]
        self._regions: list[MemoryRegion] = []
        self._peers: dict[bytes, int] = {}
        self._callbacks: dict[int, tuple[Callable[[int], None], Any]] = {}
        self._lock = threading.Lock()
        # Held around every C call that uses the endpoint once it may be closed from another
        # thread (a revoked link closes in an executor while the loop may still touch it).
        self._ep_lock = threading.Lock()
        self._closing = False
        self._thread = threading.Thread(target=self._progress, name=f"fabric-progress-{self.provider}", daemon=True)
        self._thread.start()

    # -- memory -------------------------------------------------------------------------

    def register(self, addr: int, length: int, *, cuda_device: int | None = None, owner: Any = None) -> MemoryRegion:
        """Registers [addr, addr+length) once for remote read/write (host, or CUDA with FI_HMEM).

        The CUDA path needs an endpoint opened with ``hmem=True`` on a provider offering
        FI_HMEM; it is coded but untested here (no GPU in CI)."""
        if length <= 0:
            raise ValueError("length must be positive")
        if cuda_device is not None and not self.hmem:
            raise FabricUnavailable("CUDA registration needs FabricEndpoint(..., hmem=True) on an FI_HMEM provider")
        ffi, lib = self._ffi, self._lib
        mr, key, desc = ffi.new("struct fid_mr **"), ffi.new("uint64_t *"), ffi.new("void **")
        iface = 1 if cuda_device is not None else 0
        # Remote keys are the only secret between a peer and this memory (addresses are often
        # offsets from 0): ask for a random 64-bit key. Providers with FI_MR_PROV_KEY pick
        # their own (docs/security.md). A collision with a key in use is retried.
        for _ in range(8):
            with self._ep_lock:
                if self._ep is None:
                    raise FabricError("the endpoint is closed")
                rc = lib.lmcv_mr_reg(self._ep, ffi.cast("void *", addr), length, iface, cuda_device or 0,
                                     secrets.randbits(64), mr, key, desc)
            if rc != -lib.FI_ENOKEY:
                break
        if rc:
            raise FabricError(f"fi_mr_reg({length} bytes at {addr:#x}): {self.strerror(rc)}")
        region = MemoryRegion(addr, length, int(key[0]), desc[0], bool(self.mr_mode & lib.FI_MR_VIRT_ADDR), cuda_device, mr[0], owner)
        with self._lock:
            self._regions.append(region)
        return region

    def register_buffer(self, buf: Any) -> MemoryRegion:
        """Registers a writable Python buffer (bytearray, memoryview, numpy array...)."""
        mv = memoryview(buf).cast("B")  # pins buf's memory (no resize) while registered
        addr, n = self.address_of(mv)
        if mv.readonly:
            raise ValueError("register_buffer needs a writable buffer")
        return self.register(addr, n, owner=mv)

    def deregister(self, region: MemoryRegion) -> None:
        with self._lock:
            if region in self._regions:
                self._regions.remove(region)
            else:
                return
        with self._ep_lock:
            if self._ep is not None:
                self._lib.lmcv_mr_close(region._mr)
        _release_owner(region)

    def regions(self) -> list[MemoryRegion]:
        with self._lock:
            return list(self._regions)

    def find_region(self, addr: int, length: int) -> MemoryRegion | None:
        with self._lock:
            for r in self._regions:
                if r.contains(addr, length):
                    return r
        return None

    def address_of(self, buf: Any) -> tuple[int, int]:
        """(address, length) of a Python buffer, read-only buffers included. The caller
        keeps ``buf`` itself referenced: a memoryview pins its exporter's memory. The
        cffi view is released at once, because a cffi buffer export left to the cycle
        collector can outlive the memoryview it points to (a crash we hit)."""
        with self._ffi.from_buffer(buf) as cdata:
            return int(self._ffi.cast("uintptr_t", cdata)), len(cdata)

    # -- peers and initiator-side operations (benchmark, tests) ---------------------------

    def peer_name(self, name: bytes) -> bytes:
        """A peer's address (from the wire) as the provider may be handed it, or ValueError.
        The provider reads an address of its own format's shape: a binary one our name's
        length; a string one up to its NUL, so it must be one printable name of our scheme
        ("fi_shm://..."), returned with exactly one NUL (one peer, one address-vector entry,
        whatever padding the wire added)."""
        if self.addr_is_str:
            text = name.rstrip(b"\0")
            scheme = self.name.split(b"://", 1)[0] + b"://"
            printable = bool(text) and all(0x20 <= c < 0x7F for c in text)
            if not printable or len(text) == len(name) or len(name) > MAX_STR_ADDR or not text.startswith(scheme):
                raise ValueError(f"a fabric address of {len(name)} bytes that is not one NUL-terminated "
                                 f"printable {scheme.decode()} name")
            return text + b"\0"
        if len(name) < len(self.name):
            raise ValueError(f"a fabric address of {len(name)} bytes (ours: {len(self.name)})")
        return name

    def add_peer(self, name: bytes) -> int:
        with self._lock:
            if name in self._peers:
                return self._peers[name]
        out = self._ffi.new("uint64_t *")
        with self._ep_lock:
            if self._ep is None:
                raise FabricError("the endpoint is closed")
            rc = self._lib.lmcv_ep_av_insert(self._ep, name, out)
        if rc:
            raise FabricError(f"fi_av_insert: {self.strerror(rc)}")
        with self._lock:
            self._peers[name] = int(out[0])
        return int(out[0])

    def post(self, op: str, local_addr: int, length: int, region: MemoryRegion, peer: int, raddr: int, rkey: int,
             done: Callable[[int], None]) -> bool:
        """Posts one fi_write ("write") or fi_read ("read"); ``done(err)`` runs on the progress
        thread. Returns False when the provider queue is full (try again later)."""
        # A real fi_context2-sized block per op: providers with FI_CONTEXT(2) mode write
        # into it. Its address identifies the completion.
        ctx = self._ffi.new("char[64]")
        cid = int(self._ffi.cast("uintptr_t", ctx))
        with self._lock:
            self._callbacks[cid] = (done, ctx)
        fn = self._lib.lmcv_ep_write if op == "write" else self._lib.lmcv_ep_read
        with self._ep_lock:
            if self._ep is None:
                raise FabricError("the endpoint is closed")
            rc = fn(self._ep, self._ffi.cast("void *", local_addr), length, region.desc, peer, raddr, rkey, ctx)
        if rc == 0:
            return True
        with self._lock:
            self._callbacks.pop(cid, None)
        if rc == -self._lib.FI_EAGAIN:
            return False
        raise FabricError(f"fi_{op}: {self.strerror(rc)}")

    # -- progress and teardown -----------------------------------------------------------

    def _progress(self) -> None:
        ffi, lib = self._ffi, self._lib
        ctxs, errs = ffi.new("void *[64]"), ffi.new("int[64]")
        backoff_us = _POLL_MIN_US
        while not self._closing:
            # Waitable CQ: park in fi_cq_sread. Poll-only (shm): sleep with a back-off that
            # resets on activity, so an idle endpoint wakes ~1000x/s at most.
            timeout = _PROGRESS_WAIT_MS if self.waitable else -backoff_us
            n = lib.lmcv_ep_wait(self._ep, timeout, ctxs, errs, 64)
            backoff_us = _POLL_MIN_US if n > 0 or self._callbacks else min(backoff_us * 2, _POLL_MAX_US)
            if n < 0:
                log.warning("fabric progress: %s", self.strerror(n))
                continue
            for i in range(n):
                cid = int(ffi.cast("uintptr_t", ctxs[i]))
                with self._lock:
                    entry = self._callbacks.pop(cid, None)
                if entry is not None:
                    try:
                        entry[0](int(errs[i]))
                    except Exception:  # a callback bug must not kill progress
                        log.exception("fabric completion callback failed")

    def strerror(self, rc: int) -> str:
        return self._ffi.string(self._lib.lmcv_strerror(rc)).decode()

    @property
    def closed(self) -> bool:
        return self._ep is None

    def close(self) -> None:
        """Stops the progress thread, deregisters every region and closes the endpoint.

        When it returns, no peer can reach memory registered here any more: the keys are
        gone and so are the endpoint's connections, so a write still queued at a peer (a
        paused server) fails at the peer instead of landing (docs/fabric-buffer-ownership.md)."""
        if self._closing:
            return
        self._closing = True
        self._lib.lmcv_ep_signal(self._ep)
        self._thread.join()
        with self._lock:
            regions, self._regions = self._regions, []
        with self._ep_lock:
            for r in regions:
                self._lib.lmcv_mr_close(r._mr)
            self._lib.lmcv_ep_close(self._ep)
            self._ep = None
        for r in regions:
            _release_owner(r)

    def __enter__(self) -> "FabricEndpoint":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _release_owner(region: MemoryRegion) -> None:
    # Deregistered: the memoryview pinning a registered Python buffer may go now.
    owner, region._owner = region._owner, None
    if isinstance(owner, memoryview):
        try:
            owner.release()
        except BufferError:  # someone still exports it; it goes with its last reference
            pass
