#!/bin/sh
# Renders the Envoy config template envoy/envoy.yaml (beside this script) into
# OUT, then runs COMMAND if one is given. The one place the template's
# placeholders are filled: scripts/lib.sh (quick start, test.sh) and the Envoy
# container of docker-compose.yml both run this script. POSIX sh, so it runs
# in the official Envoy image as well as on the host.
#
#   render.sh OUT [COMMAND ARGS...]
#
# Placeholder values come from the environment, one variable per placeholder
# {{NAME}}: LISTEN_HOST LISTEN_PORT ENVOY_ADMIN_PORT CONTROL_PLANE_HOST
# CONTROL_PLANE_GRPC_PORT CONTROL_PLANE_ADMIN_PORT FILTER_WASM, and
# MAX_BODY_BYTES (default 33554432, the filter's 32 MiB), MAX_CONNECTIONS
# (default 10000 client connections) and FILTER_OPTIONS (default empty:
# more members of the wasm filter's JSON configuration, written with a
# leading comma, e.g. `, "body_idle_timeout_ms": 8000`). The template can be
# overridden with ENVOY_TEMPLATE. ADMIN_ROUTES=on keeps the routes that
# expose the control plane's admin API (reading the workers, loads and
# metrics; changes to the workers, which need its admin credential) on the
# client port: the block between `# BEGIN admin-routes` and
# `# END admin-routes`. Default off, so a rendered config shows clients only
# the inference endpoints and the control plane's /health, /liveness and
# /readiness; the quick start (scripts/lib.sh) turns it on.
#
# TLS to https:// workers, the control plane's flags of the same meaning in
# brackets (all optional, default empty):
#   WORKER_CA_CERTS      CA files (PEM), space-separated, that workers'
#                        certificates are verified with (--ca-cert-paths).
#                        They and the system's roots (SYSTEM_CA_BUNDLE,
#                        default /etc/ssl/certs/ca-certificates.crt) are
#                        written to OUT.worker-ca.pem, the file the template's
#                        {{WORKER_CA_CERTS}} then names; empty: the system's
#                        roots alone. With neither, Envoy gets no TLS socket
#                        for https workers (a warning says so).
#   WORKER_CLIENT_CERT   client certificate presented to workers (mTLS)
#                        (--client-cert-path), with WORKER_CLIENT_KEY
#   WORKER_CLIENT_KEY    (--client-key-path): both or neither. Empty drops
#                        the block between `# BEGIN worker-client-cert` and
#                        `# END worker-client-cert`.
# Relative paths are made absolute, and every file must be readable here.
#
# CORS (the control plane's --cors-allowed-origins; scripts/lib.sh passes
# them on): CORS_ALLOWED_ORIGINS, space-separated origins such as
# `https://app.example.com http://localhost:3000` (`*`: any origin),
# answered by Envoy's CORS filter. Empty (the default) drops the block
# between `# BEGIN cors` and `# END cors`: no cross-origin access.
#
# TLS to clients (the control plane's --tls-cert-path and --tls-key-path;
# scripts/lib.sh passes them on): LISTEN_TLS_CERT (PEM chain) and
# LISTEN_TLS_KEY (PEM key), both or neither; the listener then speaks TLS
# only (h2 and http/1.1 by ALPN). Empty: plaintext.
#
# Tracing (the control plane's --enable-trace and --otlp-traces-endpoint;
# scripts/lib.sh passes them on): OTLP_TRACES_ENDPOINT, `host:port` of an
# OTLP/gRPC collector. Empty (the default) drops the block between
# `# BEGIN tracing` and `# END tracing`.
set -eu

