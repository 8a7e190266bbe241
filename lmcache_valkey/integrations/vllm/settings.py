"""The tier's settings from its ``secondary_tiers`` entry, validated once at start-up.

vLLM passes every key of the entry except ``type``, ``module_path`` and ``backpressure``
to the tier's constructor. Ours: the store's keys (``url``, ``tenant``, ``ttl_s``, deadlines,
TLS, fabric, ``model_revision``, ...), the tiering keys (``tiering``, ``nvme_dir``, ...),
and three of the tier's own (``enable_kv_events``, ``locality``, ``shutdown_timeout_s``).
A bad or unknown key raises :class:`~lmcache_valkey.errors.ConfigError` naming it as the
user wrote it: ``kv_connector_extra_config.secondary_tiers[<type>].<key>``.

Never imports: ``vllm`` (the layout fields are read from vLLM's config by attribute).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ...config import Settings, parse_bool, parse_seconds
from ...errors import ConfigError
from ...settings import load_adapter_settings
from ...tiering.settings import TieringSettings

# Consumed by vLLM's SecondaryTierFactory before the constructor sees the entry.
VLLM_KEYS = frozenset({"type", "module_path", "backpressure"})
LOCALITIES = ("LOCAL", "REMOTE")


@dataclass(frozen=True)
class TierSettings:
    store: Settings
    tiering: TieringSettings
    # Emit vLLM KV events (BlockStored) for blocks this tier stored; only when vLLM's
    # kv_events_config enables KV cache events globally.
    enable_kv_events: bool = False
    # Where the data lives relative to this vLLM instance, for requests' tier filters.
    # Valkey is a shared network store: REMOTE unless the user says otherwise.
    locality: str = "REMOTE"
    # How long shutdown waits for jobs in flight before cancelling them.
    shutdown_timeout_s: float = 10.0


def key_prefix(tier_type: str) -> str:
    return f"kv_connector_extra_config.secondary_tiers[{tier_type}]."


def _locality(key: str, v: Any) -> str:
    if isinstance(v, str) and v.strip().upper() in LOCALITIES:
        return v.strip().upper()
    raise ConfigError(key, "one of " + "|".join(LOCALITIES), v)


_OWN = {
    "enable_kv_events": parse_bool,
    "locality": _locality,
    "shutdown_timeout_s": parse_seconds,
}


def parse_tier_settings(raw: Mapping[str, Any], tier_type: str, *, env: Mapping[str, str] | None = None) -> TierSettings:
    """Validate a ``secondary_tiers`` entry (with or without vLLM's own keys)."""
    store, tiering, own = load_adapter_settings(raw, key_prefix=key_prefix(tier_type), own=_OWN,
                                                engine_keys=VLLM_KEYS, env=env)
    return TierSettings(store=store, tiering=tiering, **own)


def namespace_fields(config: Any, block_bytes: int) -> dict[str, Any]:
    """Everything that shapes a block's bytes in vLLM's primary tier; any difference is
    another namespace, so a block is never served to a different model, dtype, layout,
    block size or parallel layout. ``config`` is vLLM's ``OffloadingConfig``."""
    p = config.parallel
    return {
        "engine": "vllm",
        "model": config.model.name,
        "kv_dtype": str(config.model.dtype),
        "groups": [[g.tokens_per_block, list(g.layer_names), g.group_id] for g in config.groups],
        "tokens_per_hash": config.cache.tokens_per_hash,
        "blocks_per_chunk": config.cache.blocks_per_chunk,
        "worker_kv_bytes_per_block": config.worker_kv_bytes_per_block,
        # The primary tier's row: every worker's bytes of a chunk, padded to its alignment.
        "block_bytes": block_bytes,
        "world_size": p.world_size,
        "rank": p.rank,
        "tp_size": p.tp_size,
        "pp_size": p.pp_size,
        "pcp_size": p.pcp_size,
        "dcp_size": p.dcp_size,
        "replicated_layout": bool(config.replicated_layout),
        "canonical_layout": bool(config.canonical_layout),
        "kv_cache_layout": config.kv_cache_layout,
    }


__all__ = ["TierSettings", "VLLM_KEYS", "key_prefix", "namespace_fields", "parse_tier_settings"]
