"""Memory with no Python buffer over it (a CUDA allocation) is named by address with a
RawSpan. On a machine without a GPU the same path is taken with host memory registered
by address, exactly as a CUDA allocation is, less the FI_HMEM interface flag
(benchmarks/gpu_check.sh runs it on CUDA memory)."""

from __future__ import annotations

import ctypes
import os

import pytest

from lmcache_valkey.errors import FabricUnavailable
from lmcache_valkey.transport.fabric import FabricTransport, RawSpan, UnregisteredBuffer

MiB = 1 << 20


def raw_buffer(n: int) -> tuple[ctypes.Array, int]:
    """Memory known to the transport by its address only, as a CUDA allocation is."""
    buf = (ctypes.c_char * n)()
    return buf, ctypes.addressof(buf)


@pytest.mark.parametrize("size", [4 * MiB, 32 * MiB])
async def test_raw_spans_move_by_rma_byte_exact(start_server, size):
    srv = start_server("tcp;ofi_rxm")
    src, src_addr = raw_buffer(size)
    dst, dst_addr = raw_buffer(size)
    payload = os.urandom(size)
    ctypes.memmove(src_addr, payload, size)

    async with FabricTransport("127.0.0.1", srv.port, provider="tcp;ofi_rxm", verify_crc=True) as t:
        t.register(src_addr, size)
        t.register(dst_addr, size)
        await t.set_from(b"gpu-chunk", [RawSpan(src_addr, size, owner=src)], None, 20)
        assert await t.get_into(b"gpu-chunk", [RawSpan(dst_addr, size, owner=dst)], 20) == size

    assert ctypes.string_at(dst_addr, size) == payload
    info = srv.info()
    assert info["rma_sets"] == 1 and info["rma_gets"] == 1 and info["bulk_gets"] == 0


async def test_a_raw_span_outside_every_registration_is_refused(start_server):
    srv = start_server("tcp;ofi_rxm")
    buf, addr = raw_buffer(4096)
    async with FabricTransport("127.0.0.1", srv.port, provider="tcp;ofi_rxm") as t:
        t.register(addr, 1024)
        with pytest.raises(UnregisteredBuffer, match="RawSpan"):
            await t.set_from(b"k", [RawSpan(addr, 4096, owner=buf)], None, 5)
        with pytest.raises(UnregisteredBuffer, match="RawSpan"):
            await t.get_into(b"k", [RawSpan(addr + 1024, 8, owner=buf)], 5)


async def test_raw_spans_need_the_rma_path(start_server):
    srv = start_server("tcp;ofi_rxm")
    buf, addr = raw_buffer(64)
    async with FabricTransport("127.0.0.1", srv.port, data_path="bulk") as t:
        with pytest.raises(FabricUnavailable, match="RMA only"):
            await t.set_from(b"k", [RawSpan(addr, 64, owner=buf)], None, 5)
        with pytest.raises(FabricUnavailable, match="RMA only"):
            await t.get_into(b"k", [RawSpan(addr, 64, owner=buf)], 5)

