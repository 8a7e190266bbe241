"""The vLLM tier over libfabric RMA: vLLM's primary CPU tier is registered once and the
server writes loads into it / reads stores from it directly, byte-exact."""

from __future__ import annotations

import pytest
from vllmhelp import Layout, block_bytes, keys

pytestmark = pytest.mark.timeout(180)

FABRIC = {"transport": "fabric", "fabric_provider": "tcp;ofi_rxm"}


@pytest.mark.parametrize("block_kib", [64, 2048])
def test_blocks_move_by_rma_with_the_primary_tier_registered_once(blob_server, engines, block_kib) -> None:
    layout = Layout(worker_block_bytes=block_kib << 10)
    writer = engines(blob_server.url, layout=layout, tier_settings=FABRIC, cpu_blocks=16)
    reader = engines(blob_server.url, layout=layout, tier_settings=FABRIC, cpu_blocks=16)
    transports = [e.tier._session.store.transport for e in (writer, reader)]
    assert [e.tier._session.transport_name for e in (writer, reader)] == ["fabric", "fabric"]
    regions = [len(t.endpoint._regions) for t in transports]
    for t, e in zip(transports, (writer, reader)):  # the whole primary tier, in one region
        flat = e.view.cast("B")
        try:
            addr, n = t.endpoint.address_of(flat)
        finally:
            flat.release()
        assert t.endpoint.find_region(addr, n) is not None

    ks = keys(f"rma {block_kib}", 6)
    writer.offload(ks)
    assert reader.fetch(ks) == [block_bytes(k, writer.block_size) for k in ks]

    assert [len(t.endpoint._regions) for t in transports] == regions  # nothing registered per transfer
    assert all(t.stats["bulk_fallbacks"] == 0 for t in transports)  # RMA, not the TCP fallback
    info = blob_server.cmd("INFO", "lmcvblob").decode()
    xfers_ok = int(next(line.split(":")[1] for line in info.splitlines() if line.startswith("lmcvblob_xfers_ok:")))
    assert xfers_ok >= 2 * len(ks)  # the server moved every block by RMA (a store and a load each)
