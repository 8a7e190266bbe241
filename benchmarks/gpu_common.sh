# Shared by benchmarks/gpu_bundle.sh (build here) and benchmarks/gpu_check.sh (rebuild on the
# GPU machine): how libfabric is configured. Sourced, not run.

# libfabric_configure PREFIX CUDA_DIR: run inside the unpacked source tree. Only the providers
# the check uses; CUDA by dlopen (libcudart.so, libcuda.so.1 at run time), so the build needs
# CUDA's headers only and the library needs nothing but libc.
libfabric_configure() {
    ./configure -q --prefix="$1" --enable-only --enable-tcp=yes --enable-rxm=yes --enable-shm=yes \
        --enable-sockets=yes --with-cuda="$2" --enable-cuda-dlopen --disable-static --with-uring=no
}

# libfabric_make ARGS...: make with the autotools switched off, so that a source tree whose
# generated files look stale fails here rather than on the GPU machine (which has none).
libfabric_make() {
    make ACLOCAL=false AUTOCONF=false AUTOMAKE=false AUTOHEADER=false "$@"
}
