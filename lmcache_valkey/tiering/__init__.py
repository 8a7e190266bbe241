"""Tiering: Valkey RAM (hot) -> NVMe on the storage node (warm) -> S3-compatible storage (cold).

Modules: ``settings`` (TieringSettings), ``policy`` (admission, demotion, cost, breaker),
``index`` (tier index, pins, markers), ``nvme`` (NVMe tier), ``object_store`` (S3 tier; the
only module importing aiobotocore), ``manager`` (TierManager), ``client`` (TierClient, the
worker-side API), ``service`` (``tierd`` and CLI controls), ``protocol`` (the Valkey-list
protocol between workers and tierd, docs/tiering-promotion.md).

Never imports: ``lmcache_valkey.store``, ``lmcache_valkey.integrations``, the fabric transport.
Importing this package does not import aiobotocore.
"""

from .client import TierClient
from .manager import TierManager
from .settings import KNOWN_KEYS, TieringSettings, split_tiering_keys, tiering_settings_from_mapping

__all__ = [
    "KNOWN_KEYS",
    "TierClient",
    "TierManager",
    "TieringSettings",
    "split_tiering_keys",
    "tiering_settings_from_mapping",
]

