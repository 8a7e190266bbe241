"""LMCache multiprocess (MP) mode: the lmcache-valkey L2 adapter.

One ``--l2-adapter`` JSON on the LMCache MP server::

    {"type": "plugin",
     "module_path": "lmcache_valkey.integrations.lmcache_mp",
     "class_name": "LmcvL2Adapter",
     "adapter_params": {"url": "valkey://valkey:6379", "tenant": "team-a"}}

LMCache finds ``LmcvL2AdapterConfig`` by name and validates ``adapter_params`` with it at
start-up. Same store, transports and tiers as the in-process plugin
(``lmcache_valkey.integrations.lmcache``); docs/lmcache-mp.md says how MP's contract maps
onto them.
"""

from .adapter import LmcvL2Adapter
from .config import LmcvL2AdapterConfig

__all__ = ["LmcvL2Adapter", "LmcvL2AdapterConfig"]
