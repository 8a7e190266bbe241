"""LMCache inside vLLM on the CPU platform: a KV connector where LMCache has none, and a loud
error (log and metric) wherever LMCache would quietly run without one.

vLLM calls :func:`register` in each of its processes (the ``vllm.general_plugins`` entry point
of this package), before LMCache builds its engine. Nothing happens where LMCache is not
installed. ``LMCACHE_VALKEY_CPU_KV_CONNECTOR=off`` keeps LMCache's own behaviour (no connector
on CPU), still reported. Design note: docs/vllm-cpu.md.

The only package that imports LMCache's KV connector interface; of vLLM it imports only the CPU
attention kernel, and only when the connector first binds (kv_connector.py).
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["diagnose", "register"]


def register() -> None:
    """vLLM general plugin: install the hook (idempotent; vLLM may call it several times).

    A bad ``LMCACHE_VALKEY_CPU_KV_CONNECTOR`` stops vLLM at start-up (ConfigError); anything
    else that goes wrong is logged at ERROR and vLLM starts as it would without us.
    """
    from .hook import install, mode_from_env

    mode = mode_from_env()
    if importlib.util.find_spec("lmcache") is None:
        return
    try:
        install(mode)
    except Exception as e:  # an LMCache this package does not know: say so, never break vLLM
        log.error("lmcache-valkey could not hook LMCache's KV connector factory (%s: %s); on vLLM's "
                  "CPU platform LMCache will then serve every request by recompute", type(e).__name__, e)


def diagnose(env: Any = None) -> tuple[str, str, str]:
    """For ``doctor``: (ok | warn | fail | skip, what LMCache will do for vLLM here, the fix).

    Imports LMCache (never vLLM): doctor runs outside the serving engine.
    """
    from importlib.metadata import entry_points

    from ...errors import ConfigError
    from .hook import MODE_ENV, incompatibility, mode_from_env

    if importlib.util.find_spec("lmcache") is None:
        return "skip", "LMCache is not installed here", ""
    if importlib.util.find_spec("vllm") is None:
        return "skip", "vLLM is not installed here (the KV connector check is for vLLM workers)", ""
    try:
        mode = mode_from_env(env)
    except ConfigError as e:
        return "fail", str(e), f"unset {MODE_ENV} or set it to auto"
    import lmcache

    from . import compat

    device = str(getattr(lmcache, "torch_device_type", "unknown"))
    if device != "cpu":
        return "ok", f"LMCache {compat.LMCACHE_VERSION} runs vLLM's KV cache on {device} with its own KV connector", ""
    registered = any(e.name == "lmcache_valkey" for e in entry_points(group="vllm.general_plugins"))
    why = incompatibility(compat.FACTORY_MODULE, compat.GPUConnectorInterface)
    recompute = (f"LMCache {compat.LMCACHE_VERSION} has no KV connector for vLLM's CPU platform: vLLM "
                 "will serve every request by recompute, the shared cache unused")
    if mode == "off":
        return "fail", f"{recompute} ({MODE_ENV}=off)", f"unset {MODE_ENV} to use lmcache-valkey's CPU KV connector"
    if not registered:
        return "fail", f"{recompute} (lmcache-valkey's vLLM plugin entry point is not installed)", \
            "reinstall lmcache-valkey in vLLM's environment (pip install lmcache-valkey)"
    if why is not None:
        return "fail", f"{recompute}; lmcache-valkey cannot supply its own: {why}", \
            "use the LMCache release lmcache-valkey names (pip install 'lmcache-valkey[lmcache]')"
    return "ok", (f"LMCache {compat.LMCACHE_VERSION} has no KV connector for vLLM's CPU platform; "
                  "lmcache-valkey supplies one (vLLM plugin lmcache_valkey)"), ""
