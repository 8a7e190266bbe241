"""The ``adapter_params`` of the MP L2 adapter, validated once at LMCache's start-up.

LMCache's plugin loader finds this class by the ``<class_name>Config`` convention (or
``config_class_name``) and calls :meth:`LmcvL2AdapterConfig.from_dict` with
``adapter_params``; a bad value raises :class:`~lmcache_valkey.errors.ConfigError` (a
``ValueError``) naming ``adapter_params.<key>``, so the MP server refuses to start instead
of serving misses. The keys are the in-process plugin's (``url``, ``tenant``, ``transport``,
``tiering``, ``nvme_dir``, ...; README, "Settings") plus two of MP mode's own.
"""

from __future__ import annotations

from typing import Any, Mapping

from lmcache.v1.distributed.l2_adapters.config import L2AdapterConfigBase

from ...config import Settings, parse_size
from ...errors import ConfigError
from ...settings import load_settings
from ...tiering.settings import TieringSettings

KEY_PREFIX = "adapter_params."
DEFAULT_LOCK_LEASE_S = 60.0
# MP mode's own keys; every other key is a store or tiering setting.
MP_KEYS = ("max_capacity", "lock_lease_s")


class LmcvL2AdapterConfig(L2AdapterConfigBase):
    """Validated settings of one ``LmcvL2Adapter``.

    ``max_capacity``: bytes LMCache may account to this adapter before its L2 eviction
    runs (``0``, the default: no aggregate cap; per-``cache_salt`` quotas still work).
    ``lock_lease_s``: how long a lookup-and-lock keeps a chunk's tiered copies pinned if the
    unlock never comes (a crashed MP server); an unlock ends it at once.
    """

    def __init__(
        self,
        settings: Settings,
        tiering: TieringSettings,
        *,
        max_capacity_bytes: int = 0,
        lock_lease_s: float = DEFAULT_LOCK_LEASE_S,
    ) -> None:
        self.settings = settings
        self.tiering = tiering
        self.max_capacity_bytes = max_capacity_bytes
        self.lock_lease_s = lock_lease_s

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "LmcvL2AdapterConfig":
        if not isinstance(d, Mapping):
            raise ConfigError("adapter_params", "a JSON object of settings", type(d).__name__)  # d may hold a password
        raw = {k: v for k, v in d.items() if k != "type"}
        mp = {k: raw.pop(k) for k in MP_KEYS if k in raw}
        settings, tiering = load_settings(raw, key_prefix=KEY_PREFIX)
        return cls(
            settings,
            tiering,
            max_capacity_bytes=_capacity(mp.get("max_capacity", 0)),
            lock_lease_s=_seconds("lock_lease_s", mp.get("lock_lease_s", DEFAULT_LOCK_LEASE_S)),
        )

    @classmethod
    def help(cls) -> str:
        return (
            "lmcache-valkey L2 adapter (adapter_params):\n"
            "- url (str): valkey://host:port, valkeys://..., a comma-separated Cluster seed list, or unix:///path\n"
            "- tenant (str), namespace, key_prefix, model_revision: where chunks live (docs/keys.md)\n"
            "- transport (auto|tcp|fabric): RESP over TCP, or libfabric RMA into the L1 arena\n"
            "- op_timeout_s, lookup_timeout_s, connect_timeout_s: deadlines of every task\n"
            "- tiering (off|embedded|service), nvme_dir, s3_bucket, ...: lower tiers behind RAM\n"
            "- max_capacity (bytes, e.g. '64GiB'; default 0 = no aggregate cap): for LMCache's L2 eviction\n"
            "- lock_lease_s (default 60): bound on a lookup-and-lock's pins if no unlock comes\n"
            "Full list: README.md, 'Settings'. Example:\n"
            '{"type": "plugin", "module_path": "lmcache_valkey.integrations.lmcache_mp", '
            '"class_name": "LmcvL2Adapter", "adapter_params": {"url": "valkey://127.0.0.1:6379", "tenant": "team-a"}}'
        )


def _capacity(v: Any) -> int:
    if v in (0, "0"):
        return 0
    return parse_size(KEY_PREFIX + "max_capacity", v)


def _seconds(key: str, v: Any) -> float:
    try:
        if isinstance(v, bool):
            raise ValueError
        f = float(v)
    except (TypeError, ValueError):
        raise ConfigError(KEY_PREFIX + key, "a number of seconds", v) from None
    if not 0 < f <= 24 * 3600:
        raise ConfigError(KEY_PREFIX + key, "a number of seconds > 0 and at most 86400", v)
    return f
