#!/usr/bin/env bash
# SGLang 0.5.23 for the HiCache storage backend tests (tests/sglang_hicache) and its benchmark
# (benchmarks/bench_sglang.py), in .venv-sglang. The least of SGLang that imports
# sglang.srt.mem_cache.hicache_storage, the host pool classes (MHA, MLA) and the built-in
# `file` backend on a CPU machine: torch and torchvision as SGLang pins them, SGLang itself
# with --no-deps (both from [tool.lmcache-valkey.envs.sglang] in pyproject.toml), then this
# package with the sglang-test extra under CI's other constraints. Shared steps:
# scripts/envs/lib/env.sh; see scripts/envs/README.md for the setup/tests/owns contract.
ENV_NAME=sglang
ENV_TESTS="tests/sglang_hicache"
ENV_OWNS="tests/sglang_hicache"
# shellcheck source=lib/env.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/env.sh"

setup() {
    env_begin scripts/envs/sglang.sh || return 0
    log "installing $(env_pins install), $(env_pins no-deps) without its requirements, and lmcache-valkey[sglang-test]"
    env_pip --upgrade pip setuptools wheel
    # CI's constraints, except torch: this environment runs the torch SGLang pins.
    env_constraints torch
    env_pins install | tr ' ' '\n' >> "$VENV/ci-constraints.txt"
    # shellcheck disable=SC2046
    env_pip -c "$VENV/ci-constraints.txt" $(env_pins install)
    # shellcheck disable=SC2046
    env_pip --no-deps $(env_pins no-deps)
    env_pip -c "$VENV/ci-constraints.txt" -e ".[sglang-test]"
    "$VENV/bin/python" -W ignore -c "import sglang.srt.mem_cache.hicache_storage, sglang.srt.mem_cache.pool_host.mha, sglang.srt.mem_cache.pool_host.mla" \
        || { log "SGLang's storage and host pool modules do not import in $VENV"; exit 1; }
    env_done
}

env_main "$@"
