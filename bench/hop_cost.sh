#!/usr/bin/env bash
# The router's own cost: the same requests (same trace, seed, arrivals) at the same load, once
# sent straight to one kvroute-sim and once through kvroute in front of one kvroute-sim (a fresh
# sim each time), at time scale 1 so model time is wall time. Prints TTFT p50/p99 of both and
# the difference (the hop). Usage: bench/hop_cost.sh [RATE] [MAX_REQUESTS] [FORMAT TRACE]
# (defaults 2 sessions/s, 400 requests of tau-bench). Every process is stopped by pid.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${KVROUTE_BUILD:-$ROOT/build}
RATE=${1:-2}
MAXREQ=${2:-400}
FORMAT=${3:-tau}
TRACE=${4:-$ROOT/data/tau-bench-airline-gpt4o}
WORK=$(mktemp -d /tmp/kvroute-hop.XXXXXX)
PIDS=()
cleanup() {
    for p in ${PIDS[@]+"${PIDS[@]}"}; do kill "$p" 2>/dev/null || true; done
    for p in ${PIDS[@]+"${PIDS[@]}"}; do wait "$p" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_ok() {
    for _ in $(seq 100); do
        [ "$(curl -s -o /dev/null -m 1 -w '%{http_code}' "$1" || true)" = 200 ] && return 0
        sleep 0.1
    done
    echo "hop_cost.sh: $1 did not answer" >&2
    return 1
}
run() { # NAME: a fresh sim, optionally kvroute, then the replay
    local name=$1 sp rp url
    sp=$(port)
    "$BUILD/kvroute-sim" --port "$sp" --model m --time-scale 1 >"$WORK/$name-sim.log" 2>&1 &
    local sim=$!
    PIDS+=("$sim")
    wait_ok "http://127.0.0.1:$sp/health"
    url="http://127.0.0.1:$sp"
    local router=""
    if [ "$name" = routed ]; then
        rp=$(port)
        "$BUILD/kvroute" --worker "$url" --model m --policy cache_aware --port "$rp" \
            >"$WORK/router.log" 2>&1 &
        router=$!
        PIDS+=("$router")
        wait_ok "http://127.0.0.1:$rp/healthz"
        url="http://127.0.0.1:$rp"
    fi
    "$BUILD/kvroute-bench" --url "$url" --model m --trace "$TRACE" --format "$FORMAT" \
        --rate "$RATE" --max-requests "$MAXREQ" --think-ms 200 --time-scale 1 --seed 1 \
        --progress none --json "$WORK/$name.json" >/dev/null
    kill "$sim" ${router:+"$router"} 2>/dev/null || true
    wait "$sim" ${router:+"$router"} 2>/dev/null || true
}
run direct
run routed
python3 - "$WORK/direct.json" "$WORK/routed.json" "$RATE" "$MAXREQ" <<'PY'
import json, sys
d, r = (json.load(open(p)) for p in sys.argv[1:3])
print("router hop: %s requests at %s sessions/s, time scale 1 (model = wall)" % (sys.argv[4], sys.argv[3]))
print("%-8s %10s %10s %10s %10s %8s" % ("", "TTFT p50", "TTFT p90", "TTFT p99", "E2E p50", "errors"))
for name, j in (("direct", d), ("kvroute", r)):
    t = j["ttft_s"]
    print("%-8s %8.2f ms %8.2f ms %8.2f ms %8.1f ms %8d" % (name, 1e3 * t["p50"], 1e3 * t["p90"],
          1e3 * t["p99"], 1e3 * j["e2e_s"]["p50"], j["errors"]))
print("hop: TTFT p50 +%.2f ms, p99 +%.2f ms" % (1e3 * (r["ttft_s"]["p50"] - d["ttft_s"]["p50"]),
                                                 1e3 * (r["ttft_s"]["p99"] - d["ttft_s"]["p99"])))
PY
