"""lmcache_valkey."""
