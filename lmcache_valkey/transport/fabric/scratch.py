"""Registered areas for buffers that are not registered themselves: a small scratch in fixed
slots (the store's chunk header), and a bounce area for whole values (one-region dialects).

A slot goes back to the pool only when the transfer that used it is over (the
transport's ``over`` hook), never when the caller gives up; with no slot free the caller
falls back to the bulk path for that operation. Knows nothing of RESP or keys.
"""

from __future__ import annotations

from .endpoint import FabricEndpoint, MemoryRegion

SLOT_BYTES = 4096


class ScratchPool:
    def __init__(self, endpoint: FabricEndpoint, total_bytes: int, slot_bytes: int = SLOT_BYTES) -> None:
        self.slot_bytes = slot_bytes
        nslots = max(1, total_bytes // slot_bytes)
        self._mem = bytearray(nslots * slot_bytes)
        self.region: MemoryRegion = endpoint.register_buffer(self._mem)
        self._view = memoryview(self._mem)
        self._free = list(range(nslots - 1, -1, -1))
        self.exhausted = 0  # times a caller found no slot (counted fallback)

    def take(self, nbytes: int) -> tuple[int, memoryview] | None:
        if nbytes > self.slot_bytes or not self._free:
            if nbytes <= self.slot_bytes:
                self.exhausted += 1
            return None
        i = self._free.pop()
        return i, self._view[i * self.slot_bytes : i * self.slot_bytes + nbytes]

    def give(self, index: int) -> None:
        self._free.append(index)

    @property
    def free(self) -> int:
        return len(self._free)


class BouncePool:
    """A registered area that a value moves through whole when a dialect takes one region per
    command (Momento's DMA dialect) and the value is not one registered range (the store's
    header before LMCache's payload): extents of any size, first fit, merged when given back.
    A value that finds no room takes the bulk path instead."""

    def __init__(self, endpoint: FabricEndpoint, total_bytes: int) -> None:
        self._mem = bytearray(total_bytes)
        self.region: MemoryRegion = endpoint.register_buffer(self._mem)
        self._view = memoryview(self._mem)
        self._free: list[tuple[int, int]] = [(0, total_bytes)]  # (offset, length), by offset
        self._sizes: dict[int, int] = {}  # offset of an extent handed out -> its length
        self.exhausted = 0

    def take(self, nbytes: int) -> tuple[int, memoryview] | None:
        if nbytes <= 0:  # an empty extent would share its offset with the next one
            raise ValueError(f"a bounce extent holds at least one byte, not {nbytes}")
        for i, (off, n) in enumerate(self._free):
            if n >= nbytes:
                if n == nbytes:
                    del self._free[i]
                else:
                    self._free[i] = (off + nbytes, n - nbytes)
                self._sizes[off] = nbytes
                return off, self._view[off : off + nbytes]
        self.exhausted += 1
        return None

    def give(self, off: int) -> None:
        n = self._sizes.pop(off)
        free = self._free
        i = 0
        while i < len(free) and free[i][0] < off:
            i += 1
        free.insert(i, (off, n))
        # merge with the next extent, then with the previous one
        if i + 1 < len(free) and off + n == free[i + 1][0]:
            free[i] = (off, n + free[i + 1][1])
            del free[i + 1]
        if i > 0 and free[i - 1][0] + free[i - 1][1] == off:
            free[i - 1] = (free[i - 1][0], free[i - 1][1] + free[i][1])
            del free[i]

    @property
    def free_bytes(self) -> int:
        return sum(n for _, n in self._free)
