"""The backend's settings from ``--hicache-storage-backend-extra-config``, validated at start-up.

SGLang hands a ``dynamic`` backend the whole extra-config object. Some keys are SGLang's own
(the loader's ``backend_name``/``module_path``/``class_name``, ``interface_v1`` which picks the
zero-copy page API, and prefetch knobs the cache controller reads); the rest are ours: the
store's keys (``url``, ``tenant``, deadlines, TLS, fabric, ``model_revision``, ...) and the
tiering keys (``tiering``, ``nvme_dir``, ...). A bad or unknown key raises
:class:`~lmcache_valkey.errors.ConfigError` naming it as the user wrote it:
``hicache_storage_backend_extra_config.<key>``.

Never imports: ``sglang``, ``torch``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Mapping

from ...config import Settings, parse_bool
from ...errors import ConfigError
from ...settings import load_adapter_settings
from ...tiering.settings import TieringSettings

log = logging.getLogger(__name__)

KEY_PREFIX = "hicache_storage_backend_extra_config."

# Read by SGLang itself (StorageBackendFactory, HiCacheController); never ours to refuse.
SGLANG_KEYS = frozenset({
    "backend_name", "module_path", "class_name", "interface_v1",
    "prefetch_threshold", "prefetch_timeout_base", "prefetch_timeout_per_ki_token",
    "hicache_storage_pass_prefix_keys", "tp_lcm_size",
})


@dataclass(frozen=True)
class BackendSettings:
    store: Settings
    tiering: TieringSettings
    # SGLang's zero-copy page API (batch_get_v1/batch_set_v1) is on: without it SGLang copies
    # every page through a temporary tensor before it reaches the backend.
    interface_v1: bool = False
    # A page already in Valkey is not sent again (its key names its content: the hash of
    # the token prefix it holds): one pipelined EXISTS instead of the page's bytes.
    skip_existing: bool = True


_OWN = {"skip_existing": parse_bool}


def parse_backend_settings(extra_config: Mapping[str, Any] | None, *, env: Mapping[str, str] | None = None) -> BackendSettings:
    """Validate SGLang's extra-config object (a dict, as SGLang parsed it from JSON/YAML/TOML)."""
    if extra_config is None:
        extra_config = {}
    if not isinstance(extra_config, Mapping):
        raise ConfigError(KEY_PREFIX.rstrip("."), "a JSON object", type(extra_config).__name__)
    store, tiering, own = load_adapter_settings(extra_config, key_prefix=KEY_PREFIX, own=_OWN,
                                                engine_keys=SGLANG_KEYS, env=env)
    interface_v1 = extra_config.get("interface_v1", 0)
    return BackendSettings(store=store, tiering=tiering, interface_v1=bool(interface_v1), **own)


def config_fields(config: Any) -> dict[str, Any]:
    """What SGLang's ``HiCacheStorageConfig`` says about whose pages these are: the model and
    the parallel shard. MLA KV is the same on every TP rank, so MLA ranks share pages (one
    writer, ``is_storage_writer``); MHA pages are a TP rank's heads, so the rank is part of
    them. DP attention groups hold the same heads per attention-TP rank and share pages.
    Pipeline stages and context-parallel ranks hold different layers or slices."""
    mla = bool(config.is_mla_model)
    fields: dict[str, Any] = {
        "engine": "sglang",
        "model": config.model_name or "",
        "mla": mla,
        "tp_size": int(config.tp_size),
        "tp_rank": None if mla else int(config.tp_rank),
        "pp_size": int(config.pp_size),
        "pp_rank": int(config.pp_rank),
        "cp_size": int(getattr(config, "attn_cp_size", 1) or 1),
        "cp_rank": int(getattr(config, "attn_cp_rank", 0) or 0),
    }
    dcp_size = int(getattr(config, "dcp_size", 1) or 1)
    if dcp_size > 1:  # MLA shards split over decode-context-parallel ranks
        fields.update(dcp_size=dcp_size, dcp_rank=int(config.dcp_rank),
                      logical_page_size=config.logical_page_size)
    return fields


__all__ = ["BackendSettings", "KEY_PREFIX", "SGLANG_KEYS", "config_fields", "parse_backend_settings"]
