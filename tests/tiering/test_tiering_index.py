"""tierd finds what to demote, evict and un-mark in its own indexes, never by listing the
keyspace (docs/tiering-index.md), and a restarted tierd finds them as they were."""

from __future__ import annotations

import pytest
from tierhelp import chunk, tiering

from lmcache_valkey.config import Settings
from lmcache_valkey.tiering import TierManager, protocol
from lmcache_valkey.tiering.markers import marker_of
from lmcache_valkey.transport.memory import MemoryTransport

pytestmark = pytest.mark.timeout(60)


class NoScan(MemoryTransport):
    async def scan_iter(self, match: bytes, count: int = 1000):
        raise AssertionError(f"tierd listed the keyspace: SCAN {match!r}")
        yield b""  # pragma: no cover


async def test_a_restarted_tierd_demotes_and_evicts_what_it_was_told_of_without_scan(nvme_dir):
    valkey = NoScan(Settings(tenant="t1"), maxmemory=1 << 20)
    ts = tiering(nvme_dir=nvme_dir, demote_high_watermark=0.5, demote_low_watermark=0.2)
    m = TierManager(valkey.settings, ts, valkey)
    await m.start(background=False)
    chunks = [chunk(i, 200_000) for i in range(8)]
    for k, v in chunks:
        await valkey.set(k, [v], ttl_s=None, timeout=1)
        m.note_put(k, len(v))
    assert await m.flush(10)
    await m.close()
    index = protocol.ram_index_key("lmcv", "t1")
    assert sorted(await valkey.command(b"ZRANGE", index, 0, -1, timeout=1)) == sorted(k for k, _ in chunks)

    m2 = TierManager(valkey.settings, ts, valkey)  # a restart: only Valkey and the NVMe dir remain
    await m2.start(background=False)
    try:
        assert await m2.demote_once() >= 5  # 1.6 MB against 1 MiB, down to 20 %
        left = await valkey.command(b"ZRANGE", index, 0, -1, timeout=1)
        in_ram = [k for k, _ in chunks if (await valkey.exists_many([k], timeout=1))[0]]
        assert sorted(left) == sorted(in_ram)  # demoted copies leave the index
        # a chunk that vanished from RAM under tierd leaves the index at the next pass
        await valkey.delete(in_ram[:1], timeout=1)
        await m2.demoter.candidates()
        assert in_ram[0] not in await valkey.command(b"ZRANGE", index, 0, -1, timeout=1)
        # evict of a namespace from RAM: what the index and the ledger name
        assert await m2.evict("ram", prefix=chunks[0][0].rpartition(b":c:")[0] + b":c:") == len(in_ram) - 1
        assert await valkey.command(b"ZRANGE", index, 0, -1, timeout=1) == []
        assert valkey.calls.get("SCAN", 0) == 0
    finally:
        await m2.close()


async def test_the_marker_repair_removes_markers_it_wrote_after_a_restart(nvme_dir, tmp_path):
    valkey = NoScan(Settings(tenant="t1"))
    m = TierManager(valkey.settings, tiering(nvme_dir=nvme_dir), valkey)
    await m.start(background=False)
    key, value = chunk(1, 50_000)
    await valkey.set(key, [value], ttl_s=None, timeout=1)
    m.note_put(key, len(value))
    assert await m.flush(10) and await valkey.exists_many([marker_of(key)], timeout=1) == [True]
    await m.close()
    for f in (tmp_path / "nvme").rglob("*"):  # the NVMe copy is lost while tierd is down
        if f.is_file():
            f.unlink()
    m2 = TierManager(valkey.settings, tiering(nvme_dir=nvme_dir), valkey)
    await m2.start(background=False)
    try:
        await m2.repair_markers()
        assert await valkey.exists_many([marker_of(key)], timeout=1) == [False]  # no phantom prefix hit
        assert await valkey.command(b"ZRANGE", protocol.marker_index_key("lmcv", "t1"), 0, -1, timeout=1) == []
        assert valkey.calls.get("SCAN", 0) == 0
    finally:
        await m2.close()
