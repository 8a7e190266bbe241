#!/usr/bin/env bash
# LMCache 0.5.7 line (pin in [tool.lmcache-valkey.envs.lmcache057] of pyproject.toml) for the
# LMCache tests — in-process plugin (tests/lmcache, tests/configs) and MP L2 adapter
# (tests/lmcache_mp) — in .venv-lmcache057. The main .venv runs the same tests on LMCache
# 0.5.6. torch's CPU build (CI's torch pin, [tool.lmcache-valkey.ci]) goes in first, so
# LMCache's unpinned torch requirement never pulls a CUDA build; the rest follows CI's
# constraints except LMCache's own. See scripts/envs/README.md for the setup/tests/owns
# contract.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
VENV=.venv-lmcache057

log() { printf '[env lmcache057] %s\n' "$*" >&2; }

pins() {
    python3 - <<'PY'
import tomllib
with open("pyproject.toml", "rb") as f:
    print(" ".join(tomllib.load(f)["tool"]["lmcache-valkey"]["envs"]["lmcache057"]["install"]))
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
    want="$(cat pyproject.toml scripts/pins.py scripts/envs/lmcache057.sh | sha256sum | cut -c1-16)"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        return 0
    fi
    log "installing torch (CPU), $(pins) and lmcache-valkey[server,s3,test]"
    "$VENV/bin/pip" install -q --upgrade pip wheel  # setuptools: LMCache 0.5.7 wants <81
    "$VENV/bin/pip" install -q "$(python3 scripts/pins.py pin torch)"
    python3 scripts/pins.py constraints | grep -v '^lmcache[=<>!~ ]' > "$VENV/ci-constraints.txt"
    # shellcheck disable=SC2046
    "$VENV/bin/pip" install -q --pre -c "$VENV/ci-constraints.txt" $(pins)
    "$VENV/bin/pip" install -q -c "$VENV/ci-constraints.txt" -e ".[server,s3,test]"
    "$VENV/bin/python" -c "import lmcache.inprocess, lmcache.v1.distributed.l2_adapters.plugin_l2_adapter" 2>/dev/null \
        || { log "LMCache 0.5.7 modules do not import in $VENV"; exit 1; }
    echo "$want" > "$stamp"
}

case "${1:-}" in
    setup) setup ;;
    tests) echo "tests/lmcache tests/configs tests/lmcache_mp" ;;
    owns) ;;
    *) echo "usage: $0 setup|tests|owns" >&2; exit 2 ;;
esac
