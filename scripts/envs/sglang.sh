#!/usr/bin/env bash
# SGLang 0.5.23 for the HiCache storage backend tests (tests/sglang_hicache) and its benchmark
# (benchmarks/bench_sglang.py), in .venv-sglang. The least of SGLang that imports
# sglang.srt.mem_cache.hicache_storage, the host pool classes (MHA, MLA) and the built-in
# `file` backend on a CPU machine: torch and torchvision as SGLang pins them, SGLang itself
# with --no-deps (both from [tool.lmcache-valkey.envs.sglang] in pyproject.toml), then this
# package with the sglang-test extra under CI's other constraints. See scripts/envs/README.md
# for the setup/tests/owns contract.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
VENV=.venv-sglang

log() { printf '[env sglang] %s\n' "$*" >&2; }

env_pins() {  # $1 = install | no-deps
    python3 - "$1" <<'PY'
import sys, tomllib
with open("pyproject.toml", "rb") as f:
    print(" ".join(tomllib.load(f)["tool"]["lmcache-valkey"]["envs"]["sglang"][sys.argv[1]]))
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
    want="$(cat pyproject.toml scripts/pins.py scripts/envs/sglang.sh | sha256sum | cut -c1-16)"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        return 0
    fi
    log "installing $(env_pins install), $(env_pins no-deps) without its requirements, and lmcache-valkey[sglang-test]"
    "$VENV/bin/pip" install -q --upgrade pip setuptools wheel
    # CI's constraints, except torch: this environment runs the torch SGLang pins.
    { python3 scripts/pins.py constraints | grep -v '^torch[=<>!~ ]'; env_pins install | tr ' ' '\n'; } \
        > "$VENV/constraints.txt"
    # shellcheck disable=SC2046
    "$VENV/bin/pip" install -q -c "$VENV/constraints.txt" $(env_pins install)
    # shellcheck disable=SC2046
    "$VENV/bin/pip" install -q --no-deps $(env_pins no-deps)
    "$VENV/bin/pip" install -q -c "$VENV/constraints.txt" -e ".[sglang-test]"
    "$VENV/bin/python" -W ignore -c "import sglang.srt.mem_cache.hicache_storage, sglang.srt.mem_cache.pool_host.mha, sglang.srt.mem_cache.pool_host.mla" \
        || { log "SGLang's storage and host pool modules do not import in $VENV"; exit 1; }
    echo "$want" > "$stamp"
}

case "${1:-}" in
    setup) setup ;;
    tests) echo "tests/sglang_hicache" ;;
    owns) echo "tests/sglang_hicache" ;;
    *) echo "usage: $0 setup|tests|owns" >&2; exit 2 ;;
esac
