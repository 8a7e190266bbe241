"""Tiering settings: validated once into a frozen dataclass.

Adapters pass LMCache ``extra_config`` keys (``tiering``, ``nvme_dir``,
``nvme_budget_bytes``, ``s3_bucket``, ...) into :func:`tiering_settings_from_mapping`;
``tierd`` builds the same object from its flags. Every bad value raises
:class:`~lmcache_valkey.errors.ConfigError` naming the key. Nothing downstream re-parses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..config import (
    MAX_SECONDS,
    parse_bool,
    parse_choice,
    parse_int,
    parse_number,
    parse_opt_seconds,
    parse_opt_str,
    parse_seconds,
    parse_size,
)
from ..errors import ConfigError, UnknownSetting

MODES = ("off", "embedded", "service")
ADMISSIONS = ("always", "second_touch", "frequency")


@dataclass(frozen=True)
class TieringSettings:
    """Everything the tier manager needs. ``mode``: off | embedded (manager in the worker)
    | service (a ``tierd`` next to Valkey; workers talk to it through Valkey)."""

    mode: str = "off"
    # NVMe (warm) tier; None disables it.
    nvme_dir: str | None = None
    nvme_budget_bytes: int = 64 << 30
    nvme_direct: bool = True  # O_DIRECT when the filesystem accepts it
    nvme_threads: int = 4
    nvme_fsync_dir: bool = False  # also fsync the directory after each rename (slower; see nvme.py)
    # Object (cold) tier; None disables it.
    s3_bucket: str | None = None
    s3_prefix: str = "lmcache-valkey"
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    s3_concurrency: int = 8  # parallel uploads and ranged GETs
    s3_multipart_threshold: int = 64 << 20
    s3_part_bytes: int = 16 << 20
    s3_range_bytes: int = 8 << 20
    s3_max_retries: int = 3
    s3_timeout_s: float = 30.0
    flush_queue_max: int = 1024  # chunks waiting for write-behind to the object tier
    flush_queue_max_bytes: int = 2 << 30  # and their bytes (one chunk larger than this still goes alone)
    # Policies.
    admission: str = "second_touch"
    admission_min_touches: int = 2  # used by "frequency" (second_touch == 2)
    admission_window: int = 1 << 20  # chunks remembered by the touch counter
    recompute_budget_s: float = 2.0
    demote_high_watermark: float = 0.85  # of Valkey maxmemory
    demote_low_watermark: float = 0.70
    demote_idle_s: float | None = None  # demote chunks idle longer than this regardless of memory
    demote_interval_s: float = 1.0
    demote_scan_count: int = 256  # ignored (kept for old configs): tierd no longer SCANs (docs/tiering-index.md)
    breaker_failures: int = 5
    breaker_reset_s: float = 5.0
    promote_to_nvme: bool = True  # an object-tier hit is also written to NVMe
    promote_hold_s: float = 5.0  # a promoted chunk stays in RAM until its reader read it, at most this long
    max_leases: int = 1 << 16  # chunks leased at once (lookup-and-lock); more are refused, counted
    request_block_s: float = 1.0  # tierd's BLPOP wait on the request list
    marker_repair_s: float = 300.0  # re-create tier markers Valkey lost (eviction), this often

    @property
    def enabled(self) -> bool:
        """Workers use tiering: embedded with a tier configured, or a tierd serving them."""
        if self.mode == "service":
            return True
        return self.mode == "embedded" and (self.nvme_dir is not None or self.s3_bucket is not None)


# --- parsers: the package's one vocabulary (config.py), bounds per key -----------------------
def _mode(key: str, v: Any) -> str:
    """``off | embedded | service``; a boolean (or its spelling) means embedded/off."""
    if isinstance(v, str) and v.strip().lower() in MODES:
        return v.strip().lower()
    if v == "":
        return "off"
    try:
        return "embedded" if parse_bool(key, v) else "off"
    except ConfigError:
        raise ConfigError(key, "one of " + "|".join(MODES), v) from None


_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def _bucket(key: str, v: Any) -> str | None:
    if v in (None, ""):
        return None
    if isinstance(v, str) and _BUCKET_RE.match(v):
        return v
    raise ConfigError(key, "a valid S3 bucket name (3-63 of a-z, 0-9, '.', '-')", v)


def _prefix(key: str, v: Any) -> str:
    if isinstance(v, str) and v.strip("/") and ".." not in v:
        return v.strip("/")
    raise ConfigError(key, "a non-empty object key prefix without '..'", v)


def _endpoint(key: str, v: Any) -> str | None:
    if v in (None, ""):
        return None
    if isinstance(v, str) and re.match(r"^https?://[^/\s]+", v):
        return v
    raise ConfigError(key, "an http(s):// URL", v)


def _int(lo: int, hi: int) -> Callable[[str, Any], int]:
    return lambda key, v: parse_int(key, v, lo, hi)


def _fraction(key: str, v: Any) -> float:
    return parse_number(key, v, 0.0, 1.0, what="a fraction of maxmemory")


# key -> parser. The key is also the field name (but ``tiering`` -> ``mode``).
_PARSERS: dict[str, Callable[[str, Any], Any]] = {
    "tiering": _mode,
    "nvme_dir": parse_opt_str,
    "nvme_budget_bytes": parse_size,
    "nvme_direct": parse_bool,
    "nvme_threads": _int(1, 64),
    "nvme_fsync_dir": parse_bool,
    "s3_bucket": _bucket,
    "s3_prefix": _prefix,
    "s3_endpoint_url": _endpoint,
    "s3_region": parse_opt_str,
    "s3_concurrency": _int(1, 256),
    "s3_multipart_threshold": parse_size,
    "s3_part_bytes": parse_size,
    "s3_range_bytes": parse_size,
    "s3_max_retries": _int(0, 20),
    "s3_timeout_s": parse_seconds,
    "flush_queue_max": _int(1, 1 << 24),
    "flush_queue_max_bytes": parse_size,
    "admission": lambda k, v: parse_choice(k, v, ADMISSIONS),
    "admission_min_touches": _int(1, 1000),
    "admission_window": _int(16, 1 << 26),
    "recompute_budget_s": parse_seconds,
    "demote_high_watermark": _fraction,
    "demote_low_watermark": _fraction,
    "demote_idle_s": lambda k, v: parse_opt_seconds(k, v, maximum=30 * MAX_SECONDS),
    "demote_interval_s": parse_seconds,
    "demote_scan_count": _int(1, 100000),
    "breaker_failures": _int(1, 1000),
    "breaker_reset_s": parse_seconds,
    "promote_to_nvme": parse_bool,
    "promote_hold_s": lambda k, v: parse_seconds(k, v, maximum=600.0),
    "max_leases": _int(1, 1 << 24),
    "request_block_s": lambda k, v: parse_seconds(k, v, maximum=60.0),
    "marker_repair_s": parse_seconds,
}
KNOWN_KEYS = frozenset(_PARSERS)
_FIELD = {"tiering": "mode"}


def tiering_settings_from_mapping(raw: Mapping[str, Any], *, key_prefix: str = "") -> TieringSettings:
    """Validate tiering keys. Unknown keys are refused. ``key_prefix`` is prepended to the
    key named in a :class:`ConfigError` (e.g. ``remote_storage_plugin.valkey.``)."""
    values: dict[str, Any] = {}
    for k, v in raw.items():
        if k not in _PARSERS:
            raise UnknownSetting(key_prefix + k, "one of the tiering keys: " + ", ".join(sorted(KNOWN_KEYS)))
        try:
            values[_FIELD.get(k, k)] = _PARSERS[k](k, v)
        except ConfigError as e:
            raise e.renamed(key_prefix + e.key) from None
    s = TieringSettings(**values)
    if s.demote_low_watermark >= s.demote_high_watermark:
        raise ConfigError(key_prefix + "demote_low_watermark", f"below demote_high_watermark ({s.demote_high_watermark})", s.demote_low_watermark)
    if s.s3_part_bytes < 5 << 20:
        raise ConfigError(key_prefix + "s3_part_bytes", "at least 5MiB (the S3 minimum part size)", s.s3_part_bytes)
    if s.s3_multipart_threshold < s.s3_part_bytes:
        raise ConfigError(key_prefix + "s3_multipart_threshold", f"at least s3_part_bytes ({s.s3_part_bytes})", s.s3_multipart_threshold)
    if s.mode == "embedded" and s.nvme_dir is None and s.s3_bucket is None:
        # (service: the tiers are tierd's business; the worker only needs mode=service)
        raise ConfigError(key_prefix + "tiering", "nvme_dir and/or s3_bucket set with tiering: embedded", s.mode)
    if s.admission == "second_touch":
        s = _replace(s, admission_min_touches=2)
    elif s.admission == "always":
        s = _replace(s, admission_min_touches=1)
    return s


def _replace(s: TieringSettings, **kw: Any) -> TieringSettings:
    from dataclasses import replace

    return replace(s, **kw)


def split_tiering_keys(raw: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split a flat plugin mapping into (tiering keys, everything else) for an adapter's settings."""
    mine = {k: v for k, v in raw.items() if k in KNOWN_KEYS}
    rest = {k: v for k, v in raw.items() if k not in KNOWN_KEYS}
    return mine, rest


__all__ = ["TieringSettings", "KNOWN_KEYS", "MODES", "ADMISSIONS", "tiering_settings_from_mapping", "split_tiering_keys"]
