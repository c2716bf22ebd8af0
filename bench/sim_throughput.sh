#!/usr/bin/env bash
# kvroute-sim throughput: one sim process at --time-scale 0, wrk POSTing ~8 KB chat prompts.
# Usage: bench/sim_throughput.sh [duration_s] [connections]
# Env: KVROUTE_BUILD (default <repo>/build), MODE=shared|unique|both (default both),
#      PROMPT_BYTES (8192), MAX_TOKENS (16), SIM_ARGS (extra kvroute-sim flags).
# Prints one line per mode: requests/s, mean latency, errors. Binds 127.0.0.1 only and stops
# the sim it started, by pid.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${KVROUTE_BUILD:-$PWD/build}"
DUR="${1:-10}"
CONNS="${2:-64}"
MODES="${MODE:-both}"
[ "$MODES" = both ] && MODES="shared unique"
command -v wrk >/dev/null || { echo "wrk is not installed (scripts/install-deps.sh)"; exit 1; }
[ -x "$BUILD/kvroute-sim" ] || { echo "no $BUILD/kvroute-sim; run make"; exit 1; }
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
LOG=$(mktemp)
# shellcheck disable=SC2086
"$BUILD/kvroute-sim" --port "$PORT" --model sim --time-scale 0 --seed 1 --log-level warn \
    ${SIM_ARGS:-} 2>"$LOG" &
SIM=$!
trap 'kill "$SIM" 2>/dev/null || true; wait "$SIM" 2>/dev/null || true; rm -f "$LOG"' EXIT
for _ in $(seq 1 100); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
  sleep 0.05
done
curl -sf "http://127.0.0.1:$PORT/health" >/dev/null || { echo "sim did not start"; cat "$LOG"; exit 1; }
for m in $MODES; do
  OUT=$(MODE=$m wrk -t1 -c"$CONNS" -d"${DUR}s" --latency -s bench/sim_throughput.lua \
        "http://127.0.0.1:$PORT/v1/chat/completions" 2>&1)
  RPS=$(echo "$OUT" | awk '/Requests\/sec/ {print $2}')
  LAT=$(echo "$OUT" | awk '/^    Latency/ {print $2}')
  NON2XX=$(echo "$OUT" | awk '/Non-2xx/ {print $5}')
  ERRS=$(echo "$OUT" | awk '/Socket errors/ {print $0}')
  echo "mode=$m prompt_bytes=${PROMPT_BYTES:-8192} max_tokens=${MAX_TOKENS:-16} conns=$CONNS requests_per_s=$RPS mean_latency=$LAT non_2xx=${NON2XX:-0} ${ERRS}"
done
curl -s "http://127.0.0.1:$PORT/sim/stats"; echo
