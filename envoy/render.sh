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
# overridden with ENVOY_TEMPLATE. ADMIN_ROUTES=off drops the routes that
# expose the control plane's admin API on the client port (the block between
# `# BEGIN admin-routes` and `# END admin-routes`); default on.
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

# One sed expression per placeholder; values are escaped for sed.
script=""
for name in LISTEN_HOST LISTEN_PORT ENVOY_ADMIN_PORT CONTROL_PLANE_HOST \
    CONTROL_PLANE_GRPC_PORT CONTROL_PLANE_ADMIN_PORT MAX_BODY_BYTES MAX_CONNECTIONS \
    FILTER_WASM FILTER_OPTIONS; do
  eval "value=\${$name:-}"
  if [ -z "$value" ] && [ "$name" != FILTER_OPTIONS ]; then
    echo "render.sh: $name is not set" >&2
    exit 2
  fi
  escaped=$(printf '%s\n' "$value" | sed -e 's/[\\|&]/\\&/g')
  script="${script}s|{{$name}}|$escaped|g
"
done

case "${ADMIN_ROUTES:-on}" in
  on) ;;
  off) script="${script}/# BEGIN admin-routes/,/# END admin-routes/d
" ;;
  *) echo "render.sh: ADMIN_ROUTES must be on or off" >&2; exit 2 ;;
esac

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
