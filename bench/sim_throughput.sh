#!/usr/bin/env bash
# kvroute-sim throughput: one sim process at --time-scale 0, wrk POSTing ~8 KB chat prompts.
# Usage: bench/sim_throughput.sh [duration_s] [connections]
# Env: KVROUTE_BUILD (default <repo>/build), MODE=shared|unique|both (default both),
#      PROMPT_BYTES (8192), MAX_TOKENS (16), STREAM=1 (SSE responses),
#      SIM_ARGS (extra kvroute-sim flags), EVENTS=1 (publish KV events to a bound PUB socket
#      with replay, no subscriber: the encoding cost without a reader).
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
if [ "${EVENTS:-0}" = 1 ]; then
  P1=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  P2=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  SIM_ARGS="${SIM_ARGS:-} --kv-events-bind bind --kv-events-endpoint tcp://127.0.0.1:$P1 --kv-events-replay-endpoint tcp://127.0.0.1:$P2"
fi
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
# CPU seconds and finished requests of the sim, from its own /metrics: CPU µs per request is
# the figure that does not depend on what else the machine runs.
snap() {
  curl -s "http://127.0.0.1:$PORT/metrics" |
    awk '/^process_cpu_seconds_total/ {c=$2} /^vllm:request_success_total/ {r=$2} END {print c, r}'
}
for m in $MODES; do
  read -r C0 R0 < <(snap)
  OUT=$(MODE=$m wrk -t1 -c"$CONNS" -d"${DUR}s" --latency -s bench/sim_throughput.lua \
        "http://127.0.0.1:$PORT/v1/chat/completions" 2>&1)
  RPS=$(echo "$OUT" | awk '/Requests\/sec/ {print $2}')
  LAT=$(echo "$OUT" | awk '/^    Latency/ {print $2}')
  NON2XX=$(echo "$OUT" | awk '/Non-2xx/ {print $5}')
  ERRS=$(echo "$OUT" | awk '/Socket errors/ {print $0}')
  read -r C1 R1 < <(snap)
  CPU_US=$(awk -v c0="$C0" -v c1="$C1" -v r0="$R0" -v r1="$R1" \
           'BEGIN { if (r1 > r0) printf "%.1f", (c1 - c0) * 1e6 / (r1 - r0); else print "n/a" }')
  echo "mode=$m stream=${STREAM:-0} events=${EVENTS:-0} prompt_bytes=${PROMPT_BYTES:-8192} max_tokens=${MAX_TOKENS:-16} conns=$CONNS requests_per_s=$RPS mean_latency=$LAT sim_cpu_us_per_request=$CPU_US non_2xx=${NON2XX:-0} ${ERRS}"
done
curl -s "http://127.0.0.1:$PORT/sim/stats"; echo
