#!/usr/bin/env bash
# The GPU-side paths on one GPU machine, in one run, as one markdown table (docs/gpu-check.md):
# libfabric providers and which offer FI_HMEM; the endpoint module and the fabric binding built
# against the bundled libfabric; 4 and 32 MiB values GPU -> endpoint -> GPU (FI_HMEM) beside
# host-memory RMA and RESP; LMCache's GPU connector storing/loading KV through this plugin and
# time to first token, hit vs recompute, at 8K and 32K tokens.
#
#   bash benchmarks/gpu_bundle.sh                      # once, on a machine with network
#   bash benchmarks/gpu_check.sh [--out FILE]          # on the GPU machine (no network needed)
#   bash benchmarks/gpu_check.sh --dry-run [--quick]   # anywhere: every step but the GPU ones
#
# Options: --bundle DIR (default .gpu-bundle; without one: the system's libfabric and this
# Python's packages), --python PY (default python3), --out FILE (the table), --quick (fewer
# repetitions, a tiny model), --tokens 8192,32768, --budget-s N (the Python part's limit),
# --logs DIR (copy the logs there; the work folder under /tmp is removed at the end).
# A step that cannot work (no FI_HMEM provider, no GPU) says why in the table; the rest runs.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=gpu_common.sh
. "$ROOT/benchmarks/gpu_common.sh"

BUNDLE="$ROOT/.gpu-bundle"
PY=python3
OUT=""
DRY=0
QUICK=""
TOKENS=8192,32768
BUDGET=360
LOGS=""
while [ $# -gt 0 ]; do
    case "$1" in
        --bundle) BUNDLE="$2"; shift 2 ;;
        --python) PY="$2"; shift 2 ;;
        --out) OUT="$2"; shift 2 ;;
        --dry-run) DRY=1; shift ;;
        --quick) QUICK=--quick; shift ;;
        --tokens) TOKENS="$2"; shift 2 ;;
        --budget-s) BUDGET="$2"; shift 2 ;;
        --logs) LOGS="$2"; shift 2 ;;
        -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
        *) echo "gpu_check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
[ -d "$BUNDLE" ] && BUNDLE="$(cd "$BUNDLE" && pwd)"

WORK="$(mktemp -d /tmp/lmcv-gpu-check.XXXXXX)"
STEPS="$WORK/steps.tsv"
FIINFO="$WORK/fi_info.txt"
: > "$STEPS"
finish() {
    if [ -n "$LOGS" ]; then
        mkdir -p "$LOGS" && cp "$WORK"/steps.log "$WORK"/driver.log "$LOGS"/ 2>/dev/null
    fi
    rm -rf "$WORK"  # the model's weights among it
}
trap finish EXIT
log() { printf '[gpu_check] %s\n' "$*" >&2; }

# step NAME CMD...: runs CMD, records its seconds and status (the table's "step:" rows).
step() {
    local name="$1" t0 rc status
    shift
    t0="$(date +%s.%N)"
    "$@" >"$WORK/step.log" 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then status=ok; else status="failed ($(tail -c 300 "$WORK/step.log" | tr '\n\t|' '   '))"; fi
    printf '%s\t%s\t%s\n' "$name" "$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')" "$status" >> "$STEPS"
    log "$name: $status"
    cat "$WORK/step.log" >> "$WORK/steps.log"
    return $rc
}

GPU=0
if [ $DRY -eq 0 ] && command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    GPU=1
    log "GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
else
    log "no GPU step will run ($([ $DRY -eq 1 ] && echo --dry-run || echo 'no nvidia-smi / no GPU'))"
fi

