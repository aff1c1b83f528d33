# Images for docker-compose.yml. One build stage compiles everything the
# native scripts build (scripts/lib.sh build_all), with the same commands:
#   the wasm filter   -> target `filter`        (copies it into a volume Envoy mounts)
#   the control plane -> target `control-plane` (the default)
#   the sim worker    -> target `sim-worker`    (demo backend, no GPU)
#   the wasm filter as an OCI image -> target `wasm-image` (deploy/envoy-gateway/wasm.yaml)
# Build one by hand with e.g. `docker build --target control-plane -t sglang-envoy-control-plane .`
#
# Plain Dockerfile syntax (no BuildKit-only features), so the classic builder
# of docker-compose v1 builds it as well as `docker compose` v2.

# rust:1-bookworm is the newest stable Rust on Debian bookworm, matching the
# runtime image's glibc below.
ARG RUST_IMAGE=rust:1-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

FROM ${RUST_IMAGE} AS build
RUN rustup target add wasm32-wasip1
WORKDIR /src
COPY . .
RUN cargo build --release --locked --target wasm32-wasip1 -p sglang-envoy-filter \
 && cargo build --release --locked -p sglang-envoy-control-plane -p sglang-sim-worker \
 && mkdir -p /out \
 && cp target/wasm32-wasip1/release/sglang_envoy_filter.wasm \
       target/release/sglang-envoy-control-plane \
       target/release/sglang-sim-worker /out/

# The runtime base: curl for the compose health checks and the demo's worker
# registration.
FROM ${RUNTIME_IMAGE} AS runtime
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/*
USER nobody

# The wasm filter. Its command copies the filter into /filter, where compose
# mounts the volume Envoy loads it from (fresh on every `up`, so a rebuilt
# filter is never shadowed by an old copy in the volume).
FROM runtime AS filter
COPY --from=build /out/sglang_envoy_filter.wasm /usr/local/share/sglang-envoy/sglang_envoy_filter.wasm
USER root
CMD ["cp", "/usr/local/share/sglang-envoy/sglang_envoy_filter.wasm", "/filter/sglang_envoy_filter.wasm"]

# The simulated SGLang worker (tests/sim-worker).
FROM runtime AS sim-worker
COPY --from=build /out/sglang-sim-worker /usr/local/bin/sglang-sim-worker
EXPOSE 31001
ENTRYPOINT ["sglang-sim-worker"]
CMD ["--host", "0.0.0.0", "--port", "31001"]

# The wasm filter as an image for Envoy Gateway's (and Istio's) wasm
# `code.type: Image`: one layer holding /plugin.wasm, the layout both pull.
FROM scratch AS wasm-image
COPY --from=build /out/sglang_envoy_filter.wasm /plugin.wasm

# The control plane: admin API + metrics on 30010, gRPC (filter + EDS) on 30011.
FROM runtime AS control-plane
COPY --from=build /out/sglang-envoy-control-plane /usr/local/bin/sglang-envoy-control-plane
EXPOSE 30010 30011
ENTRYPOINT ["sglang-envoy-control-plane"]
CMD ["--host", "0.0.0.0", "--admin-port", "30010", "--grpc-port", "30011"]
