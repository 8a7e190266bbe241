"""One entry point for settings: a flat mapping of keys -> ``(Settings, TieringSettings)``.

Every component that starts from what a person wrote calls :func:`load_settings`: the
LMCache plugin (``remote_storage_plugin.<name>.*`` of ``extra_config``, see
:func:`plugin_keys`), the LMCache MP adapter (``adapter_params``), the vLLM tier and the
SGLang backend (their ``extra_config``), the CLI (``--config`` plus its flags) and ``tierd``
(its flags). Core keys (``url``, ``tenant``, ...) become :class:`~.config.Settings`, tiering
keys (``tiering``, ``nvme_dir``, ...) :class:`~.tiering.settings.TieringSettings`; both are
checked with the one vocabulary of value parsers in :mod:`.config`, and a
:class:`~.errors.ConfigError` names the key as the user wrote it (``key_prefix`` + key).

Never imports: the store, a transport, an engine.
"""

from __future__ import annotations

from typing import Any, Callable, Collection, Mapping

from .config import KNOWN_KEYS as CORE_KEYS
from .config import LMCACHE_OWN_KEYS, PLUGIN_PREFIX, Settings, settings_from_mapping
from .errors import ConfigError, UnknownSetting
from .tiering.settings import KNOWN_KEYS as TIERING_KEYS
from .tiering.settings import TieringSettings, split_tiering_keys, tiering_settings_from_mapping


def load_settings(
    raw: Mapping[str, Any], *, key_prefix: str = "", env: Mapping[str, str] | None = None
) -> tuple[Settings, TieringSettings]:
    """Validate one component's flat settings: core keys and tiering keys, each once.

    ``key_prefix`` is put in front of the key an error names: ``remote_storage_plugin.valkey.``
    for LMCache's ``extra_config``, ``adapter_params.`` for an MP ``--l2-adapter`` JSON, ``--``
    for tierd's ``--set`` flags. ``env``: where secrets from the environment are read
    (default ``os.environ``)."""
    unknown = sorted(k for k in raw if k not in CORE_KEYS and k not in TIERING_KEYS and k not in LMCACHE_OWN_KEYS)
    if unknown:
        # (UnknownSetting quotes no value: a misspelt secret key, "pasword", holds the secret)
        raise UnknownSetting(key_prefix + unknown[0], "one of the known keys: "
                          + ", ".join(sorted(CORE_KEYS)) + "; tiering: " + ", ".join(sorted(TIERING_KEYS)))
    tier_raw, core_raw = split_tiering_keys(raw)
    try:
        settings = settings_from_mapping(core_raw, env=env)
    except ConfigError as e:
        raise e.renamed(key_prefix + e.key) from None
    return settings, tiering_settings_from_mapping(tier_raw, key_prefix=key_prefix)


def load_adapter_settings(
    raw: Mapping[str, Any], *, key_prefix: str, own: Mapping[str, Callable[[str, Any], Any]],
    engine_keys: Collection[str] = (), env: Mapping[str, str] | None = None,
) -> tuple[Settings, TieringSettings, dict[str, Any]]:
    """:func:`load_settings` for an adapter with keys of its own: ``own`` maps each of them to
    its parser (the vocabulary of :mod:`.config`), ``engine_keys`` are the engine's (consumed by
    it, skipped here). Returns the two settings objects and the adapter's parsed keys (a key
    set to None is left out: its default applies)."""
    mine: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    for k, v in raw.items():
        if not isinstance(k, str):
            raise ConfigError(key_prefix + str(k), "a string key")
        if k in engine_keys:
            continue
        if k in own:
            if v is not None:
                mine[k] = own[k](key_prefix + k, v)
        else:
            rest[k] = v
    settings, tiering = load_settings(rest, key_prefix=key_prefix, env=env)
    return settings, tiering, mine


def plugin_keys(extra_config: Mapping[str, Any] | None, plugin_name: str) -> dict[str, Any]:
    """The ``remote_storage_plugin.<plugin_name>.*`` keys of LMCache's ``extra_config``, without
    that prefix (pass ``key_prefix=plugin_prefix(plugin_name)`` to :func:`load_settings`)."""
    prefix = plugin_prefix(plugin_name)
    return {k[len(prefix):]: v for k, v in (extra_config or {}).items() if isinstance(k, str) and k.startswith(prefix)}


def plugin_prefix(plugin_name: str) -> str:
    return f"{PLUGIN_PREFIX}{plugin_name}."


__all__ = ["load_adapter_settings", "load_settings", "plugin_keys", "plugin_prefix"]
