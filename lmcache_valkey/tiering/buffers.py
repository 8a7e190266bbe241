"""Reusable page-aligned buffers for the lower tiers (O_DIRECT needs alignment; reuse avoids
first-touch page faults, which cost more than the transfer itself on some VMs)."""

from __future__ import annotations

import mmap
import threading

BLOCK = 4096


class BufferPool:
    """Reusable page-aligned buffers. Fresh anonymous memory costs a page fault per page on
    first touch (more than the disk transfer on some VMs); pooled buffers are already
    faulted in. Buffers are pooled by power-of-two size up to ``max_bytes`` in total."""

    def __init__(self, max_bytes: int = 512 << 20) -> None:
        self.max_bytes = max_bytes
        self._free: dict[int, list[mmap.mmap]] = {}
        self._pooled = 0
        self._lock = threading.Lock()

    @staticmethod
    def _class(n: int) -> int:
        return max(BLOCK, 1 << (max(n, 1) - 1).bit_length())

    def acquire(self, n: int) -> mmap.mmap:
        size = self._class(n)
        with self._lock:
            lst = self._free.get(size)
            if lst:
                self._pooled -= size
                return lst.pop()
        return mmap.mmap(-1, size)

    def release(self, buf: mmap.mmap) -> None:
        size = len(buf)
        with self._lock:
            if self._pooled + size <= self.max_bytes:
                self._free.setdefault(size, []).append(buf)
                self._pooled += size
