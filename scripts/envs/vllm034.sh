#!/usr/bin/env bash
# vLLM 0.34.0 (pins in [tool.lmcache-valkey.envs.vllm034] of pyproject.toml) for the vLLM
# secondary-tier tests, in .venv-vllm034: what 0.34 changed (deferred release, its manager
# and metrics) and the tier's contract; the cross-process test that no 0.34 change reaches
# runs on 0.33 only (vllm.sh). The body is shared: scripts/envs/lib/vllm.sh.
ENV_NAME=vllm034
ENV_TESTS="tests/vllm_tier --deselect tests/vllm_tier/test_vllm_two_servers.py::test_each_server_loads_what_the_other_computed"
ENV_OWNS="tests/vllm_tier"
# shellcheck source=lib/vllm.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/vllm.sh"
env_main "$@"
