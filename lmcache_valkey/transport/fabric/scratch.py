"""A small registered scratch area for buffers that are not registered themselves (the
store's chunk header), handed out in fixed slots.

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
