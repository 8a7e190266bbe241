"""Tiering: Valkey RAM (hot) -> NVMe on the storage node (warm) -> S3-compatible storage (cold).

Modules (docs/layers.md, "Tiering"): ``settings`` (TieringSettings), ``ledger`` (every state
of a chunk in the lower tiers), ``tiers`` (the LowerTier protocol), ``nvme`` and
``object_store`` (its two implementations; only the latter imports aiobotocore), ``policy``
(admission, demotion, cost, breaker: pure), ``demotion``, ``promotion``, ``deletion`` and
``markers`` (the engines), ``manager`` (TierManager, the façade), ``client`` (the two tier
clients, behind the store's TierHints), ``service`` (tierd's request protocol: one op
table), ``requests`` (checks of untrusted requests), ``protocol`` (keys and encoding of the
Valkey lists), ``tierd`` (the service process and CLI controls).

Never imports: ``lmcache_valkey.store``, ``lmcache_valkey.integrations``, the fabric transport.
Importing this package does not import aiobotocore.
"""

from .client import EmbeddedTierClient, RemoteTierClient
from .manager import TierManager
from .settings import KNOWN_KEYS, TieringSettings, split_tiering_keys, tiering_settings_from_mapping

__all__ = [
    "KNOWN_KEYS",
    "EmbeddedTierClient",
    "RemoteTierClient",
    "TierManager",
    "TieringSettings",
    "split_tiering_keys",
    "tiering_settings_from_mapping",
]
