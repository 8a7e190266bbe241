#!/usr/bin/env bash
# LMCache multiprocess (MP) mode -> lmcache-valkey: one LMCache MP server per node, serving
# vLLM through LMCacheMPConnector, with this package's L2 adapter as its shared tier. Every
# MP server given the same Valkey and tenant shares chunks with the others. Pick one adapter
# JSON (docs/lmcache-mp.md says what each key does):
#
#   mp-tcp.json       RESP over TCP (any Valkey, Cluster, TLS with valkeys:// and tls_* keys)
#   mp-fabric.json    libfabric RMA into the L1 arena (the server loads the lmcv_blob module;
#                     EFA on AWS, tcp;ofi_rxm elsewhere); the arena is registered once
#   mp-tiered.json    NVMe/S3 behind Valkey RAM through a tierd next to Valkey
#                     (`lmcache-valkey tierd ...`); locked chunks are leased in the tiers
#   mp-eviction.json  LMCache's own L2 eviction on this adapter's byte accounting: only when
#                     this MP server is the cache's only writer and Valkey's maxmemory is
#                     larger than max_capacity (docs/lmcache-mp.md, "Byte accounting")
#
# Password: LMCACHE_VALKEY_PASSWORD or LMCACHE_VALKEY_PASSWORD_FILE in the server's
# environment (never in the JSON, which shows up in process listings). The tenant's secret
# (`openssl rand -hex 32`, the same in every MP server of the tenant) from the file the JSON's
# tenant_secret_file names (or LMCACHE_VALKEY_TENANT_SECRET_FILE): a tenant other than
# "default" does not start without one unless it says require_tenant_secret: false.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ADAPTER="${1:-$HERE/mp-tcp.json}"

exec lmcache server \
  --host 0.0.0.0 --port 5555 \
  --chunk-size 256 \
  --l1-size-gb 20 --eviction-policy LRU \
  --l2-adapter "$(cat "$ADAPTER")"
