#!/usr/bin/env bash
# Steps every extra test environment shares (scripts/envs/*.sh; contract in
# scripts/envs/README.md). The caller sets ENV_NAME (the environment is .venv-$ENV_NAME in
# the repository root), ENV_TESTS and ENV_OWNS (what `tests` and `owns` print), defines
# setup(), sources this file and ends with `env_main "$@"`. It lives under lib/, outside the
# `scripts/envs/*.sh` glob that scripts/test.sh runs.
#
#   log MSG...                 "[env NAME] MSG" on stderr
#   env_pins KEY [SECTION]     [tool.lmcache-valkey.envs.SECTION].KEY of pyproject.toml (a
#                              list), space-separated; SECTION defaults to ENV_NAME
#   env_begin FILE...          create the venv if missing (with $ENV_PYTHON, else $PYTHON,
#                              else python3); succeeds when something must be installed,
#                              fails when the stamp already records pyproject.toml,
#                              scripts/pins.py, this file and FILE... as they are now
#   env_constraints [REGEX]    CI's constraints ([tool.lmcache-valkey.ci]) without the
#                              packages REGEX matches, as $VENV/ci-constraints.txt
#   env_pip ARGS...            pip of the environment, quiet
#   env_done                   write the stamp (after the import check passed)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
cd "$ROOT"
: "${ENV_NAME:?ENV_NAME must be set by the environment script}"
VENV=".venv-$ENV_NAME"
ENV_STAMP="$VENV/.lmcache-valkey-installed"
ENV_WANT=""

log() { printf '[env %s] %s\n' "$ENV_NAME" "$*" >&2; }

env_pins() {  # $1 = key, $2 = section (default: this environment)
    python3 - "$1" "${2:-$ENV_NAME}" <<'PY'
import sys, tomllib
with open("pyproject.toml", "rb") as f:
    print(" ".join(tomllib.load(f)["tool"]["lmcache-valkey"]["envs"][sys.argv[2]][sys.argv[1]]))
PY
}

env_begin() {
    if [ ! -x "$VENV/bin/python" ]; then
        local py="${ENV_PYTHON:-${PYTHON:-python3}}"
        log "creating $VENV with $py"
        "$py" -m venv "$VENV"
    fi
    ENV_WANT="$(cat pyproject.toml scripts/pins.py scripts/envs/lib/env.sh "$@" | sha256sum | cut -c1-16)"
    if [ -f "$ENV_STAMP" ] && [ "$(cat "$ENV_STAMP")" = "$ENV_WANT" ]; then
        return 1
    fi
    return 0
}

env_constraints() {  # $1 = extended regex of package names to leave out (optional)
    if [ -n "${1:-}" ]; then
        python3 scripts/pins.py constraints | grep -Ev "^($1)[=<>!~ ]" > "$VENV/ci-constraints.txt" || true
    else
        python3 scripts/pins.py constraints > "$VENV/ci-constraints.txt"
    fi
}

env_pip() { "$VENV/bin/pip" install -q "$@"; }

env_done() { echo "$ENV_WANT" > "$ENV_STAMP"; }

env_main() {
    case "${1:-}" in
        setup) setup ;;
        tests) echo "${ENV_TESTS:-}" ;;
        owns) [ -z "${ENV_OWNS:-}" ] || echo "$ENV_OWNS" ;;
        *) echo "usage: $0 setup|tests|owns" >&2; exit 2 ;;
    esac
}
