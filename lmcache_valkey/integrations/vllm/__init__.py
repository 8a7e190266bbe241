"""vLLM 0.33 ``OffloadingConnector`` secondary tier over :mod:`lmcache_valkey.store`.

vLLM loads the tier from ``kv_transfer_config`` (``"spec_name": "TieringOffloadingSpec"``,
``"secondary_tiers": [{"type": "ValkeySecondaryTier", "module_path":
"lmcache_valkey.integrations.vllm.tier", ...}]``). Only this package imports ``vllm``, and
only ``tier.py`` and ``stats.py`` do: the settings, the lookup book and the job runner speak
plain keys, buffers and store calls, so they stay importable (and testable) without vLLM.
Design notes: docs/vllm-tier.md.
"""
