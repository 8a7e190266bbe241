"""The class LMCache loads from ``remote_storage_plugin.<name>.class_name``.

LMCache dials ``plugin://<name>`` for each entry of ``remote_storage_plugins``;
this adapter claims the names whose type (the part before the first ``.``) is
``valkey``, ``lmcache_valkey`` or ``lmcv`` — or any listed, comma-separated, in
``LMCACHE_VALKEY_PLUGIN_NAMES``. Built-in schemes (``valkey://``,
``redis://``) stay LMCache's own.

LMCache swallows connector-construction errors (every operation then becomes a
miss), so every failure here is logged at ERROR with the setting to fix.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping

from lmcache.v1.storage_backend.connector import ConnectorAdapter, ConnectorContext
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

from ...config import Settings
from ...errors import LmcacheValkeyError
from ...settings import load_settings, plugin_keys, plugin_prefix
from ...tiering.settings import TieringSettings

log = logging.getLogger(__name__)

PLUGIN_SCHEME = "plugin://"
DEFAULT_PLUGIN_TYPES = ("valkey", "lmcache_valkey", "lmcv")


def _plugin_types() -> set[str]:
    extra = os.environ.get("LMCACHE_VALKEY_PLUGIN_NAMES", "")
    return set(DEFAULT_PLUGIN_TYPES) | {n.strip() for n in extra.split(",") if n.strip()}


def parse_plugin_settings(
    extra_config: Mapping[str, Any] | None, name: str, *, env: Mapping[str, str] | None = None
) -> tuple[Settings, TieringSettings]:
    """Validate every ``remote_storage_plugin.<name>.*`` key: core settings and tiering.

    Errors name the key as the user wrote it in YAML.
    """
    return load_settings(plugin_keys(extra_config, name), key_prefix=plugin_prefix(name), env=env)


class ValkeyConnectorAdapter(ConnectorAdapter):
    def __init__(self) -> None:
        super().__init__(PLUGIN_SCHEME)

    def can_parse(self, url: str) -> bool:
        if not url.startswith(PLUGIN_SCHEME):
            return False
        name = url[len(PLUGIN_SCHEME) :]
        return name.split(".", 1)[0] in _plugin_types()

    def create_connector(self, context: ConnectorContext) -> RemoteConnector:
        from .connector import ValkeyRemoteConnector  # torch-heavy; only when used

        name = context.plugin_name or context.url[len(PLUGIN_SCHEME) :]
        # LMCache's signature makes config and metadata optional; its built-in connectors then
        # take both from the local CPU backend, and so do we.
        backend = context.local_cpu_backend
        config = context.config if context.config is not None else getattr(backend, "config", None)
        metadata = context.metadata if context.metadata is not None else getattr(backend, "metadata", None)
        try:
            missing = [what for what, value in (("engine config", config), ("engine metadata", metadata))
                       if value is None]
            if missing:
                raise LmcacheValkeyError(
                    f"LMCache passed no {' and no '.join(missing)} (neither as arguments nor on its "
                    f"local CPU backend {type(backend).__name__}): the plugin runs where LMCache stores "
                    "KV chunks, in a worker, not in a scheduler")
            settings, tiering = parse_plugin_settings(config.extra_config, name)
            return ValkeyRemoteConnector(config, metadata, backend, settings, tiering)
        except Exception as e:
            log.error("lmcache-valkey plugin %r could not start, every lookup will miss: %s", name, e)
            raise
