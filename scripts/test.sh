#!/usr/bin/env bash
# Runs the whole test suite on a fresh Debian/Ubuntu machine (as root): set-up first,
# then pytest. Extra arguments go to pytest (e.g. `bash scripts/test.sh tests/unit -x`).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
# pytest exits 5 when it collected no test: that is a failure here, like any other non-zero.
exec .venv/bin/python -m pytest -q -ra "${@:-tests}"
