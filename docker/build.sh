#!/usr/bin/env bash
# Every step of the image build (Dockerfile), as one script so that the same steps run outside
# Docker too (tests/packaging/test_image.py runs them on the test machine):
#
#   build.sh build-deps [--print]      system packages to build the wheel and the module (apt)
#   build.sh runtime-deps [--print]    system packages the image needs at run time (apt)
#   build.sh valkey-deps [--print]     what the module needs in a Valkey image (apt: libfabric)
#   build.sh venv PREFIX               a virtual environment in PREFIX/venv
#   build.sh wheel SRC DIST            the lmcache-valkey wheel of the source tree SRC, into DIST
#   build.sh install DIST PREFIX       that wheel (with the s3 extra) into PREFIX/venv
#   build.sh module PREFIX             PREFIX/lmcv_blob.so, built by the installed package
#                                      (`lmcache-valkey endpoint build`, as a pip user would)
#   build.sh check PREFIX              the installed CLI runs and the module is there
#
# PYTHON (default python3) creates the environment.
set -euo pipefail

BUILD_DEPS=(python3 python3-venv build-essential libfabric-dev ca-certificates)
RUNTIME_DEPS=(python3 ca-certificates libisal2)
VALKEY_DEPS=(libfabric1)

log() { printf '[image] %s\n' "$*" >&2; }

apt_install() {
    if [ "${1:-}" = "--print" ]; then shift; echo "$@"; return 0; fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "$@" >/dev/null
    rm -rf /var/lib/apt/lists/*
}

step="${1:-}"; shift || true
case "$step" in
    build-deps)
        if [ "${1:-}" = "--print" ]; then apt_install --print "${BUILD_DEPS[@]}"; else apt_install "${BUILD_DEPS[@]}"; fi ;;
    runtime-deps)
        if [ "${1:-}" = "--print" ]; then apt_install --print "${RUNTIME_DEPS[@]}"; else apt_install "${RUNTIME_DEPS[@]}"; fi ;;
    valkey-deps)
        if [ "${1:-}" = "--print" ]; then apt_install --print "${VALKEY_DEPS[@]}"; else apt_install "${VALKEY_DEPS[@]}"; fi ;;
    venv)
        prefix="${1:?venv PREFIX}"
        log "creating $prefix/venv"
        mkdir -p "$prefix"
        "${PYTHON:-python3}" -m venv "$prefix/venv"
        "$prefix/venv/bin/pip" install -q --upgrade pip ;;
    wheel)
        src="${1:?wheel SRC DIST}"; dist="${2:?wheel SRC DIST}"
        log "building the wheel of $src into $dist"
        mkdir -p "$dist"
        # pip of the build environment: Debian's system pip refuses to run (PEP 668)
        "${VENV_PYTHON:-${PYTHON:-python3}}" -m pip wheel -q --no-deps -w "$dist" "$src" ;;
    install)
        dist="${1:?install DIST PREFIX}"; prefix="${2:?install DIST PREFIX}"
        wheels=("$dist"/lmcache_valkey-*.whl)
        [ "${#wheels[@]}" -eq 1 ] && [ -f "${wheels[0]}" ] || { log "expected one lmcache_valkey wheel in $dist"; exit 1; }
        log "installing ${wheels[0]##*/} with the s3 extra"
        "$prefix/venv/bin/pip" install -q "${wheels[0]}[s3]" ;;
    module)
        prefix="${1:?module PREFIX}"
        "$prefix/venv/bin/lmcache-valkey" endpoint build --out "$prefix" ;;
    check)
        prefix="${1:?check PREFIX}"
        "$prefix/venv/bin/lmcache-valkey" --version
        [ -x "$prefix/lmcv_blob.so" ] || { log "$prefix/lmcv_blob.so is missing"; exit 1; } ;;
    *)
        sed -n '2,17p' "$0" >&2; exit 2 ;;
esac
