#!/usr/bin/env bash
# LMCache 0.5.7 line (pin in [tool.lmcache-valkey.envs.lmcache057] of pyproject.toml) for the
# LMCache tests — in-process plugin (tests/lmcache, tests/configs) and MP L2 adapter
# (tests/lmcache_mp) — in .venv-lmcache057. The main .venv runs the same tests on LMCache
# 0.5.6. torch's CPU build (CI's torch pin, [tool.lmcache-valkey.ci]) goes in first, so
# LMCache's unpinned torch requirement never pulls a CUDA build; the rest follows CI's
# constraints except LMCache's own. Shared steps: scripts/envs/lib/env.sh; see
# scripts/envs/README.md for the setup/tests/owns contract.
ENV_NAME=lmcache057
ENV_TESTS="tests/lmcache tests/configs tests/lmcache_mp"
ENV_OWNS=""
# shellcheck source=lib/env.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/env.sh"

setup() {
    env_begin scripts/envs/lmcache057.sh || return 0
    log "installing torch (CPU), $(env_pins install) and lmcache-valkey[server,s3,test]"
    env_pip --upgrade pip wheel  # setuptools: LMCache 0.5.7 wants <81
    env_pip "$(python3 scripts/pins.py pin torch)"
    env_constraints lmcache
    # No --pre: the exact pin names the release candidate, and --pre would let every other
    # package resolve to a pre-release too (it pulled httpx 1.0.dev6, which LMCache's own
    # cache-event sink cannot construct).
    # shellcheck disable=SC2046
    env_pip -c "$VENV/ci-constraints.txt" $(env_pins install)
    env_pip -c "$VENV/ci-constraints.txt" -e ".[server,s3,test]"
    "$VENV/bin/python" -c "import lmcache.inprocess, lmcache.v1.distributed.l2_adapters.plugin_l2_adapter" 2>/dev/null \
        || { log "LMCache 0.5.7 modules do not import in $VENV"; exit 1; }
    env_done
}

env_main "$@"
