"""The bounce area hands out extents of any size from one registered buffer, never two that
overlap, and takes them back merged, so a long run of mixed sizes does not fragment it away."""

from __future__ import annotations

import random

from lmcache_valkey.transport.fabric import FabricEndpoint
from lmcache_valkey.transport.fabric.scratch import BouncePool


def test_extents_never_overlap_and_come_back_whole():
    ep = FabricEndpoint("tcp;ofi_rxm", "127.0.0.1")
    try:
        pool = BouncePool(ep, 1 << 20)
        assert ep.find_region(*ep.address_of(pool.take(4096)[1])) is not None  # registered memory
        pool.give(0)
        rng = random.Random(7)
        held: dict[int, int] = {}
        for _ in range(2000):
            if held and (rng.random() < 0.5 or pool.free_bytes < 64 << 10):
                off = rng.choice(list(held))
                pool.give(off)
                del held[off]
            else:
                n = rng.randrange(1, 64 << 10)
                got = pool.take(n)
                if got is None:
                    continue
                off, view = got
                assert len(view) == n
                for o, m in held.items():
                    assert off + n <= o or o + m <= off, "two extents overlap"
                held[off] = n
        for off in list(held):
            pool.give(off)
        assert pool.free_bytes == 1 << 20
        assert pool.take(1 << 20) is not None  # merged back into one extent
        misses = pool.exhausted
        assert pool.take(1) is None and pool.exhausted == misses + 1  # counted
    finally:
        ep.close()
