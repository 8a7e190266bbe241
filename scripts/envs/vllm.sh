#!/usr/bin/env bash
# vLLM 0.33.0 (pins in [tool.lmcache-valkey.envs.vllm] of pyproject.toml) for the vLLM
# secondary-tier tests (tests/vllm_tier) and its benchmark, in .venv-vllm. The body is shared
# with vllm034.sh: scripts/envs/lib/vllm.sh. See scripts/envs/README.md for the
# setup/tests/owns contract.
ENV_NAME=vllm
ENV_TESTS="tests/vllm_tier"
ENV_OWNS="tests/vllm_tier"
# shellcheck source=lib/vllm.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/vllm.sh"
env_main "$@"
