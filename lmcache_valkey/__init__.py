"""lmcache_valkey: a shared, tiered home for LMCache KV-cache chunks on Valkey.

Importing the package imports nothing else (the CLI, engines and transports load on use).
"""

__version__ = "0.1.0"  # the one place: pyproject.toml reads it, `lmcache-valkey --version` prints it

__all__ = ["__version__"]
