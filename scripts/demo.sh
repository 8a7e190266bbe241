#!/usr/bin/env bash
# The demo: an embedded Valkey, worker A prefills a long shared prefix and stores its KV
# chunks through LMCache; worker B, a separate process, reuses them for a new question.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
exec "$ROOT/.venv/bin/lmcache-valkey" demo "$@"
