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
    "open_tiering",
]


async def open_tiering(settings, ts: TieringSettings, valkey) -> tuple["TierClient | None", "TierManager | None"]:
    """For the store: build the TierClient ``ts.mode`` asks for.

    ``off`` -> (None, None); ``embedded`` -> a started TierManager in this process and its
    client; ``service`` -> a remote client talking to ``tierd`` through Valkey. ``valkey`` is a
    started RespClient; the caller closes the manager (``await manager.close()``) then the client.
    """
    if not ts.enabled:
        return None, None
    if ts.mode == "service":
        return TierClient.remote(valkey, settings), None
    manager = TierManager(settings, ts, valkey)
    await manager.start()
    return TierClient.embedded(manager), manager
