#!/usr/bin/env bash
# Sets up what is missing, builds, and runs Envoy + the control plane in front
# of SGLang workers. With no --worker-urls, two simulated SGLang workers are
# started as the demo backend. Any other flag goes to the control plane, e.g.
#   scripts/quickstart.sh --worker-urls http://10.0.0.5:30001 http://10.0.0.6:30001 --policy round_robin
# The TLS flags (--ca-cert-paths, --client-cert-path, --client-key-path)
# configure Envoy's connections to https:// workers as well, e.g.
#   scripts/quickstart.sh --worker-urls https://10.0.0.5:30001 --ca-cert-paths ca.pem \
#     --client-cert-path router.pem --client-key-path router.key
# Ports: clients 30000 (PORT), control plane admin 30010, gRPC 30011,
# Envoy admin 9901, simulated workers 31001-31002.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

PORT="${PORT:-30000}"
CP_ADMIN_PORT="${CP_ADMIN_PORT:-30010}"
CP_GRPC_PORT="${CP_GRPC_PORT:-30011}"
ENVOY_ADMIN_PORT="${ENVOY_ADMIN_PORT:-9901}"

ensure_debian_packages
ensure_wasm_target
ensure_venv
build_all

RUN="$ROOT/.run"; mkdir -p "$RUN"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

cp_args=("$@")
# shellcheck disable=SC2207 # two words, no globs
cp_args+=($(quickstart_policy "$@"))
if ! printf '%s\n' "$@" | grep -q -- '--worker-urls'; then
  urls=()
  for p in 31001 31002; do
    log "starting simulated SGLang worker on :$p"
    "$ROOT/target/release/sglang-sim-worker" --port "$p" >"$RUN/worker-$p.log" 2>&1 &
    pids+=($!)
    urls+=("http://127.0.0.1:$p")
  done
  for u in "${urls[@]}"; do wait_http "$u/health" 30; done
  cp_args+=(--worker-urls "${urls[@]}")
fi

log "starting the control plane (admin :$CP_ADMIN_PORT, gRPC :$CP_GRPC_PORT)"
"$ROOT/target/release/sglang-envoy-control-plane" --admin-port "$CP_ADMIN_PORT" --grpc-port "$CP_GRPC_PORT" \
  "${cp_args[@]}" >"$RUN/control-plane.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$CP_ADMIN_PORT/health" 60

# Envoy talks TLS to https:// workers with the control plane's certificates.
worker_tls_from_flags "$@"
# Browsers from --cors-allowed-origins get Envoy's CORS answers.
cors_from_flags "$@"
# --enable-trace: Envoy traces to the control plane's collector too.
tracing_from_flags "$@"
# --tls-cert-path/--tls-key-path: clients reach Envoy over TLS.
listen_tls_from_flags "$@"
scheme=http; curl_tls=()
if [ -n "$LISTEN_TLS_CERT" ]; then scheme=https; curl_tls=(-k); fi
render_envoy_config "$RUN/envoy.yaml" 127.0.0.1 "$PORT" "$ENVOY_ADMIN_PORT" 127.0.0.1 "$CP_GRPC_PORT" "$CP_ADMIN_PORT"
log "starting Envoy on :$PORT"
"$VENV/bin/envoy" -c "$RUN/envoy.yaml" --concurrency 2 --log-level warn --use-dynamic-base-id >"$RUN/envoy.log" 2>&1 &
pids+=($!)
wait_http "$scheme://127.0.0.1:$PORT/health" 60 ${curl_tls[@]+"${curl_tls[@]}"}

cat <<MSG

sglang-envoy is running on $scheme://127.0.0.1:$PORT (logs in $RUN). Try:

  curl -s ${curl_tls[*]+${curl_tls[*]} }$scheme://127.0.0.1:$PORT/v1/chat/completions -H 'content-type: application/json' \\
    -d '{"model":"default","messages":[{"role":"user","content":"Hello"}],"max_tokens":8}'
  curl -s ${curl_tls[*]+${curl_tls[*]} }$scheme://127.0.0.1:$PORT/get_loads

Ctrl-C stops everything.
MSG
wait -n "${pids[@]}"
