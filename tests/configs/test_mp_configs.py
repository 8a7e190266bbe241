"""configs/mp-*.json and configs/mp-server.sh: each adapter JSON parses with LMCache's own
``--l2-adapter`` parser and our config class, every flag of the launch script is one LMCache's
MP server takes, and the TCP example serves a real LMCache storage manager on real Valkey."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

pytest.importorskip("lmcache.v1.distributed.l2_adapters.config", reason="lmcache (extra 'lmcache') is not installed")

from lmcache.v1.distributed.l2_adapters.config import parse_args_to_l2_adapters_config  # noqa: E402

from lmcache_valkey.config import check_tenant_secret  # noqa: E402
from lmcache_valkey.integrations.lmcache_mp import LmcvL2AdapterConfig  # noqa: E402
from support.tenant_secrets import with_test_secret  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
NAMES = ["mp-tcp.json", "mp-fabric.json", "mp-tiered.json", "mp-eviction.json"]


def _shipped(name: str) -> dict:
    return json.loads((CONFIGS / name).read_text())


def _spec(name: str) -> dict:
    """The example as written, its tenant secret's pod path swapped for a secret given here."""
    spec = _shipped(name)
    spec["adapter_params"] = with_test_secret(spec["adapter_params"])
    return spec


def test_every_mp_config_is_here_and_the_launch_script_names_each():
    assert {p.name for p in CONFIGS.glob("mp-*.json")} == set(NAMES)
    script = (CONFIGS / "mp-server.sh").read_text()
    for name in NAMES:
        assert name in script, name


@pytest.mark.parametrize("name", NAMES)
def test_parses_with_lmcache_and_validates_with_our_config_class(name):
    spec = _spec(name)
    assert spec["type"] == "plugin" and spec["class_name"] == "LmcvL2Adapter"
    assert spec["module_path"] == "lmcache_valkey.integrations.lmcache_mp"
    (outer,) = parse_args_to_l2_adapters_config(argparse.Namespace(l2_adapter=[json.dumps(spec)])).adapters
    assert outer.module_path == spec["module_path"] and outer.class_name == spec["class_name"]
    cfg = LmcvL2AdapterConfig.from_dict(outer.adapter_params)
    assert cfg.settings.tenant == "team-a"
    assert "tenant_secret_file" in _shipped(name)["adapter_params"]  # a named tenant gives its secret
    check_tenant_secret(cfg.settings)
    if name == "mp-eviction.json":
        assert outer.eviction_config is not None and outer.eviction_config.eviction_policy == "LRU"
        assert cfg.max_capacity_bytes == 40 << 30
    if name == "mp-tiered.json":
        assert cfg.tiering.mode == "service"
    if name == "mp-fabric.json":
        assert cfg.settings.transport == "fabric"


def test_every_flag_of_the_launch_script_is_an_mp_server_flag():
    from lmcache.v1.distributed.config import add_storage_manager_args
    from lmcache.v1.multiprocess.config import add_mp_server_args

    parser = argparse.ArgumentParser()
    add_mp_server_args(parser)
    add_storage_manager_args(parser)
    known = {s for a in parser._actions for s in a.option_strings}
    body = (CONFIGS / "mp-server.sh").read_text().split("exec lmcache server", 1)[1]
    flags = set(re.findall(r"(--[a-z0-9][a-z0-9-]+)", body))
    assert flags and flags <= known, sorted(flags - known)


def test_the_tcp_example_serves_an_lmcache_storage_manager(valkey_server):
    import torch
    from lmcache.v1.distributed.api import GroupedObjectKeys, MemoryLayoutDesc, ObjectKey, PrefetchTaskSpec
    from lmcache.v1.distributed.config import get_arg_parser, parse_args_to_config
    from lmcache.v1.distributed.storage_manager import StorageManager

    spec = _spec("mp-tcp.json")
    spec["adapter_params"]["url"] = valkey_server.url
    managers = []
    for i in range(2):
        args = get_arg_parser().parse_args(["--l1-size-gb", "0.1", "--eviction-policy", "LRU",
                                            "--l2-adapter", json.dumps(spec)])
        args.shm_name = f"lmcv_cfg_test_{i}_{id(args)}"
        managers.append(StorageManager(parse_args_to_config(args)))
    writer, reader = managers
    try:
        layout = MemoryLayoutDesc(shapes=[torch.Size([2, 16, 64])], dtypes=[torch.float16])
        keys = [ObjectKey(chunk_hash=bytes([i]) * 16, model_name="m", kv_rank=0) for i in range(2)]
        objs = writer.reserve_write(keys, layout)
        for n, k in enumerate(keys):
            objs[k].raw_data.view(torch.uint8).fill_(n + 1)
        writer.finish_write(keys)
        import time

        end = time.monotonic() + 30
        while int(valkey_server.cmd("DBSIZE")) < 2:
            assert time.monotonic() < end, "the writer's chunks did not reach Valkey"
            time.sleep(0.05)
        handle = reader.submit_prefetch_task(PrefetchTaskSpec([GroupedObjectKeys(keys, 0, layout)]))
        while (r := reader.query_prefetch_status(handle)) is None:
            assert time.monotonic() < end, "prefetch did not finish"
            time.sleep(0.02)
        assert r.l2_hit_count == 2
        with reader.read_prefetched_results(keys) as got:
            assert [int(o.raw_data.view(torch.uint8)[0]) for o in got] == [1, 2]
        reader.finish_read_prefetched(keys)
    finally:
        for m in managers:
            m.close()
