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


def test_a_load_from_a_paused_server_is_reported_only_once_the_server_can_no_longer_write(blob_server) -> None:
    """vLLM reuses a failed promotion's slots as soon as the tier reports the job: by then no
    late RMA write from the server may land in them, even when it resumes afterwards."""
    import os
    import signal
    import time

    from vllmhelp import BLOCK, Harness

    h = Harness(blob_server.url, op_timeout_s=1.0, lookup_timeout_s=0.5, **FABRIC)
    try:
        assert h.tier._session.transport_name == "fabric"
        ks = keys("paused", 4)
        h.store(ks, [0, 1, 2, 3])
        os.kill(blob_server.pid, signal.SIGSTOP)
        try:
            (r,) = h.load(ks, [4, 5, 6, 7])
            assert not r.success
            pattern = b"\xa5" * BLOCK
            for i in (4, 5, 6, 7):  # vLLM hands the slots to other blocks
                h.fill(i, pattern)
        finally:
            os.kill(blob_server.pid, signal.SIGCONT)
        time.sleep(1.0)  # the resumed server would write now, if it still could
        assert all(h.slot(i) == pattern for i in (4, 5, 6, 7))
    finally:
        h.close()
