"""The SGLang backend over libfabric RMA: SGLang's host pool is registered once and the server
writes pages into it / reads them from it directly, one RMA triple per run of a page."""

from __future__ import annotations

import pathlib

import pytest
from sglanghelp import fill_pages, indices, keys, make_pool, page_bytes, zero_pages

from lmcache_valkey.errors import ConfigError
from support.servers import ValkeyServer

pytestmark = pytest.mark.timeout(180)

MODULE_SO = pathlib.Path(__file__).resolve().parents[2] / "endpoint" / "build" / "lmcv_blob.so"
FABRIC = {"transport": "fabric", "fabric_provider": "tcp;ofi_rxm"}


@pytest.fixture
def blob_server():
    assert MODULE_SO.exists(), "endpoint module not built (scripts/setup.sh runs make -C endpoint)"
    args = ["--loadmodule", str(MODULE_SO), "provider", "tcp;ofi_rxm", "bind", "127.0.0.1", "arena_mb", "256"]
    with ValkeyServer(args=args) as s:
        yield s


@pytest.mark.parametrize("kind, layout", [("mha", "layer_first"), ("mha", "page_first"), ("mla", "page_first_direct")])
def test_pages_move_by_rma_with_the_host_pool_registered_once(blob_server, backends, kind, layout) -> None:
    wpool, rpool = make_pool(kind, layout, layers=8), make_pool(kind, layout, layers=8)
    writer = backends(blob_server.url, pool=wpool, **FABRIC)
    reader = backends(blob_server.url, pool=rpool, **FABRIC)
    transports = [b._session.store.transport for b in (writer, reader)]
    assert [b._session.transport_name for b in (writer, reader)] == ["fabric", "fabric"]
    for t, pool in zip(transports, (wpool, rpool)):  # the whole host pool, one region
        assert t.endpoint.find_region(pool.kv_buffer.data_ptr(), pool.kv_buffer.numel() * pool.kv_buffer.element_size())
    regions = [len(t.endpoint._regions) for t in transports]

    ks = keys(5)
    want = fill_pages(wpool, [0, 4, 8, 12, 16], seed=40)
    assert all(writer.batch_set_v1(ks, indices(wpool, [0, 4, 8, 12, 16])))
    zero_pages(rpool, [20, 24, 28, 32, 36])
    assert reader.batch_get_v1(ks, indices(rpool, [20, 24, 28, 32, 36])) == [True] * 5
    assert [page_bytes(rpool, s) for s in (20, 24, 28, 32, 36)] == want

    assert [len(t.endpoint._regions) for t in transports] == regions  # nothing registered per transfer
    assert all(t.stats["bulk_fallbacks"] == 0 and t.stats["staged"] <= 2 * len(ks) for t in transports)
    info = blob_server.cmd("INFO", "lmcvblob").decode()
    xfers_ok = int(next(line.split(":")[1] for line in info.splitlines() if line.startswith("lmcvblob_xfers_ok:")))
    assert xfers_ok >= 2 * len(ks)


def test_the_fabric_transport_requires_the_zero_copy_api(blob_server, backends) -> None:
    with pytest.raises(ConfigError) as e:
        backends(blob_server.url, pool=make_pool(), interface_v1=0, **FABRIC)
    assert e.value.key == "hicache_storage_backend_extra_config.interface_v1"
