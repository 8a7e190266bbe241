"""Adapters between serving stacks and :mod:`lmcache_valkey.store`.

Only this package imports ``lmcache``; nothing below it does.
"""
