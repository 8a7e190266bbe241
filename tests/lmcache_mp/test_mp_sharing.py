"""Through LMCache's MP storage manager: chunks one MP instance stores, another loads, byte-exact.

Each StorageManager is one LMCache MP server (its own L1 arena, store and prefetch
controllers); our adapter is loaded from the ``--l2-adapter`` plugin JSON, as
``lmcache server`` loads it.
"""

from __future__ import annotations

import pytest
from mphelp import CHUNK_BYTES, T1, T2, adapter_of, keys, prefetch, read, wait_for, wait_stored, want, write

# A callback that raises where nothing can catch it (a load's release callback on a closed
# loop, "Event loop is closed") fails the test instead of passing as a logged warning.
pytestmark = [pytest.mark.timeout(180), pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")]


def _share(managers, params):
    writer, reader = managers(params), managers(params)
    ks, seeds = keys(range(8)), list(range(100, 108))
    write(writer, ks, seeds)
    wait_stored(writer, 8 * CHUNK_BYTES)
    l1_before = reader.get_l1_usage()[0]
    r = prefetch(reader, ks)
    assert r.l2_hit_count == 8 and r.l1_hit_count == 0
    assert read(reader, ks) == want(seeds)
    adapter = adapter_of(reader)
    # the prefetch unlocked what its lookup locked
    wait_for(lambda: adapter.report_status()["locked_keys"] == 0, 10, "unlock")
    assert adapter.report_status()["running_tasks"] == {"store": 0, "lookup": 0, "load": 0}
    # loads land in temporary L1 objects, freed once read: nothing stays allocated
    assert reader.get_l1_usage()[0] == l1_before
    return writer, reader, ks


def test_a_second_mp_instance_loads_what_the_first_stored(valkey_server, managers):
    writer, reader, ks = _share(managers, {"url": valkey_server.url, **T1, "transport": "tcp"})
    usage = adapter_of(writer).get_usage()
    assert usage.total_bytes_used == 8 * CHUNK_BYTES and dict(usage.bytes_by_cache_salt) == {"": 8 * CHUNK_BYTES}
    assert adapter_of(reader).get_usage().total_bytes_used == 0  # it stored nothing


def test_a_second_mp_instance_loads_from_valkey_cluster(valkey_cluster, managers):
    writer, reader, ks = _share(managers, {"url": valkey_cluster.url, **T1, "cluster": "yes"})
    # the chunks spread over the shards
    per_node = [s.cmd("DBSIZE") for s in valkey_cluster.servers]
    assert sum(per_node) == 8 and sum(1 for n in per_node if n) >= 2, per_node


def test_a_partial_prefix_is_loaded_and_the_rest_recomputed(valkey_server, managers):
    params = {"url": valkey_server.url, **T1}
    writer, reader = managers(params), managers(params)
    stored = keys([0, 1, 3])
    write(writer, stored, [1, 2, 4])
    wait_stored(writer, 3 * CHUNK_BYTES)
    ks = keys(range(5))
    r = prefetch(reader, ks)
    assert r.hit_cells[0].count_leading_ones() == 2  # chunk 2 is missing: the prefix ends there
    assert read(reader, ks[:2]) == want([1, 2])
    wait_for(lambda: adapter_of(reader).report_status()["locked_keys"] == 0, 10, "unlock")


def test_cache_salts_never_share_a_chunk(valkey_server, managers):
    params = {"url": valkey_server.url, **T1}
    writer, reader = managers(params), managers(params)
    alice = keys(range(4), salt="alice")
    write(writer, alice, [7, 8, 9, 10])
    wait_stored(writer, 4 * CHUNK_BYTES)
    assert dict(adapter_of(writer).get_usage().bytes_by_cache_salt) == {"alice": 4 * CHUNK_BYTES}
    assert prefetch(reader, keys(range(4), salt="bob")).l2_hit_count == 0
    assert prefetch(reader, keys(range(4))).l2_hit_count == 0  # no salt is another salt too
    assert prefetch(reader, alice).l2_hit_count == 4
    assert read(reader, alice) == want([7, 8, 9, 10])


def test_ranks_groups_and_models_never_share_a_chunk(valkey_server, managers):
    params = {"url": valkey_server.url, **T1}
    writer, reader = managers(params), managers(params)
    write(writer, keys(range(2), rank=0), [1, 2])
    wait_stored(writer, 2 * CHUNK_BYTES)
    assert prefetch(reader, keys(range(2), rank=1)).l2_hit_count == 0
    assert prefetch(reader, keys(range(2), group=1)).l2_hit_count == 0
    assert prefetch(reader, keys(range(2), model="other-model")).l2_hit_count == 0


def test_tenants_never_share_a_chunk(valkey_server, managers):
    writer = managers({"url": valkey_server.url, **T1})
    other = managers({"url": valkey_server.url, **T2})
    write(writer, keys(range(2)), [1, 2])
    wait_stored(writer, 2 * CHUNK_BYTES)
    assert prefetch(other, keys(range(2))).l2_hit_count == 0
