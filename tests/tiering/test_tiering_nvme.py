"""NVMe tier on a real ext4 directory with O_DIRECT: round trip, rebuild, budget, ENOSPC, corruption."""

from __future__ import annotations

import asyncio
import mmap
import os
import subprocess

import pytest
from tierhelp import chunk

from lmcache_valkey import codec
from lmcache_valkey.tiering.nvme import PRELUDE, NvmeTier
from lmcache_valkey.tiering.tiers import NoEvents

pytestmark = pytest.mark.timeout(60)


class Lost(NoEvents):
    """Records the copies the tier reports lost (evicted for space, corrupt)."""

    def __init__(self) -> None:
        self.keys: list[bytes] = []

    def lost(self, tier: str, key: bytes) -> None:
        assert tier == "nvme"
        self.keys.append(key)


async def test_direct_io_round_trip_and_rebuild(nvme_dir: str) -> None:
    t = NvmeTier(nvme_dir, 64 << 20)
    await t.start()
    assert t.entries() == []
    assert t.direct, "ext4 under /tmp must accept O_DIRECT"
    items = [chunk(i, size) for i, size in enumerate([1, 4095, 4096, 100_000, 1 << 20, 3 * 4096])]
    for key, value in items:
        # split the value at an odd place: the tier gathers parts
        assert await t.write(key, [value[:100], value[100:]])
    for key, value in items:
        hdr, payload = await t.read(key)
        assert bytes(hdr) + bytes(payload) == value
        plen = len(value) - codec.HEADER_SIZE
        # Unaligned, so through a pooled buffer: one byte into a bytearray (malloc aligns its
        # data to 16 bytes, and a small one sits on a page boundary now and then).
        dest = memoryview(bytearray(plen + 1))[1:]
        h = await t.read_into(key, dest)
        assert h is not None and bytes(dest) == value[codec.HEADER_SIZE :]
        if plen % 4096 == 0:  # page-aligned, whole blocks: O_DIRECT straight into the buffer
            aligned = mmap.mmap(-1, plen)
            h = await t.read_into(key, memoryview(aligned))
            assert h is not None and aligned[:] == value[codec.HEADER_SIZE :]
    assert t.stats["zero_copy_reads"] == 3  # 4096, 1 MiB and 3 * 4096
    await t.close()
    # restart: the index comes back from the file headers alone
    t2 = NvmeTier(nvme_dir, 64 << 20)
    await t2.start()
    entries = t2.entries()
    assert sorted(e.key for e in entries) == sorted(k for k, _ in items)
    assert {e.key: e.value_len for e in entries} == {k: len(v) for k, v in items}
    key, value = items[3]
    hdr, payload = await t2.read(key)
    assert bytes(hdr) + bytes(payload) == value
    await t2.close()



async def test_crash_leftovers_removed_and_truncated_file_is_corrupt(nvme_dir: str) -> None:
    t = NvmeTier(nvme_dir, 64 << 20)
    await t.start()
    (k1, v1), (k2, v2) = chunk(1, 50_000), chunk(2, 50_000)
    assert await t.write(k1, [v1]) and await t.write(k2, [v2])
    await t.close()
    # a write that crashed before its rename, and a torn final file
    tmp = t.path_of(k1) + ".tmp.123.abcd"
    with open(tmp, "wb") as f:
        f.write(b"x" * 8192)
    with open(t.path_of(k2), "r+b") as f:
        f.truncate(PRELUDE + 4096)
    t2 = NvmeTier(nvme_dir, 64 << 20)
    await t2.start()
    entries = t2.entries()
    assert [e.key for e in entries] == [k1]
    assert t2.stats["corrupt"] == 1
    assert not os.path.exists(tmp) and not os.path.exists(t.path_of(k2))
    await t2.close()



