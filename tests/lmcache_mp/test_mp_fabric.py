"""MP mode over libfabric (tcp;ofi_rxm): the server fi_writes loads straight into LMCache's L1
arena, which the adapter registered once from the factory's L1 memory descriptor."""

from __future__ import annotations

import pytest
from mphelp import CHUNK_BYTES, T1, adapter_of, keys, prefetch, read, wait_stored, want, write

pytestmark = pytest.mark.timeout(180)


def test_loads_land_in_the_registered_l1_arena_by_rma(blob_server, managers):
    params = {"url": blob_server.url, **T1, "transport": "fabric", "fabric_provider": "tcp;ofi_rxm"}
    writer, reader = managers(params), managers(params)
    for sm in (writer, reader):
        adapter = adapter_of(sm)
        assert adapter.store.transport_name == "fabric"
        desc = sm.l1_memory_desc
        # the whole L1 arena is one registration: every L1 object lies inside it
        assert adapter.store.transport.endpoint.find_region(desc.ptr, desc.stable_registration_size or desc.size)
    ks, seeds = keys(range(6)), range(30, 36)
    write(writer, ks, seeds)
    wait_stored(writer, 6 * CHUNK_BYTES)
    r = prefetch(reader, ks)
    assert r.l2_hit_count == 6
    assert read(reader, ks) == want(seeds)
    for sm in (writer, reader):
        stats = adapter_of(sm).store.transport.stats
        assert stats.get("bulk_fallbacks", 0) == 0, stats  # every payload moved by RMA
        assert stats.get("quarantined", 0) == 0, stats