if [ $# -lt 1 ]; then
  echo "usage: $0 OUT [COMMAND ARGS...]" >&2
  exit 2
fi
out=$1
shift
here=$(CDPATH='' cd -- "$(dirname -- "$0")" && pwd)
template=${ENVOY_TEMPLATE:-$here/envoy.yaml}
MAX_BODY_BYTES=${MAX_BODY_BYTES:-33554432}
MAX_CONNECTIONS=${MAX_CONNECTIONS:-10000}
FILTER_OPTIONS=${FILTER_OPTIONS:-}
WORKER_CA_CERTS=${WORKER_CA_CERTS:-}
WORKER_CLIENT_CERT=${WORKER_CLIENT_CERT:-}
WORKER_CLIENT_KEY=${WORKER_CLIENT_KEY:-}
LISTEN_TLS_CERT=${LISTEN_TLS_CERT:-}
LISTEN_TLS_KEY=${LISTEN_TLS_KEY:-}
SYSTEM_CA_BUNDLE=${SYSTEM_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
CORS_ALLOWED_ORIGINS=${CORS_ALLOWED_ORIGINS:-}
OTLP_TRACES_ENDPOINT=${OTLP_TRACES_ENDPOINT:-}
OTLP_TRACES_ENDPOINT=${OTLP_TRACES_ENDPOINT#http://}
case $OTLP_TRACES_ENDPOINT in
  *[!A-Za-z0-9.:_-]*)
    echo "render.sh: OTLP_TRACES_ENDPOINT must be host:port, got $OTLP_TRACES_ENDPOINT" >&2
    exit 2 ;;
esac

# The origins become the CorsPolicy's string matchers (what
# {{CORS_ALLOWED_ORIGINS}} stands for in the template). An origin is
# scheme://host[:port] (or `*`): anything else is refused here rather than
# written into YAML.
cors_matchers=""
set -f # `*` is an origin here, not a file pattern
for origin in $CORS_ALLOWED_ORIGINS; do
  case $origin in
    '*') matcher='{prefix: ""}' ;;
    http://*|https://*)
      case $origin in
        *[!A-Za-z0-9.:/_-]*)
          echo "render.sh: CORS_ALLOWED_ORIGINS: not an origin: $origin" >&2
          exit 2 ;;
      esac
      matcher="{exact: \"$origin\"}" ;;
    *)
      echo "render.sh: CORS_ALLOWED_ORIGINS: not an origin (scheme://host[:port] or *): $origin" >&2
      exit 2 ;;
  esac
  cors_matchers="${cors_matchers:+$cors_matchers, }$matcher"
done
set +f
CORS_ALLOWED_ORIGINS=$cors_matchers

