"""LMCache's own MP storage stack (StorageManager: L1 on host memory, store and prefetch
controllers) with this project's L2 adapter loaded as LMCache loads it: an ``--l2-adapter``
plugin JSON. Real Valkey servers come from tests/support/servers.py."""

from __future__ import annotations

import gc
import itertools
import json
import os
import time
from typing import Any, Callable, Iterator, Sequence

import pytest
import torch
from lmcache.v1.distributed.api import GroupedObjectKeys, MemoryLayoutDesc, ObjectKey, PrefetchTaskSpec
from lmcache.v1.distributed.config import get_arg_parser, parse_args_to_config
from lmcache.v1.distributed.storage_manager import StorageManager

MODULE = "lmcache_valkey.integrations.lmcache_mp"
LAYOUT = MemoryLayoutDesc(shapes=[torch.Size([4, 2, 16, 8, 64])], dtypes=[torch.bfloat16])  # 128 KiB chunks
CHUNK_BYTES = 4 * 2 * 16 * 8 * 64 * 2
# The tenants these tests run as: a tenant other than "default" gives its secret (a worker
# without one refuses to start, docs/security.md).
T1 = {"tenant": "t1", "tenant_secret": "t1-secret-0123456789abcdef"}
T2 = {"tenant": "t2", "tenant_secret": "t2-secret-0123456789abcdef"}


def spec(params: dict[str, Any], **outer: Any) -> dict[str, Any]:
    return {"type": "plugin", "module_path": MODULE, "class_name": "LmcvL2Adapter", "adapter_params": params, **outer}


_instances = itertools.count()


def make_manager(params: dict[str, Any], *, l1_gb: float = 0.25, extra_args: Sequence[str] = (), **outer: Any) -> StorageManager:
    """One MP server's storage manager, configured from the same flags ``lmcache server`` takes."""
    argv = ["--l1-size-gb", str(l1_gb), "--eviction-policy", "LRU", "--l2-adapter", json.dumps(spec(params, **outer)),
            *extra_args]
    args = get_arg_parser().parse_args(argv)
    args.shm_name = f"lmcv_test_l1_{os.getpid()}_{next(_instances)}"  # several MP instances in one process
    return StorageManager(parse_args_to_config(args))


@pytest.fixture
def managers() -> Iterator[Callable[..., StorageManager]]:
    made: list[StorageManager] = []

    def make(params: dict[str, Any], **kw: Any) -> StorageManager:
        sm = make_manager(params, **kw)
        made.append(sm)
        return sm

    yield make
    for sm in made:
        sm.close()
    # What the closed instances left behind is collected now, inside this test's teardown:
    # a task destroyed with its loop runs its cleanup here, where an error in it (a callback
    # on the closed loop) is reported against the test, not after the session.
    gc.collect()


def adapter_of(sm: StorageManager) -> Any:
    pairs = sm.l2_adapters() if callable(sm.l2_adapters) else sm.l2_adapters
    (_, adapter), = pairs
    return adapter


def keys(ids: Sequence[int], *, model: str = "test-model", salt: str = "", rank: int = 0, group: int = 0) -> list[ObjectKey]:
    return [ObjectKey(chunk_hash=i.to_bytes(16, "big"), model_name=model, kv_rank=rank, object_group_id=group,
                      cache_salt=salt) for i in ids]


def pattern(seed: int, nbytes: int = CHUNK_BYTES) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (nbytes,), generator=g, dtype=torch.uint8)


def raw(obj: Any) -> torch.Tensor:
    return obj.raw_data[: obj.get_size()].view(torch.uint8)


def write(sm: StorageManager, ks: list[ObjectKey], seeds: Sequence[int], layout: MemoryLayoutDesc = LAYOUT) -> None:
    """What an engine does on save: reserve L1, fill it, finish the write (LMCache's store
    controller then copies the chunks to L2)."""
    got = sm.reserve_write(ks, layout)
    assert len(got) == len(ks), "L1 is full"
    for k, seed in zip(ks, seeds):
        raw(got[k]).copy_(pattern(seed, raw(got[k]).numel()))
    sm.finish_write(list(got))


def wait_for(pred: Callable[[], bool], timeout: float = 30.0, what: str = "condition") -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def wait_stored(sm: StorageManager, nbytes: int, timeout: float = 30.0) -> None:
    wait_for(lambda: adapter_of(sm).get_usage().total_bytes_used >= nbytes, timeout, f"{nbytes} bytes in L2")


def prefetch(sm: StorageManager, ks: list[ObjectKey], layout: MemoryLayoutDesc = LAYOUT, timeout: float = 60.0) -> Any:
    """What an engine does on a lookup: prefetch into L1 (L2 lookup-and-lock, load, unlock)."""
    handle = sm.submit_prefetch_task(PrefetchTaskSpec([GroupedObjectKeys(ks, 0, layout)]))
    end = time.monotonic() + timeout
    while True:
        r = sm.query_prefetch_status(handle)
        if r is not None:
            return r
        assert time.monotonic() < end, "prefetch did not finish"
        time.sleep(0.01)


def read(sm: StorageManager, ks: list[ObjectKey]) -> list[bytes]:
    """Bytes of prefetched chunks, then their read locks released."""
    with sm.read_prefetched_results(ks) as objs:
        assert objs is not None, "not every key is in L1"
        out = [bytes(raw(o).numpy()) for o in objs]
    sm.finish_read_prefetched(ks)
    return out


def want(seeds: Sequence[int]) -> list[bytes]:
    return [bytes(pattern(s).numpy()) for s in seeds]


def l2_lookup(adapter: Any, ks: list[ObjectKey], timeout: float = 30.0) -> list[bool]:
    """The adapter's own answer for each key (lookup-and-lock, then unlock)."""
    tid = adapter.submit_lookup_and_lock_task(ks, {0: LAYOUT})
    end = time.monotonic() + timeout
    while (bits := adapter.query_lookup_and_lock_result(tid)) is None:
        assert time.monotonic() < end, "lookup did not finish"
        time.sleep(0.005)
    found = [bits.test(i) for i in range(len(ks))]
    adapter.submit_unlock([k for k, f in zip(ks, found) if f])
    return found
