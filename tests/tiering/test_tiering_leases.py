"""Leases (an engine's lookup-and-lock): a leased chunk stays loadable until released.

Real Valkey, a real NVMe directory; the service placement through a real tierd.
"""

from __future__ import annotations

import asyncio
import os
import time

import pytest
from tierhelp import chunk, ram_get, resp_client, tiering

from lmcache_valkey.tiering import EmbeddedTierClient, RemoteTierClient, TierManager

pytestmark = pytest.mark.timeout(120)


async def _manager(valkey, ts):
    client = await resp_client(valkey)
    m = TierManager(client.settings, ts, client)
    await m.start(background=False)
    return m, client


async def _put(m, client, items) -> None:
    for key, value in items:
        await client.set(key, [value], ttl_s=None, timeout=5.0)
        m.note_put(key, len(value))
    assert await m.flush(10.0)


async def test_a_leased_ram_copy_is_not_demoted_until_released(small_valkey, nvme_dir) -> None:
    m, client = await _manager(small_valkey, tiering(nvme_dir=nvme_dir, demote_idle_s=1.0))
    try:
        items = [chunk(i, 50_000) for i in range(3)]
        await _put(m, client, items)
        keys = [k for k, _ in items]
        tiers = EmbeddedTierClient(m)
        await tiers.lease([keys[0]], 60.0)
        await asyncio.sleep(1.2)  # OBJECT IDLETIME has 1 s resolution
        assert await m.demote_once() == 2
        assert await client.exists_many(keys, timeout=5.0) == [True, False, False]
        await tiers.release([keys[0]])
        assert await m.demote_once() == 1
        assert await client.exists_many(keys, timeout=5.0) == [False, False, False]
    finally:
        await m.close()
        await client.close()



async def test_a_leased_nvme_copy_is_not_evicted_for_space_and_a_delete_waits_for_the_release(small_valkey, nvme_dir) -> None:
    size = 100_000
    m, client = await _manager(small_valkey, tiering(nvme_dir=nvme_dir, nvme_budget_bytes=3 * (size + 8192)))
    try:
        first = chunk(0, size)
        await _put(m, client, [first])
        m.lease([first[0]], 60.0)
        await _put(m, client, [chunk(i, size) for i in range(1, 6)])  # more than the budget holds
        assert m.ledger.tiers_of(first[0]) == ["nvme"], "the leased copy was evicted for space"
        await m.evict("ram", keys=[first[0]])
        assert await m.promote(first[0], timeout=10.0)
        assert await ram_get(client, first[0], len(first[1])) == first[1]
        # a delete while leased: RAM and marker go at once, the NVMe file at the release
        path = m.tier("nvme").path_of(first[0])
        await m.delete([first[0]])
        assert not await m.promote(first[0], timeout=5.0)
        gone = [p for p in os.listdir(os.path.dirname(path)) if ".gone." in p]
        assert gone, "a leased copy's file must stay until the release"
        m.release([first[0]])
        assert not [p for p in os.listdir(os.path.dirname(path)) if ".gone." in p]
        assert m.stats()["leases"] == 0
    finally:
        await m.close()
        await client.close()



async def test_a_lease_its_holder_never_releases_ends_at_its_deadline(small_valkey, nvme_dir) -> None:
    m, client = await _manager(small_valkey, tiering(nvme_dir=nvme_dir))
    try:
        (k, v), = [chunk(1, 50_000)]
        await _put(m, client, [(k, v)])
        m.lease([k], 0.2)
        m.lease([k], 0.2)  # counted: two holders
        assert m.leases.leased(k) and m.tier("nvme").pins.pinned(k)
        m.release([k])
        assert m.leases.leased(k)
        time.sleep(0.3)
        assert not m.leases.leased(k)
        assert m.leases.expire() == 1
        assert not m.tier("nvme").pins.pinned(k) and m.stats()["leases"] == 0
        m.release([k])  # a late release of an expired lease is harmless
    finally:
        await m.close()
        await client.close()



async def test_leases_reach_tierd_through_the_hint_list(small_valkey, nvme_dir, moto_s3) -> None:
    from test_tiering_service import _args, _start_tierd

    from lmcache_valkey.tiering.tierd import tier_stats

    from lmcache_valkey.tiering.object_store import ObjectTier
    from lmcache_valkey.tiering.settings import tiering_settings_from_mapping

    o = ObjectTier(tiering_settings_from_mapping({"s3_bucket": moto_s3.bucket, "s3_endpoint_url": moto_s3.url}))
    await o.start()
    await o.create_bucket()
    await o.close()
    task, stop = await _start_tierd(_args(small_valkey, nvme_dir, moto_s3))
    client = await resp_client(small_valkey)
    tc = RemoteTierClient(client, client.settings)
    keys = [chunk(i, 1000)[0] for i in range(3)]
    try:
        await tc.lease(keys, 30.0)
        await tc.release(keys[:1])
        await tc.flush_hints()

        async def leases() -> int:
            return (await tier_stats(tc))["leases"]

        end = time.monotonic() + 20
        while await leases() != 2:
            assert time.monotonic() < end, "leases did not reach tierd"
            await asyncio.sleep(0.1)
        await tc.release(keys[1:])
        await tc.flush_hints()
        while await leases() != 0:
            assert time.monotonic() < end, "releases did not reach tierd"
            await asyncio.sleep(0.1)
    finally:
        await tc.close()
        stop.set()
        await asyncio.wait_for(task, 30)
        await client.close()



async def test_tierd_holds_a_bounded_number_of_leases_per_tenant(small_valkey, nvme_dir, moto_s3) -> None:
    """A tenant's workers cannot make tierd keep lease entries without bound (a worker that
    leases and never releases, or a flood of lease hints): past ``max_leases`` new leases are
    refused and counted; releases and deadlines make room again."""
    from test_tiering_service import _args, _start_tierd

    from lmcache_valkey.tiering.tierd import tier_stats

    args = _args(small_valkey, nvme_dir, moto_s3)
    args.set.append("max_leases=100")
    task, stop = await _start_tierd(args)
    client = await resp_client(small_valkey)
    tc = RemoteTierClient(client, client.settings)
    keys = [chunk(i, 1000)[0] for i in range(1000)]
    try:
        await tc.lease(keys, 600.0)
        await tc.flush_hints()
        end = time.monotonic() + 20
        while (st := await tier_stats(tc))["manager"]["leases_refused"] < 900:
            assert time.monotonic() < end, st["manager"]
            await asyncio.sleep(0.1)
        assert st["leases"] == 100
        await tc.release(keys[:100])
        await tc.flush_hints()  # (a batch applies its leases before its releases)
        await tc.lease(keys[100:150], 600.0)  # room again
        await tc.flush_hints()
        end = time.monotonic() + 20
        while (await tier_stats(tc))["leases"] != 50:
            assert time.monotonic() < end, "releases did not make room"
            await asyncio.sleep(0.1)
    finally:
        await tc.close()
        stop.set()
        await asyncio.wait_for(task, 30)
        await client.close()