# absolute NAME PATH: PATH, readable, as an absolute path (Envoy may run
# elsewhere than the caller's directory).
absolute() {
  if [ ! -r "$2" ] || [ -d "$2" ]; then
    echo "render.sh: $1: cannot read $2" >&2
    exit 2
  fi
  case $2 in
    /*) printf '%s\n' "$2" ;;
    *) printf '%s/%s\n' "$(CDPATH='' cd -- "$(dirname -- "$2")" && pwd)" "$(basename -- "$2")" ;;
  esac
}

worker_tls=on
if [ -n "$WORKER_CA_CERTS" ]; then
  bundle=$(CDPATH='' cd -- "$(dirname -- "$out")" && pwd)/$(basename -- "$out").worker-ca.pem
  cas=""
  for ca in $WORKER_CA_CERTS; do
    ca=$(absolute WORKER_CA_CERTS "$ca")
    cas="$cas $ca"
  done
  : > "$bundle.tmp.$$"
  for ca in $cas; do
    cat "$ca" >> "$bundle.tmp.$$"
    echo >> "$bundle.tmp.$$"
  done
  if [ -r "$SYSTEM_CA_BUNDLE" ]; then cat "$SYSTEM_CA_BUNDLE" >> "$bundle.tmp.$$"; fi
  mv "$bundle.tmp.$$" "$bundle"
  WORKER_CA_CERTS=$bundle
elif [ -r "$SYSTEM_CA_BUNDLE" ]; then
  WORKER_CA_CERTS=$SYSTEM_CA_BUNDLE
else
  echo "render.sh: no CA certificates (WORKER_CA_CERTS is empty and $SYSTEM_CA_BUNDLE is missing): Envoy cannot reach https:// workers" >&2
  worker_tls=off
fi
# both_or_neither CERT_VAR KEY_VAR: "on" when both are set, "off" when
# neither is; an error otherwise.
both_or_neither() {
  eval "pair_cert=\${$1} pair_key=\${$2}"
  if [ -n "$pair_cert" ] && [ -n "$pair_key" ]; then
    echo on
  elif [ -z "$pair_cert" ] && [ -z "$pair_key" ]; then
    echo off
  else
    echo "render.sh: $1 and $2 must be set together" >&2
    exit 2
  fi
}
client_cert=$(both_or_neither WORKER_CLIENT_CERT WORKER_CLIENT_KEY)
if [ "$client_cert" = on ]; then
  WORKER_CLIENT_CERT=$(absolute WORKER_CLIENT_CERT "$WORKER_CLIENT_CERT")
  WORKER_CLIENT_KEY=$(absolute WORKER_CLIENT_KEY "$WORKER_CLIENT_KEY")
fi
listen_tls=$(both_or_neither LISTEN_TLS_CERT LISTEN_TLS_KEY)
if [ "$listen_tls" = on ]; then
  LISTEN_TLS_CERT=$(absolute LISTEN_TLS_CERT "$LISTEN_TLS_CERT")
  LISTEN_TLS_KEY=$(absolute LISTEN_TLS_KEY "$LISTEN_TLS_KEY")
fi

# One sed expression per placeholder; values are escaped for sed.
script=""
for name in LISTEN_HOST LISTEN_PORT ENVOY_ADMIN_PORT CONTROL_PLANE_HOST \
    CONTROL_PLANE_GRPC_PORT CONTROL_PLANE_ADMIN_PORT MAX_BODY_BYTES MAX_CONNECTIONS \
    FILTER_WASM FILTER_OPTIONS WORKER_CA_CERTS WORKER_CLIENT_CERT WORKER_CLIENT_KEY \
    CORS_ALLOWED_ORIGINS OTLP_TRACES_ENDPOINT LISTEN_TLS_CERT LISTEN_TLS_KEY; do
  eval "value=\${$name:-}"
  case $name in
    FILTER_OPTIONS | WORKER_CA_CERTS | WORKER_CLIENT_CERT | WORKER_CLIENT_KEY | CORS_ALLOWED_ORIGINS | OTLP_TRACES_ENDPOINT \
      | LISTEN_TLS_CERT | LISTEN_TLS_KEY) ;;
    *)
      if [ -z "$value" ]; then
        echo "render.sh: $name is not set" >&2
        exit 2
      fi
      ;;
  esac
  escaped=$(printf '%s\n' "$value" | sed -e 's/[\\|&]/\\&/g')
  script="${script}s|{{$name}}|$escaped|g
"
done

case "${ADMIN_ROUTES:-off}" in
  on) ;;
  off) script="${script}/# BEGIN admin-routes/,/# END admin-routes/d
" ;;
  *) echo "render.sh: ADMIN_ROUTES must be on or off" >&2; exit 2 ;;
esac
if [ "$worker_tls" = off ]; then
  script="${script}/# BEGIN worker-tls/,/# END worker-tls/d
"
fi
if [ "$listen_tls" = on ]; then
  script="${script}/# BEGIN listen-plain/,/# END listen-plain/d
"
else
  script="${script}/# BEGIN listen-tls/,/# END listen-tls/d
"
fi
if [ -z "$OTLP_TRACES_ENDPOINT" ]; then
  script="${script}/# BEGIN tracing/,/# END tracing/d
"
fi
if [ -z "$CORS_ALLOWED_ORIGINS" ]; then
  script="${script}/# BEGIN cors/,/# END cors/d
"
fi
if [ "$client_cert" = off ]; then
  script="${script}/# BEGIN worker-client-cert/,/# END worker-client-cert/d
"
fi

tmp="$out.tmp.$$"
sed -e "$script" "$template" > "$tmp"
if grep -n '{{' "$tmp" >&2; then
  echo "render.sh: placeholders left unfilled in $template (above)" >&2
  rm -f "$tmp"
  exit 2
fi
mv "$tmp" "$out"

if [ $# -gt 0 ]; then
  exec "$@"
fi