# -- Python packages the machine lacks, from the bundle's wheels -------------------------------
PYVER="$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G "$BUNDLE/wheels/*.whl" >/dev/null; then
    if [ "$PYVER" = 3.12 ]; then
        step "install bundled wheels ($(ls "$BUNDLE"/wheels/*.whl | wc -l))" \
            "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" "$BUNDLE"/wheels/*.whl \
            && export PYTHONPATH="$WORK/site:$PYTHONPATH"
    else
        log "bundled wheels are for Python 3.12; $PY is $PYVER: using its own packages"
    fi
fi

# -- libfabric: the bundle's (CUDA-enabled) build, else the system's ---------------------------
use_libfabric() {  # PREFIX FI_INFO SOURCE
    LF="$1"; FI_INFO_BIN="$2"; LF_SOURCE="$3"
    if [ "$LF" != /usr ]; then export LD_LIBRARY_PATH="$LF/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
    export LMCACHE_VALKEY_LIBFABRIC_PREFIX="$LF"
}
if [ -x "$BUNDLE/libfabric/bin/fi_info" ]; then
    use_libfabric "$BUNDLE/libfabric" "$BUNDLE/libfabric/bin/fi_info" "bundled build (CUDA by dlopen)"
else
    use_libfabric /usr "$(command -v fi_info || echo fi_info)" "system"
fi
export XDG_CACHE_HOME="$WORK/cache"  # the binding is compiled fresh, against $LF

# libfabric dlopens "libcudart.so" (unversioned): point it at the CUDA runtime torch already
# loads (one copy in the process), else the toolkit's.
if [ $GPU -eq 1 ]; then
    CUDART="$("$PY" - <<'EOF' 2>/dev/null
import glob, importlib.util, os
spec = importlib.util.find_spec("torch")
base = os.path.dirname(os.path.dirname(spec.origin)) if spec and spec.origin else ""
hits = sorted(glob.glob(os.path.join(base, "nvidia", "**", "libcudart.so*"), recursive=True)) if base else []
print(hits[0] if hits else "")
EOF
)"
    [ -n "$CUDART" ] || CUDART="$(ls /usr/local/cuda/lib64/libcudart.so* 2>/dev/null | head -1)"
    [ -n "$CUDART" ] || CUDART="$(ldconfig -p | awk '/libcudart\.so/ {print $NF; exit}')"
    if [ -n "$CUDART" ]; then
        mkdir -p "$WORK/cudart" && ln -sf "$CUDART" "$WORK/cudart/libcudart.so"
        export LD_LIBRARY_PATH="$WORK/cudart${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        log "CUDA runtime for libfabric: $CUDART"
    else
        log "no libcudart.so found: libfabric cannot use CUDA memory"
    fi
fi

describe_libfabric() {
    local version providers hmem
    version="$("$FI_INFO_BIN" --version 2>/dev/null | awk '/^libfabric:/ {print $2}')"
    providers="$("$FI_INFO_BIN" -l 2>/dev/null | awk -F: '/^[a-z]/ {print $1}' | grep -v -e '^ofi_hook' -e '^off_coll' | paste -sd' ')"
    hmem="$("$FI_INFO_BIN" -c FI_HMEM -t FI_EP_RDM 2>/dev/null | awk '/provider:/ {print $2}' | sort -u | paste -sd' ')"
    printf 'version=%s\nsource=%s\nproviders=%s\nhmem=%s\n' "$version" "$LF_SOURCE" "$providers" "$hmem" > "$FIINFO"
    log "libfabric $version ($LF_SOURCE): providers $providers; FI_HMEM: ${hmem:-none}"
}

build_fabric() {  # the endpoint module and the cffi binding against $LF
    rm -rf "$WORK/endpoint" && cp -r "$ROOT/endpoint" "$WORK/endpoint" && rm -rf "$WORK/endpoint/build"
    step "build endpoint module against libfabric $LF" make -s -C "$WORK/endpoint" LIBFABRIC_PREFIX="$LF" || return 1
    step "build fabric binding (cffi)" "$PY" -c \
        'from lmcache_valkey.transport.fabric import binding; binding.load(); print(binding.libfabric_version())'
}

RMA_PROVIDERS="tcp;ofi_rxm,tcp,shm"
describe_libfabric
build_fabric

# A provider must register CUDA memory (FI_HMEM) for the GPU rows. When the bundled build
# cannot (its CUDA headers or dlopen do not fit this machine), rebuild libfabric here from
# the bundled source against this machine's CUDA, once, and use that.
# (libfabric's warnings go to steps.log: why a provider refused FI_HMEM or CUDA did not load.)
if [ $GPU -eq 1 ] && ! step "probe: register CUDA memory (FI_HMEM)" env FI_LOG_LEVEL=warn timeout 120 "$PY" \
        "$ROOT/benchmarks/gpu_check.py" probe-hmem --providers "$RMA_PROVIDERS"; then
    CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
    if [ -f "$BUNDLE/libfabric-src.tar.xz" ] && [ -f "$CUDA_HOME/include/cuda.h" ]; then
        rebuild() (
            mkdir -p "$WORK/lfsrc" && tar -C "$WORK/lfsrc" -xJf "$BUNDLE/libfabric-src.tar.xz" &&
            cd "$WORK"/lfsrc/libfabric-* && libfabric_configure "$WORK/libfabric" "$CUDA_HOME" &&
            libfabric_make -s -j"$(nproc)" && libfabric_make -s install
        )
        if step "rebuild libfabric from the bundle against $CUDA_HOME" rebuild; then
            use_libfabric "$WORK/libfabric" "$WORK/libfabric/bin/fi_info" "rebuilt on this machine against $CUDA_HOME"
            export XDG_CACHE_HOME="$WORK/cache2"
            describe_libfabric
            build_fabric
            step "probe again: register CUDA memory (FI_HMEM)" env FI_LOG_LEVEL=warn timeout 120 "$PY" \
                "$ROOT/benchmarks/gpu_check.py" probe-hmem --providers "$RMA_PROVIDERS"
        fi
    else
        log "no libfabric source in the bundle or no $CUDA_HOME/include/cuda.h: no rebuild; GPU RMA rows will say why"
    fi
fi

# -- the measurements -------------------------------------------------------------------------
ARGS=(run --module "$WORK/endpoint/build/lmcv_blob.so" --work "$WORK" --providers "$RMA_PROVIDERS"
      --fi-info "$FIINFO" --steps "$STEPS" --table "$WORK/table.md" --tokens "$TOKENS")
[ $DRY -eq 1 ] && ARGS+=(--dry-run)
[ -n "$QUICK" ] && ARGS+=("$QUICK")
PYTHONUNBUFFERED=1 timeout --kill-after=10 "$BUDGET" "$PY" "$ROOT/benchmarks/gpu_check.py" "${ARGS[@]}" >/dev/null 2>"$WORK/driver.log"
rc=$?
tail -n 40 "$WORK/driver.log" | grep -v '^\[gpu_check\]' >&2 || true
if [ ! -s "$WORK/table.md" ]; then
    log "the measurements did not finish (exit $rc, budget ${BUDGET} s): rows so far"
    { echo "| check | result | numbers | notes |"; echo "|---|---|---|---|"
      sed -n 's/^\[gpu_check\] \(.*\)$/| \1 | | | |/p' "$WORK/driver.log"
      echo "| run | stopped (exit $rc) | | budget ${BUDGET} s |"; } > "$WORK/table.md"
fi
[ -n "$OUT" ] && cp "$WORK/table.md" "$OUT"
cat "$WORK/table.md"
[ $rc -eq 0 ]
