#!/usr/bin/env bash
# Runs the whole test suite on a fresh Debian/Ubuntu machine (as root): set-up first,
# then pytest in the main environment (.venv), then in every extra environment described
# by scripts/envs/*.sh (other Pythons, other engine releases; see scripts/envs/README.md).
#   bash scripts/test.sh                      # everything (what CI runs)
#   bash scripts/test.sh tests/unit -x        # main environment only, with these pytest args
#   bash scripts/test.sh --env NAME [args]    # one extra environment only
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"

envs() { ls scripts/envs/*.sh 2>/dev/null | sort; }

run_env() {  # $1 = script; rest = pytest args (default: what the script names)
    local script="$1"; shift
    local name; name="$(basename "$script" .sh)"
    bash "$script" setup
    local args=("$@")
    if [ ${#args[@]} -eq 0 ]; then
        read -r -a args <<< "$(bash "$script" tests)"
    fi
    echo "[test] environment $name: pytest ${args[*]}" >&2
    ".venv-$name/bin/python" -m pytest -q -ra "${args[@]}"
}

if [ "${1:-}" = "--env" ]; then
    name="${2:?--env needs a name}"; shift 2
    run_env "scripts/envs/$name.sh" "$@"
    exit $?
fi

# pytest exits 5 when it collected no test: that is a failure here, like any other non-zero.
if [ $# -gt 0 ]; then
    exec .venv/bin/python -m pytest -q -ra "$@"
fi

ignores=()
for script in $(envs); do
    for path in $(bash "$script" owns); do ignores+=("--ignore=$path"); done
done
# A first full run installs about 22 GB of environments (sglang's alone is 6 GB, a CUDA torch
# build); say up front what the disk has, so that "No space left on device" from pip later
# is read for what it is.
free_gb=$(df -Pk "$ROOT" | awk 'NR==2 {printf "%d", $4 / 1048576}')
built=$( (ls -d .venv-* 2>/dev/null || true) | wc -l)
echo "[test] ${free_gb} GB free under $ROOT; extra environments already built: $built of $(envs | wc -l)" >&2
if [ "$built" -eq 0 ] && [ "$free_gb" -lt 22 ]; then
    echo "[test] warning: a first full run needs about 22 GB free for its environments" >&2
fi
status=0
.venv/bin/python -m pytest -q -ra "${ignores[@]}" tests || status=$?
for script in $(envs); do
    run_env "$script" || status=$?
done
exit $status
