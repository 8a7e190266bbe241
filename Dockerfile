# The image the Helm chart runs (ghcr.io/lmcache/lmcache-valkey): `lmcache-valkey tierd` (the
# tierd sidecar) and the reference Valkey module at /opt/lmcache-valkey/lmcv_blob.so (the
# chart's module init container copies it). Build: docker build -t lmcache-valkey .
#
# Every RUN step is docker/build.sh: tests/packaging/test_image.py runs the same steps on a
# machine without Docker, so the recipe is tested with each change.
ARG DEBIAN=bookworm
ARG VALKEY_TAG=8.1.1-bookworm

FROM debian:${DEBIAN}-slim AS build
COPY docker/build.sh /build.sh
RUN bash /build.sh build-deps
COPY . /src
RUN bash /build.sh venv /opt/lmcache-valkey
RUN VENV_PYTHON=/opt/lmcache-valkey/venv/bin/python bash /build.sh wheel /src /dist
RUN bash /build.sh install /dist /opt/lmcache-valkey
RUN bash /build.sh module /opt/lmcache-valkey
RUN bash /build.sh check /opt/lmcache-valkey

# Optional: Valkey with libfabric and the module baked in, for the chart's
# valkey.module.source=image (docker build --target valkey-module -t valkey-lmcv .). The
# module links libfabric, which the official Valkey image lacks.
FROM valkey/valkey:${VALKEY_TAG} AS valkey-module
COPY docker/build.sh /build.sh
RUN bash /build.sh valkey-deps && rm /build.sh
COPY --from=build /opt/lmcache-valkey/lmcv_blob.so /modules/lmcv_blob.so

FROM debian:${DEBIAN}-slim AS tierd
COPY docker/build.sh /build.sh
RUN bash /build.sh runtime-deps && rm /build.sh
COPY --from=build /opt/lmcache-valkey /opt/lmcache-valkey
ENV PATH=/opt/lmcache-valkey/venv/bin:$PATH
# The chart runs it as 999:999 with a read-only root filesystem: nothing here writes outside
# the volumes it mounts.
USER 999:999
ENTRYPOINT ["lmcache-valkey"]
CMD ["--help"]
