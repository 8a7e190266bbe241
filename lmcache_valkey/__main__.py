"""``python -m lmcache_valkey``: the ``lmcache-valkey`` command."""

import sys

from .console import main

if __name__ == "__main__":
    sys.exit(main())
