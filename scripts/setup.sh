#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian/Ubuntu machine, as root: system packages
# (libfabric, Valkey 8 with TLS, Redis 7, Prometheus, fio), a virtual environment in
# .venv with this package and its extras, and the reference Valkey module in endpoint/.
# Re-running it does only what is missing.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export DEBIAN_FRONTEND=noninteractive

log() { printf '[setup] %s\n' "$*" >&2; }

APT_PACKAGES=(build-essential pkg-config libfabric-dev libfabric-bin libisal2 redis-server fio prometheus prometheus-redis-exporter openssl)
BACKPORTS_PACKAGES=(valkey-server valkey-tools)

have_all() { for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || return 1; done; }

add_backports_source() {
    # Valkey 8 (built with TLS) comes from bookworm-backports on Debian 12.
    [ -f /etc/apt/sources.list.d/bookworm-backports.sources ] && return 0
    . /etc/os-release
    [ "${VERSION_CODENAME:-}" = bookworm ] || return 0
    if [ -f /etc/apt/sources.list.d/debian.sources ]; then
        awk 'BEGIN{RS="";ORS="\n\n"} NR==1' /etc/apt/sources.list.d/debian.sources \
            | sed 's/^Suites:.*/Suites: bookworm-backports/' \
            > /etc/apt/sources.list.d/bookworm-backports.sources
    else
        echo "deb http://deb.debian.org/debian bookworm-backports main" \
            > /etc/apt/sources.list.d/bookworm-backports.list
    fi
}

if ! have_all "${APT_PACKAGES[@]}" "${BACKPORTS_PACKAGES[@]}"; then
    log "installing system packages"
    add_backports_source
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${APT_PACKAGES[@]}" >/dev/null
    . /etc/os-release
    if [ "${VERSION_CODENAME:-}" = bookworm ]; then
        apt-get install -y -qq --no-install-recommends -t bookworm-backports "${BACKPORTS_PACKAGES[@]}" >/dev/null
    else
        apt-get install -y -qq --no-install-recommends "${BACKPORTS_PACKAGES[@]}" >/dev/null || \
            log "valkey-server not available from apt here; TLS tests will be skipped"
    fi
fi
# Debian's postinst may start some of those as services: stop them, saying which.
bash scripts/stop-host-services.sh

PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    log "creating .venv"
    "$PY" -m venv .venv
fi
STAMP=.venv/.lmcache-valkey-installed
WANT="$(cat pyproject.toml scripts/pins.py | sha256sum | cut -c1-16)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
    log "installing Python packages into .venv (torch CPU build before lmcache)"
    .venv/bin/pip install -q --upgrade pip wheel  # setuptools: what LMCache asks for (<81)
    # CI's exact versions ([tool.lmcache-valkey.ci] in pyproject.toml) as pip constraints;
    # torch first and alone, so that lmcache's unpinned torch requirement is already
    # satisfied by the CPU build.
    python3 scripts/pins.py constraints > .venv/ci-constraints.txt
    .venv/bin/pip install -q -c .venv/ci-constraints.txt "$(python3 scripts/pins.py pin torch)"
    .venv/bin/pip install -q -c .venv/ci-constraints.txt -e ".[lmcache,server,s3,demo,test,bench]"
    echo "$WANT" > "$STAMP"
fi

if [ -f endpoint/Makefile ]; then
    make -s -C endpoint >/dev/null
fi
log "ready: $ROOT/.venv"