async def test_corrupt_payload_is_counted_miss_and_removed(nvme_dir: str) -> None:
    gone = Lost()
    t = NvmeTier(nvme_dir, 64 << 20, events=gone)
    await t.start()
    key, value = chunk(7, 100_000)
    assert await t.write(key, [value])
    with open(t.path_of(key), "r+b") as f:
        f.seek(PRELUDE + 5000)
        b = f.read(1)
        f.seek(PRELUDE + 5000)
        f.write(bytes([b[0] ^ 0xFF]))
    assert await t.read(key) is None
    assert t.stats["corrupt"] == 1 and t.stats["misses"] == 1
    assert not os.path.exists(t.path_of(key)) and key not in t and gone.keys == [key]
    await t.close()



async def test_budget_evicts_lru_and_refuses_oversized(nvme_dir: str) -> None:
    gone = Lost()
    size = 60_000
    disk = PRELUDE + ((size + 4095) // 4096) * 4096
    t = NvmeTier(nvme_dir, 3 * disk, events=gone)
    await t.start()
    items = [chunk(i, size) for i in range(5)]
    for k, v in items[:3]:
        assert await t.write(k, [v])
    await t.read(items[0][0])  # 0 becomes most recently used
    for k, v in items[3:]:
        assert await t.write(k, [v])
    assert t.used_bytes <= 3 * disk
    assert gone.keys == [items[1][0], items[2][0]]
    assert t.stats["evicted"] == 2
    big_k, big_v = chunk(99, 4 * disk)
    assert not await t.write(big_k, [big_v])
    assert t.stats["refused_budget"] == 1
    # a pinned copy is not evicted: with everything pinned, admission is refused
    with t.pins.pin(items[0][0]), t.pins.pin(items[3][0]), t.pins.pin(items[4][0]):
        k5, v5 = chunk(5, size)
        assert not await t.write(k5, [v5])
    assert t.stats["refused_budget"] == 2
    await t.close()



def test_disk_full_refused_and_counted(tmp_path) -> None:
    """ENOSPC from a real (tiny tmpfs) filesystem: refused, counted, no partial file left.
    tmpfs refuses O_DIRECT, so this also covers the buffered fallback."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.decode().strip()}); budget path covers refusal")
    try:
        async def main() -> None:
            t = NvmeTier(str(mnt), 64 << 20)  # budget far above the 1 MiB filesystem
            await t.start()
            # (older kernels refuse O_DIRECT on tmpfs: the tier falls back to buffered I/O)
            ok = [await t.write(*(lambda kv: (kv[0], [kv[1]]))(chunk(i, 300_000))) for i in range(6)]
            assert ok[0] and not all(ok)
            assert t.stats["refused_enospc"] == ok.count(False)
            leftovers = [f for _, _, fs in os.walk(mnt) for f in fs if ".tmp." in f]
            assert leftovers == []
            for i, good in enumerate(ok):
                k, v = chunk(i, 300_000)
                got = await t.read(k)
                assert (got is not None) == good
                if good:
                    assert bytes(got.header) + bytes(got.payload) == v
            await t.close()

        asyncio.run(main())
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


async def test_second_tier_on_the_same_directory_fails_loudly(nvme_dir: str) -> None:
    from lmcache_valkey.tiering.nvme import NvmeDirInUse

    a = NvmeTier(nvme_dir, 1 << 30)
    await a.start()
    b = NvmeTier(nvme_dir, 1 << 30)
    try:
        with pytest.raises(NvmeDirInUse, match=nvme_dir):
            await b.start()
    finally:
        await a.close()
    c = NvmeTier(nvme_dir, 1 << 30)  # free again once the holder closed
    await c.start()
    await c.close()



async def test_removal_deferred_by_a_read_never_destroys_a_newer_copy(nvme_dir: str) -> None:
    t = NvmeTier(nvme_dir, 1 << 30)
    await t.start()
    try:
        key, value = chunk(1, 10_000)
        assert await t.write(key, [value])
        with t.pins.pin(key):  # a read holds the old copy
            assert await t.remove(key)
            assert await t.write(key, [value])  # a newer copy under the same name
        assert os.path.exists(t.path_of(key))  # the deferred removal took only the old file
        got = await t.read(key)
        assert got is not None and bytes(got.header) + bytes(got.payload) == value
        got.release()
    finally:
        await t.close()

