#!/usr/bin/env bash
# Stops the host services that Debian's postinst may have started for packages scripts/setup.sh
# installs (redis-server, valkey-server, prometheus, prometheus-redis-exporter), and says which
# ones it stopped. Tests start their own servers on free ports, so a running host service would
# only hold ports and memory. Services that are not running are left alone.
set -uo pipefail
HOST_SERVICES=(redis-server valkey-server prometheus prometheus-redis-exporter)

log() { printf '[setup] %s\n' "$*" >&2; }

case "${1:-}" in
    --list) echo "${HOST_SERVICES[@]}"; exit 0 ;;
esac
command -v service >/dev/null 2>&1 || exit 0
for svc in "${HOST_SERVICES[@]}"; do
    if service "$svc" status >/dev/null 2>&1; then
        log "stopping the host service $svc (tests start their own servers on free ports)"
        service "$svc" stop >/dev/null 2>&1 || log "could not stop $svc; tests still use free ports"
    fi
done
exit 0
