"""RESP transport: an asyncio RESP2 client for multi-MiB values (standalone Valkey and Valkey Cluster).

Never imports valkey-py, lmcache or anything above ``lmcache_valkey.config`` /
``lmcache_valkey.errors``.
"""

from .client import RespClient

__all__ = ["RespClient"]
