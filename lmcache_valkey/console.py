"""The ``lmcache-valkey`` console script: :func:`lmcache_valkey.cli.main` behind one guard.

A setting read while the package imports — ``LMCACHE_VALKEY_CRC32C``, which picks the
checksum library once per process (:mod:`lmcache_valkey.checksum`) — fails that import
with a ConfigError before the CLI's own error handling exists. Here it becomes what any
other bad setting is: one line on stderr (and, with ``--json``, one JSON object on stdout),
exit code 2.
"""

from __future__ import annotations

import json
import sys
from typing import Sequence

from .errors import ConfigError

EXIT_USAGE = 2  # (cli.EXIT_USAGE: that module is what may not import)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        from .cli import main as cli_main
    except ConfigError as e:
        args = sys.argv[1:] if argv is None else list(argv)
        print(f"lmcache-valkey: {e}", file=sys.stderr)
        if any(len(a) > 2 and "--json".startswith(a) for a in args):  # (argparse takes --js too)
            print(json.dumps({"ok": False, "error": str(e), "exit_code": EXIT_USAGE}))
        return EXIT_USAGE
    return cli_main(argv)
