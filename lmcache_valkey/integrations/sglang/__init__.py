"""SGLang 0.5.23 HiCache L3 storage backend over :mod:`lmcache_valkey.store`.

SGLang loads it with ``--hicache-storage-backend dynamic`` and
``--hicache-storage-backend-extra-config '{"backend_name": "valkey", "module_path":
"lmcache_valkey.integrations.sglang.backend", "class_name": "ValkeyHiCacheStorage",
"interface_v1": 1, ...}'``. Only ``backend.py`` and ``stats.py`` import ``sglang``: the
settings and the page layout math speak plain mappings, tensors and buffers. Design notes:
docs/sglang.md.
"""
