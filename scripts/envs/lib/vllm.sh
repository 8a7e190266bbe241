#!/usr/bin/env bash
# Shared body of the vLLM environments (scripts/envs/vllm.sh: vLLM 0.33.0 in .venv-vllm;
# scripts/envs/vllm034.sh: vLLM 0.34.0 in .venv-vllm034): the least of vLLM that imports its
# KV-offload tiering modules on a CPU machine. torch's CPU build (CI's torch pin,
# [tool.lmcache-valkey.ci] in pyproject.toml), vLLM itself with --no-deps (pins in
# [tool.lmcache-valkey.envs.<name>] no-deps), then this package with the vllm-test extra,
# which both releases' tiering modules import alike. The caller sets ENV_NAME, ENV_TESTS and
# ENV_OWNS, sources this file and calls env_main "$@".
# shellcheck source=env.sh
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"

setup() {
    env_begin scripts/envs/lib/vllm.sh "scripts/envs/$ENV_NAME.sh" || return 0
    local pins; pins="$(env_pins no-deps)"
    log "installing torch (CPU), $pins without their CUDA requirements, and lmcache-valkey[vllm-test]"
    env_pip --upgrade pip setuptools wheel
    env_pip "$(python3 scripts/pins.py pin torch)"
    # shellcheck disable=SC2086
    env_pip --no-deps $pins
    env_constraints
    env_pip -c "$VENV/ci-constraints.txt" -e ".[vllm-test]"
    "$VENV/bin/python" -c "import vllm.v1.kv_offload.tiering.spec" 2>/dev/null \
        || { log "vLLM's tiering modules do not import in $VENV"; exit 1; }
    env_done
}
