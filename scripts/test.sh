#!/usr/bin/env bash
# Runs every test: formatting and lints, unit and property tests, the
# end-to-end suite against a real Envoy with the wasm filter, the control
# plane and simulated SGLang workers, the end-to-end suite again through the
# ext_proc front door, once more through ext_proc set up the way an
# InferencePool gateway sets up its endpoint picker, and a short fuzz run of
# the body handling; `docker compose up` of the demo and in front of outside
# workers. Installs what is missing first (a Docker engine and its base
# images included: scripts/docker-images.sh).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

ensure_debian_packages
ensure_wasm_target
ensure_venv
ensure_cargo_fuzz
for c in clippy rustfmt; do
  rustup component list --installed 2>/dev/null | grep -q "^$c" || rustup component add "$c"
done

cd "$ROOT"
# Everything the tests need is installed above: a test that finds Envoy, the
# filter or docker-compose missing must fail, not skip (the guards read CI).
export CI="${CI:-true}"
log "cargo fmt --check"
cargo fmt --all -- --check
log "cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
cargo clippy --release --target wasm32-wasip1 -p sglang-envoy-filter -- -D warnings

build_all

# docker compose, as the README runs it (tests/e2e/tests/compose.rs): a
# Docker engine and the base images (made here when no registry answers),
# then the project's images, built once for the whole run.
log "docker compose: engine, base images, the project's images"
"$ROOT/scripts/docker-images.sh"
docker compose --profile demo --profile ha build -q

log "cargo test (unit, property and end-to-end tests)"
SGLANG_ENVOY_BIN="$VENV/bin/envoy" cargo test --workspace -- --test-threads 2

log "end-to-end tests through the ext_proc front door"
SGLANG_ENVOY_FRONT_DOOR=ext_proc SGLANG_ENVOY_BIN="$VENV/bin/envoy" \
  cargo test -p sglang-envoy-e2e -- --test-threads 2

log "end-to-end tests through ext_proc set up as a gateway's endpoint picker"
SGLANG_ENVOY_FRONT_DOOR=picker SGLANG_ENVOY_BIN="$VENV/bin/envoy" \
  cargo test -p sglang-envoy-e2e -- --test-threads 2

log "fuzzing the body parsing and injection (short run)"
run_fuzz 25
