#!/usr/bin/env bash
# Python 3.13: the package imports and its unit, RESP, store and CLI tests pass there
# (.venv-py313). The body is shared: scripts/envs/lib/python.sh.
PY_VERSION=3.13
# shellcheck source=lib/python.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/python.sh"
env_main "$@"
