#!/usr/bin/env bash
# vLLM 0.33.0 for the vLLM secondary-tier tests (tests/vllm_tier) and its benchmark, in .venv-vllm.
# The least of vLLM that imports its KV-offload tiering modules on a CPU machine: torch's CPU
# build (CI's torch pin, [tool.lmcache-valkey.ci] in pyproject.toml), vLLM itself with --no-deps (pin in
# [tool.lmcache-valkey.envs.vllm]), then this package with the vllm-test extra. See
# scripts/envs/README.md for the setup/tests/owns contract.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
VENV=.venv-vllm

log() { printf '[env vllm] %s\n' "$*" >&2; }

no_deps_pins() {
    python3 - <<'EOF'
import tomllib
with open("pyproject.toml", "rb") as f:
    print(" ".join(tomllib.load(f)["tool"]["lmcache-valkey"]["envs"]["vllm"]["no-deps"]))
EOF
}

setup() {
    local py="${PYTHON:-python3}"
    if [ ! -x "$VENV/bin/python" ]; then
        log "creating $VENV"
        "$py" -m venv "$VENV"
    fi
    local stamp="$VENV/.lmcache-valkey-installed"
    local want
    want="$(cat pyproject.toml scripts/pins.py scripts/envs/vllm.sh | sha256sum | cut -c1-16)"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        return 0
    fi
    log "installing torch (CPU), vLLM without its CUDA requirements, and lmcache-valkey[vllm-test]"
    "$VENV/bin/pip" install -q --upgrade pip setuptools wheel
    "$VENV/bin/pip" install -q "$(python3 scripts/pins.py pin torch)"
    # shellcheck disable=SC2046
    "$VENV/bin/pip" install -q --no-deps $(no_deps_pins)
    python3 scripts/pins.py constraints > "$VENV/ci-constraints.txt"
    "$VENV/bin/pip" install -q -c "$VENV/ci-constraints.txt" -e ".[vllm-test]"
    "$VENV/bin/python" -c "import vllm.v1.kv_offload.tiering.spec" 2>/dev/null \
        || { log "vLLM's tiering modules do not import in $VENV"; exit 1; }
    echo "$want" > "$stamp"
}

case "${1:-}" in
    setup) setup ;;
    tests) echo "tests/vllm_tier" ;;
    owns) echo "tests/vllm_tier" ;;
    *) echo "usage: $0 setup|tests|owns" >&2; exit 2 ;;
esac
