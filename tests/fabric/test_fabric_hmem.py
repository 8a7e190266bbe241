"""The FI_HMEM code path as far as a machine without a GPU can take it: an endpoint opened
with FI_HMEM (shm is the provider that offers it here) registers host memory and moves
values through the endpoint; CUDA registration itself is untested without a GPU."""

from __future__ import annotations

import os

import pytest

from lmcache_valkey.errors import FabricUnavailable
from lmcache_valkey.transport.fabric import FabricEndpoint, FabricTransport

MiB = 1 << 20


async def test_hmem_endpoint_moves_host_memory(start_server):
    srv = start_server("shm")

    async with FabricTransport("127.0.0.1", srv.port, provider="shm", hmem=True) as t:
        assert t.endpoint.mr_mode & 0x400  # FI_MR_HMEM reported and honoured
        arena = bytearray(8 * MiB)
        t.register_buffer(arena)
        mv = memoryview(arena)
        mv[: 4 * MiB] = os.urandom(4 * MiB)
        await t.set_from(b"k", [mv[: 4 * MiB]], None, 10)
        assert await t.get_into(b"k", [mv[4 * MiB :]], 10) == 4 * MiB
        assert mv[: 4 * MiB] == mv[4 * MiB :]



def test_cuda_registration_needs_an_hmem_endpoint(module_so):
    with FabricEndpoint("tcp;ofi_rxm") as ep:
        with pytest.raises(FabricUnavailable, match="hmem=True"):
            ep.register(0x1000, 4096, cuda_device=0)
