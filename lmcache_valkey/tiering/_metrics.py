"""The one place tiering reports metrics.

Calls go to :mod:`lmcache_valkey.metrics` when it imports (prometheus_client present);
otherwise every call is a no-op. A metrics call never raises into the data path.
Tiers also keep plain counters (``stats``) that tests and ``tier_stats`` read.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

try:  # pragma: no branch
    from .. import metrics as _m
except Exception:  # noqa: BLE001 - metrics are optional
    _m = None


def _call(name: str, *args: Any) -> None:
    if _m is None:
        return
    fn = getattr(_m, name, None)
    if fn is None:
        return
    try:
        fn(*args)
    except Exception:  # noqa: BLE001
        log.debug("metrics call %s failed", name, exc_info=True)


def record_hit(tier: str, nbytes: int) -> None:
    _call("record_hit", tier, "local", nbytes)


def record_miss(tier: str, cause: str) -> None:
    _call("record_miss", tier, cause)


def record_error(op: str, cause: str) -> None:
    _call("record_error", op, cause)


def record_put(tier: str, nbytes: int, ok: bool) -> None:
    _call("record_put", tier, "local", nbytes, ok)


def set_flush_backlog(tier: str, n: int) -> None:
    _call("set_flush_backlog", tier, n)


def record_flush_drop(tier: str, n: int = 1) -> None:
    _call("record_flush_drop", tier, n)


def record_promotion(src_tier: str, nbytes: int) -> None:
    _call("record_promotion", src_tier, nbytes)


def record_demotion(dst_tier: str, nbytes: int) -> None:
    _call("record_demotion", dst_tier, nbytes)


def set_breaker_state(tier: str, state: str) -> None:
    _call("set_breaker_state", tier, state)


def record_admission(tier: str, admitted: bool) -> None:
    _call("record_admission", tier, admitted)


def set_tier_usage(tier: str, used: int, capacity: int | None = None) -> None:
    _call("set_tier_usage", tier, used, capacity)


def observe_latency(op: str, tier: str, seconds: float) -> None:
    _call("observe_latency", op, tier, "local", seconds)


def start_http_server(port: int, health: Any = None) -> Any:
    """Serve /metrics and /healthz; None when the metrics module is unavailable."""
    if _m is None or not hasattr(_m, "start_http_server"):
        log.warning("metrics module unavailable: /metrics not served")
        return None
    return _m.start_http_server(port, health=health)
