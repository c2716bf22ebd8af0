#!/usr/bin/env bash
# Policy comparison: replays one trace against a fresh fleet of kvroute-sim workers behind
# kvroute, once per policy, plus once with no router against a single kvroute-sim holding the
# whole fleet's KV capacity (the pooled bound: perfect pooling, the best any routing over that
# fleet could reach). Prints one table; --json and --png write it. Usage: docs/bench.md.
#
# With --dp N each policy runs three times over the same KV capacity and compute: --workers
# kvroute-sims of N data-parallel ranks each (kvroute-sim --data-parallel-size N) routed
# rank-aware (kvroute --worker URL@N: run "POLICY-dp"), the same sims as plain workers (the
# engine spreads header-less requests over its ranks itself: "POLICY-plain"), and --workers x N
# separate sims ("POLICY-separate"); the pooled bound holds all --workers x N ranks' capacity.
#
# With precise in --policies every worker of every run also publishes vLLM KV events (ZeroMQ PUB
# and replay sockets on free 127.0.0.1 ports) and kvroute subscribes to them (--kv-events), so
# all policies run on the same fleet set-up. --bypass-share sends a share of the requests
# straight to a random worker, past kvroute, as another router or a direct client would.
#
# Every process this script starts listens on 127.0.0.1, is recorded by pid, and is stopped
# (SIGTERM, then SIGKILL after a bounded wait) when its run ends and again by the EXIT trap.
# Every wait is bounded.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${KVROUTE_BUILD:-$ROOT/build}

usage() {
    cat <<'EOF'
usage: scripts/compare.sh --trace FILE|DIR --format F --json OUT [options]

  --trace FILE|DIR        trace to replay (as kvroute-bench --trace)
  --format F              tau | sweagent | sharegpt | mtbench | mooncake | azure
  --json OUT              write {"bound_hit_rate", "policies": {...}} here
  --png OUT               also draw hit rate and TTFT per policy (gnuplot)
  --workers N             workers in the fleet (default 4)
  --dp N                  data-parallel ranks per worker (default 1): each policy runs as
                          POLICY-dp (N-rank sims routed rank-aware, --worker URL@N),
                          POLICY-plain (the same sims as plain workers) and POLICY-separate
                          (workers x N separate sims); adds "dp" to --json
  --policies LIST         comma-separated (default round_robin,least_load,consistent_hash,cache_aware;
                          any of kvroute's, e.g. precise: then every run's workers publish KV
                          events and kvroute subscribes to them)
  --bypass-share F        share of requests (0..1, default 0) sent straight to a random worker,
                          not through kvroute (kvroute-bench --bypass-share); they still count in
                          hit rate and TTFT. The pooled-bound run has no router and no bypass
  --kv-blocks N           KV capacity of one worker, blocks (default 32768 = 512Ki tokens;
                          see docs/bench.md for why this puts the fleet under cache pressure)
  --block-size N          tokens per KV block (default 16, vLLM's)
  --time-scale F          sim wall time per model time, and trace/think time scale (default 0.05);
                          every time reported is in model seconds (wall ÷ F)
  --max-requests N        replay the first N requests (default: all)
  --concurrency N         closed loop with N sessions (default for conversation traces: 16)
  --rate R                Poisson session arrivals per model second
  --timestamps            the trace's arrival times (default for mooncake and azure)
  --think-ms MS           mean think time between turns before scaling (default 1000)
  --seed S                seed for the bench and the sims (default 1)
  --no-bound              skip the pooled-bound run
  --sweep [R1,R2,...]     latency under load instead of one replay: kvroute-bench --sweep at these
                          rates (sessions per model second) for every run; without a list the
                          pooled bound runs --sweep-auto (ramp to its saturation, then 10 %..120 %
                          of it) and every policy is swept at the rates it chose. Adds each run's
                          "sweep" to --json, an SLO table, and OUT-ttft.png / OUT-goodput.png
                          beside --png OUT
  --sweep-duration S      model seconds of arrivals per rate (kvroute-bench, default 60)
  --sweep-points N        rates of an automatic sweep (default 6)
  --slo-ttft-ms MS        goodput SLO on TTFT, model ms (default 2000)
  --slo-itl-ms MS         goodput SLO on mean inter-token latency, model ms (default 100)
  --profile NAME          kvroute-sim timing profile for every sim (kvroute-sim --profile NAME)
  --sim-args "A B ..."    extra kvroute-sim arguments for every sim, split on spaces
  --bench-arg ARG         extra kvroute-bench argument (repeatable)
  --sim-arg ARG           extra kvroute-sim argument for every worker (repeatable)
  --router-arg ARG        extra kvroute argument (repeatable)
  --replay-timeout S      bound on one replay, seconds (default 900)
  --replicas N            kvroute replicas per policy run (default 1); the bench spreads the
                          requests over them per request (round robin), as a load balancer would
  --shared-state S        with --replicas > 1: redis (default; this script starts a redis-server
                          on a free 127.0.0.1 port, one key prefix per run) or none (each replica
                          learns alone)
  --pd P:D                prefill/decode disaggregation: every policy run's fleet is P
                          kvroute-sim --role prefill and D --role decode workers behind
                          kvroute --prefill/--decode (vLLM mode; the policy is the prefill
                          side's); hit rate is the prefill side's, and the table adds TTFT p90
                          and prefill calls per request (--workers becomes P + D)
  --keep                  keep the work directory (logs, per-run JSON) and print its path
EOF
}

TRACE="" FORMAT="" JSON_OUT="" PNG_OUT=""
WORKERS=4
DP=1
POLICIES="round_robin,least_load,consistent_hash,cache_aware"
KV_BLOCKS=32768
BLOCK_SIZE=16
TIME_SCALE=0.05
MAX_REQUESTS=0
MODE_ARGS=()
THINK_MS=1000
SEED=1
BOUND=1
BENCH_EXTRA=() SIM_EXTRA=() ROUTER_EXTRA=()
REPLAY_TIMEOUT=900
KEEP=0
BYPASS_SHARE=0
MODEL=kvroute-sim-model
REPLICAS=1 SHARED=redis
PD=""
SWEEP=0 SWEEP_RATES="" SWEEP_DURATION=60 SWEEP_POINTS=6 SLO_TTFT_MS=2000 SLO_ITL_MS=100 PROFILE=""

need() { [ $# -ge 2 ] || { echo "compare.sh: $1 needs a value" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
    case "$1" in
    --trace) need "$@"; TRACE=$2; shift 2 ;;
    --format) need "$@"; FORMAT=$2; shift 2 ;;
    --json) need "$@"; JSON_OUT=$2; shift 2 ;;
    --png) need "$@"; PNG_OUT=$2; shift 2 ;;
    --workers) need "$@"; WORKERS=$2; shift 2 ;;
    --dp) need "$@"; DP=$2; shift 2 ;;
    --policies) need "$@"; POLICIES=$2; shift 2 ;;
    --kv-blocks) need "$@"; KV_BLOCKS=$2; shift 2 ;;
    --block-size) need "$@"; BLOCK_SIZE=$2; shift 2 ;;
    --time-scale) need "$@"; TIME_SCALE=$2; shift 2 ;;
    --max-requests) need "$@"; MAX_REQUESTS=$2; shift 2 ;;
    --concurrency) need "$@"; MODE_ARGS=(--concurrency "$2"); shift 2 ;;
    --rate) need "$@"; MODE_ARGS=(--rate "$2"); shift 2 ;;
    --timestamps) MODE_ARGS=(--timestamps); shift ;;
    --think-ms) need "$@"; THINK_MS=$2; shift 2 ;;
    --seed) need "$@"; SEED=$2; shift 2 ;;
    --no-bound) BOUND=0; shift ;;
    --bench-arg) need "$@"; BENCH_EXTRA+=("$2"); shift 2 ;;
    --sweep)
        SWEEP=1
        if [ $# -ge 2 ] && [[ "$2" != --* ]]; then SWEEP_RATES=$2; shift 2; else shift; fi ;;
    --sweep-duration) need "$@"; SWEEP_DURATION=$2; shift 2 ;;
    --sweep-points) need "$@"; SWEEP_POINTS=$2; shift 2 ;;
    --slo-ttft-ms) need "$@"; SLO_TTFT_MS=$2; shift 2 ;;
    --slo-itl-ms) need "$@"; SLO_ITL_MS=$2; shift 2 ;;
    --profile) need "$@"; PROFILE=$2; SIM_EXTRA+=(--profile "$2"); shift 2 ;;
    --sim-args) need "$@"; read -r -a _sa <<<"$2"; SIM_EXTRA+=(${_sa[@]+"${_sa[@]}"}); shift 2 ;;
    --sim-arg) need "$@"; SIM_EXTRA+=("$2"); shift 2 ;;
    --router-arg) need "$@"; ROUTER_EXTRA+=("$2"); shift 2 ;;
    --replay-timeout) need "$@"; REPLAY_TIMEOUT=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    --replicas) need "$@"; REPLICAS=$2; shift 2 ;;
    --shared-state) need "$@"; SHARED=$2; shift 2 ;;
    --bypass-share) need "$@"; BYPASS_SHARE=$2; shift 2 ;;
    --pd) need "$@"; PD=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "compare.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
done
[ -n "$TRACE" ] && [ -n "$FORMAT" ] && [ -n "$JSON_OUT" ] || { usage >&2; exit 2; }
PD_P=0 PD_D=0
if [ -n "$PD" ]; then
    [[ "$PD" =~ ^([1-9][0-9]?):([1-9][0-9]?)$ ]] || { echo "compare.sh: --pd wants P:D (e.g. 2:2)" >&2; exit 2; }
    PD_P=${BASH_REMATCH[1]} PD_D=${BASH_REMATCH[2]}
    WORKERS=$((PD_P + PD_D))
    [ "$BYPASS_SHARE" = 0 ] || { echo "compare.sh: --pd and --bypass-share do not combine" >&2; exit 2; }
    [ "$DP" = 1 ] || { echo "compare.sh: --pd and --dp do not combine" >&2; exit 2; }
fi
for n in "$WORKERS" "$DP" "$KV_BLOCKS" "$BLOCK_SIZE" "$MAX_REQUESTS" "$SEED" "$REPLAY_TIMEOUT"; do
    [[ "$n" =~ ^[0-9]+$ ]] || { echo "compare.sh: '$n' is not a non-negative integer" >&2; exit 2; }
done
[ "$WORKERS" -ge 1 ] || { echo "compare.sh: --workers must be at least 1" >&2; exit 2; }
[ "$DP" -ge 1 ] && [ "$DP" -le 64 ] || { echo "compare.sh: --dp must be 1..64" >&2; exit 2; }
# Engines (rank-aware or separate) of the fleet: what the bound and the gate are sized for.
FLEET=$((WORKERS * DP))
[[ "$REPLICAS" =~ ^[0-9]+$ ]] && [ "$REPLICAS" -ge 1 ] && [ "$REPLICAS" -le 16 ] ||
    { echo "compare.sh: --replicas must be 1..16" >&2; exit 2; }
case "$SHARED" in redis | none) ;; *) echo "compare.sh: --shared-state is redis or none" >&2; exit 2 ;; esac
python3 -c 'import sys; v = float(sys.argv[1]); sys.exit(0 if 0 <= v <= 1 else 1)' "$BYPASS_SHARE" \
    2>/dev/null || { echo "compare.sh: --bypass-share must be a number in 0..1" >&2; exit 2; }
if [ "$SWEEP" = 1 ]; then
    python3 - "$SWEEP_RATES" "$SWEEP_DURATION" "$SWEEP_POINTS" "$SLO_TTFT_MS" "$SLO_ITL_MS" <<'PY' ||
import math, sys
rates, dur, pts, a, b = sys.argv[1:]
ok = all(math.isfinite(float(x)) and float(x) > 0 for x in [dur, a, b]) and 2 <= int(pts) <= 64
ok = ok and (rates == "" or all(math.isfinite(float(r)) and float(r) > 0 for r in rates.split(",")))
sys.exit(0 if ok else 1)
PY
        { echo "compare.sh: bad --sweep rates, --sweep-duration, --sweep-points or SLO values" >&2; exit 2; }
    if [ -z "$SWEEP_RATES" ] && [ "$BOUND" = 0 ]; then
        echo "compare.sh: --sweep without rates finds them on the pooled bound; drop --no-bound or give rates" >&2
        exit 2
    fi
fi
BYPASS=0
python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) > 0 else 1)' "$BYPASS_SHARE" && BYPASS=1

for b in kvroute kvroute-sim kvroute-bench; do
    [ -x "$BUILD/$b" ] || { echo "compare.sh: $BUILD/$b is missing (run make)" >&2; exit 1; }
done
if [ ${#MODE_ARGS[@]} -eq 0 ]; then
    case "$FORMAT" in
    mooncake | azure) MODE_ARGS=(--timestamps) ;;
    *) MODE_ARGS=(--concurrency 16) ;;
    esac
fi

# The overload gate's absolute threshold (--balance-abs-threshold, 32 by default, SGLang's) is
# sized for fleets with hundreds of requests in flight. A closed-loop replay of C sessions never
# has more than C in flight, so with the default one worker that is first credited with a shared
# system prompt takes every session (docs/performance.md, tau-bench). Size the gate to the
# replay instead: C / workers in flight above the least loaded, unless --router-arg sets it.
if [ "$SWEEP" = 0 ] && [ "${MODE_ARGS[0]:-}" != "--timestamps" ] && [ "${MODE_ARGS[0]:-}" != "--rate" ] &&
    [[ " ${ROUTER_EXTRA[*]-} " != *balance-abs-threshold* ]]; then
    conc=${MODE_ARGS[1]:-16}
    gate=$((conc / FLEET))
    [ "$gate" -ge 2 ] || gate=2
    ROUTER_EXTRA+=("--balance-abs-threshold=$gate")
fi
IFS=, read -r -a POLICY_LIST <<<"$POLICIES"
# precise needs the workers' KV events; then every run gets them, so policies differ only by name.
KV_EVENTS=0
for p in "${POLICY_LIST[@]}"; do [ "$p" = precise ] && KV_EVENTS=1; done
# A data-parallel sim publishes every rank's events on its one endpoint (kvroute dispatches
# them by data_parallel_rank), so --kv-events URL=EP needs no per-rank ports.
DP_SIM=()
[ "$DP" -gt 1 ] && DP_SIM=(--data-parallel-size "$DP" --kv-events-dp shared)

WORK=$(mktemp -d /tmp/kvroute-compare.XXXXXX)
PIDS=()

# Stops the given pids: SIGTERM, up to 5 s for them to exit, then SIGKILL. Only pids this script
# started are ever passed here.
stop_pids() {
    local pid alive i
    for pid in "$@"; do kill -TERM "$pid" 2>/dev/null || true; done
    for i in $(seq 50); do
        alive=0
        for pid in "$@"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        [ $alive = 0 ] && break
        sleep 0.1
    done
    for pid in "$@"; do kill -KILL "$pid" 2>/dev/null || true; done
    for pid in "$@"; do wait "$pid" 2>/dev/null || true; done
}

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [ ${#PIDS[@]} -gt 0 ]; then stop_pids "${PIDS[@]}"; fi
    if [ "$KEEP" = 1 ] || [ $rc != 0 ]; then
        echo "compare.sh: logs and per-run results kept in $WORK" >&2
    else
        rm -rf "$WORK"
    fi
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# wait_http URL SECONDS PID: until URL answers 200, the process dies, or the time is up.
wait_http() {
    local url=$1 secs=$2 pid=$3 i
    for i in $(seq $((secs * 10))); do
        if ! kill -0 "$pid" 2>/dev/null; then return 1; fi
        if [ "$(curl -s -o /dev/null -m 1 -w '%{http_code}' "$url" 2>/dev/null)" = 200 ]; then return 0; fi
        sleep 0.1
    done
    return 1
}

# start_sim NAME KV_BLOCKS SEED [extra args…]: starts one worker; sets SIM_PID and SIM_URL.
# The sim's time scale is $SIM_TIME_SCALE when set, else $TIME_SCALE. With SIM_EVENTS=1 it also
# binds a KV-event PUB and a replay socket on free 127.0.0.1 ports and sets SIM_KV to kvroute's
# --kv-events value for it (URL=tcp://PUB,tcp://REPLAY).
start_sim() {
    local name=$1 blocks=$2 seed=$3 port try ts=${SIM_TIME_SCALE:-$TIME_SCALE} pub rep ev
    shift 3
    for try in 1 2 3; do
        port=$(free_port)
        ev=()
        SIM_KV=""
        if [ "${SIM_EVENTS:-0}" = 1 ]; then
            pub=$(free_port)
            rep=$(free_port)
            while [ "$pub" = "$port" ]; do pub=$(free_port); done
            while [ "$rep" = "$port" ] || [ "$rep" = "$pub" ]; do rep=$(free_port); done
            ev=(--kv-events-endpoint "tcp://127.0.0.1:$pub" --kv-events-replay-endpoint
                "tcp://127.0.0.1:$rep" --kv-events-bind bind)
        fi
        "$BUILD/kvroute-sim" --port "$port" --model "$MODEL" --kv-blocks "$blocks" \
            --block-size "$BLOCK_SIZE" --time-scale "$ts" --seed "$seed" ${ev[@]+"${ev[@]}"} \
            ${SIM_EXTRA[@]+"${SIM_EXTRA[@]}"} "$@" >"$WORK/$name.log" 2>&1 &
        SIM_PID=$!
        PIDS+=("$SIM_PID")
        SIM_URL="http://127.0.0.1:$port"
        [ ${#ev[@]} -eq 0 ] || SIM_KV="$SIM_URL=tcp://127.0.0.1:$pub,tcp://127.0.0.1:$rep"
        if wait_http "$SIM_URL/health" 15 "$SIM_PID"; then return 0; fi
        stop_pids "$SIM_PID"
    done
    echo "compare.sh: kvroute-sim did not start; log:" >&2
    tail -20 "$WORK/$name.log" >&2
    return 1
}

# start_router POLICY URL…: sets ROUTER_PID and ROUTER_URL. Each entry of the KV_ARGS array
# (URL=tcp://PUB,tcp://REPLAY) becomes a --kv-events flag.
start_router() {
    local policy=$1 port try args=() u i=0
    shift
    # --pd: the first PD_P URLs are the prefill workers, the rest decode workers.
    for u in "$@"; do
        i=$((i + 1))
        if [ "$PD_P" = 0 ]; then args+=(--worker "$u")
        elif [ "$i" -le "$PD_P" ]; then args+=(--prefill "$u")
        else args+=(--decode "$u"); fi
    done
    [ "$PD_P" = 0 ] || args+=(--pd-prefill-policy "$policy")
    for u in ${KV_ARGS[@]+"${KV_ARGS[@]}"}; do args+=(--kv-events "$u"); done
    for try in 1 2 3; do
        port=$(free_port)
        "$BUILD/kvroute" "${args[@]}" --policy "$policy" --host 127.0.0.1 --port "$port" \
            ${ROUTER_EXTRA[@]+"${ROUTER_EXTRA[@]}"} ${REPLICA_ARGS[@]+"${REPLICA_ARGS[@]}"} \
            >"$WORK/router-$policy${ROUTER_TAG:-}.log" 2>&1 &
        ROUTER_PID=$!
        PIDS+=("$ROUTER_PID")
        ROUTER_URL="http://127.0.0.1:$port"
        if wait_http "$ROUTER_URL/healthz" 15 "$ROUTER_PID"; then
            # Ready once it sees its workers healthy (bounded; /readyz may not exist).
            local i code
            for i in $(seq 100); do
                code=$(curl -s -o /dev/null -m 1 -w '%{http_code}' "$ROUTER_URL/readyz" 2>/dev/null || true)
                [ "$code" = 200 ] || [ "$code" = 404 ] && break
                sleep 0.1
            done
            return 0
        fi
        stop_pids "$ROUTER_PID"
    done
    echo "compare.sh: kvroute did not start; log:" >&2
    tail -20 "$WORK/router-$policy${ROUTER_TAG:-}.log" >&2
    return 1
}

# scrape URL…: prints "hits queries missing": the workers' vLLM prefix-cache counters summed, and
# how many workers gave none (each is asked up to 3 times; a missed worker must not pass for one
# that served nothing).
scrape() {
    local u hits=0 queries=0 missing=0 h q try body
    for u in "$@"; do
        body=""
        for try in 1 2 3; do
            body=$(curl -s -m 10 "$u/metrics" 2>/dev/null || true)
            grep -q '^vllm:prefix_cache_queries_total[{ ]' <<<"$body" && break
            body=""
            sleep 1
        done
        if [ -z "$body" ]; then
            echo "compare.sh: warning: no prefix-cache counters from $u/metrics; using the bench's usage sums" >&2
            missing=$((missing + 1))
            continue
        fi
        read -r h q < <(awk '
            /^vllm:prefix_cache_hits_total[{ ]/ { h += $NF }
            /^vllm:prefix_cache_queries_total[{ ]/ { q += $NF }
            END { printf "%.0f %.0f\n", h, q }' <<<"$body")
        hits=$((hits + h))
        queries=$((queries + q))
    done
    echo "$hits $queries $missing"
}

# warn_refused LOG…: a worker that refused client connections (its connection caps) turned
# requests into transfer errors or kvroute retries; say so rather than let it pass as routing.
warn_refused() {
    local n
    n=$(cat "$@" 2>/dev/null | grep -c 'refusing a connection' || true)
    [ "${n:-0}" = 0 ] || echo "compare.sh: warning: workers refused $n client connections (kvroute-sim logs: \"refusing a connection\"); rerun with --keep to read them" >&2
}

# replay NAME URL [BYPASS_WORKER_URL…]: runs kvroute-bench, leaving $WORK/NAME.json and
# NAME.txt. With worker URLs and --bypass-share, that share of requests goes to them directly.
replay() {
    local name=$1 url=$2 rc=0 u
    shift 2
    local mode=("${MODE_ARGS[@]}")
    if [ "$SWEEP" = 1 ]; then
        if [ -n "$SWEEP_RATES" ]; then mode=(--sweep "$SWEEP_RATES"); else mode=(--sweep-auto); fi
        mode+=(--sweep-duration "$SWEEP_DURATION" --sweep-points "$SWEEP_POINTS"
            --slo-ttft-ms "$SLO_TTFT_MS" --slo-itl-ms "$SLO_ITL_MS")
    fi
    local urlargs=(--url "$url")
    if [ "$name" != bound ] && [ ${#ROUTER_URLS[@]} -gt 1 ]; then
        urlargs=()
        for u in "${ROUTER_URLS[@]}"; do urlargs+=(--url "$u"); done
    fi
    local args=("${urlargs[@]}" --model "$MODEL" --trace "$TRACE" --format "$FORMAT"
        "${mode[@]}" --time-scale "$TIME_SCALE" --think-ms "$THINK_MS" --seed "$SEED"
        --json "$WORK/$name.json" --progress lines)
    [ "$MAX_REQUESTS" -gt 0 ] && args+=(--max-requests "$MAX_REQUESTS")
    if [ "$BYPASS" = 1 ] && [ $# -gt 0 ]; then
        args+=(--bypass-share "$BYPASS_SHARE")
        for u in "$@"; do args+=(--bypass-worker "$u"); done
    fi
    # In the background and waited for, so a signal to this script runs its trap at once
    # (the trap's SIGTERM reaches kvroute-bench through timeout, which forwards it).
    timeout --signal=INT --kill-after=10 "$REPLAY_TIMEOUT" "$BUILD/kvroute-bench" "${args[@]}" \
        ${BENCH_EXTRA[@]+"${BENCH_EXTRA[@]}"} >"$WORK/$name.txt" 2>"$WORK/$name.bench.log" &
    local bench_pid=$!
    PIDS+=("$bench_pid")
    wait "$bench_pid" || rc=$?
    if [ ! -s "$WORK/$name.json" ]; then
        echo "compare.sh: kvroute-bench failed for $name (exit $rc):" >&2
        tail -5 "$WORK/$name.bench.log" >&2
        return 1
    fi
    [ $rc = 0 ] || echo "compare.sh: $name replay ended early (exit $rc); numbers cover what ran" >&2
    return 0
}

echo "compare.sh: $FORMAT trace $TRACE, $WORKERS workers x $KV_BLOCKS blocks of $BLOCK_SIZE tokens, time scale $TIME_SCALE, ${MODE_ARGS[*]}, bypass share $BYPASS_SHARE$([ "$KV_EVENTS" = 1 ] && echo ", KV events on")" >&2

# Sims of the fleet get the same seeds in every run, so runs differ only by the policy.
if [ "$BOUND" = 1 ]; then
    # One worker with the whole fleet's KV capacity, and its compute too: the fleet's batch
    # slots and tokens per step (kvroute-sim's defaults 256 and 8192, times the workers) at a
    # time scale divided by the workers, so it serves the fleet's load without the queueing
    # one small worker would add (queued requests hold KV blocks and would lower the bound).
    # With a --profile the batch limits are the profile's (unknown here): the bound keeps them
    # and gets the fleet's compute from the time scale alone.
    extra=()
    [ -n "$PROFILE" ] || extra=(--max-num-seqs $((256 * FLEET)) --max-num-batched-tokens $((8192 * FLEET)))
    BOUND_TIME_SCALE=$(python3 -c "print($TIME_SCALE / $FLEET)")
    echo "compare.sh: pooled bound: one kvroute-sim with $((FLEET * KV_BLOCKS)) blocks ${extra[*]}" >&2
    SIM_TIME_SCALE=$BOUND_TIME_SCALE start_sim bound $((FLEET * KV_BLOCKS)) "$SEED" "${extra[@]}"
    replay bound "$SIM_URL"
    scrape "$SIM_URL" >"$WORK/bound.metrics"
    stop_pids "$SIM_PID"
    warn_refused "$WORK/bound.log"
fi

if [ "$SWEEP" = 1 ] && [ -z "$SWEEP_RATES" ]; then
    # The rates kvroute-bench --sweep-auto chose on the pooled bound, for every policy.
    SWEEP_RATES=$(python3 -c 'import json, sys
j = json.load(open(sys.argv[1]))
print(",".join("%.6g" % p["offered_rate"] for p in j.get("sweep") or []))' "$WORK/bound.json")
    if [ -z "$SWEEP_RATES" ]; then
        echo "compare.sh: the pooled bound's ramp found no rate meeting the SLO; see $WORK/bound.txt" >&2
        KEEP=1
        exit 1
    fi
    echo "compare.sh: sweeping every policy at $SWEEP_RATES sessions per model second" >&2
fi

REDIS_URL=""
if [ "$REPLICAS" -gt 1 ] && [ "$SHARED" = redis ]; then
    command -v redis-server >/dev/null || { echo "compare.sh: redis-server is missing (scripts/install-deps.sh)" >&2; exit 1; }
    rport=$(free_port)
    redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no >"$WORK/redis.log" 2>&1 &
    PIDS+=("$!")
    REDIS_URL="redis://127.0.0.1:$rport"
    for i in $(seq 50); do
        python3 -c 'import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=0.5); s.sendall(b"PING\r\n")
sys.exit(0 if s.recv(16).startswith(b"+PONG") else 1)' "$rport" 2>/dev/null && break
        sleep 0.1
    done
    echo "compare.sh: $REPLICAS replicas per run sharing state through $REDIS_URL" >&2
elif [ "$REPLICAS" -gt 1 ]; then
    echo "compare.sh: $REPLICAS replicas per run, no shared state" >&2
fi

RUNS=()
if [ "$DP" -gt 1 ]; then
    for policy in "${POLICY_LIST[@]}"; do RUNS+=("$policy-dp" "$policy-plain" "$policy-separate"); done
else
    RUNS=("${POLICY_LIST[@]}")
fi
for run in "${RUNS[@]}"; do
    policy=${run%-dp}
    policy=${policy%-plain}
    policy=${policy%-separate}
    variant=${run#"$policy"}
    echo "compare.sh: policy $policy${variant:+ ($variant)}" >&2
    urls=() targets=() pids=() KV_ARGS=()
    if [ "$variant" = -dp ] || [ "$variant" = -plain ]; then
        for i in $(seq "$WORKERS"); do
            SIM_EVENTS=$KV_EVENTS start_sim "w$i-$run" "$KV_BLOCKS" $((SEED + i)) "${DP_SIM[@]}"
            urls+=("$SIM_URL")
            if [ "$variant" = -dp ]; then targets+=("$SIM_URL@$DP"); else targets+=("$SIM_URL"); fi
            pids+=("$SIM_PID")
            [ -z "$SIM_KV" ] || KV_ARGS+=("$SIM_KV")
        done
    else
        for i in $(seq "$FLEET"); do
            role=() # --pd: the first PD_P sims prefill, the rest decode
            if [ "$PD_P" != 0 ]; then
                if [ "$i" -le "$PD_P" ]; then role=(--role prefill); else role=(--role decode); fi
            fi
            SIM_EVENTS=$KV_EVENTS start_sim "w$i-$run" "$KV_BLOCKS" $((SEED + i)) ${role[@]+"${role[@]}"}
            urls+=("$SIM_URL")
            targets+=("$SIM_URL")
            pids+=("$SIM_PID")
            [ -z "$SIM_KV" ] || KV_ARGS+=("$SIM_KV")
        done
    fi
    ROUTER_URLS=() ROUTER_PIDS=()
    for r in $(seq "$REPLICAS"); do
        REPLICA_ARGS=()
        ROUTER_TAG=""
        if [ "$REPLICAS" -gt 1 ]; then
            ROUTER_TAG="-r$r"
            [ -z "$REDIS_URL" ] || REPLICA_ARGS=(--redis "$REDIS_URL" --redis-key-prefix "cmp-$run:"
                --replica-id "r$r")
        fi
        ROUTER_TAG="$variant$ROUTER_TAG" start_router "$policy" "${targets[@]}"
        ROUTER_URLS+=("$ROUTER_URL")
        ROUTER_PIDS+=("$ROUTER_PID")
    done
    ROUTER_URL=${ROUTER_URLS[0]}
    replay "$run" "$ROUTER_URL" "${urls[@]}"
    if [ "$PD_P" != 0 ]; then
        # The prefill side's hit rate: where prompts are computed (a decode worker's hits are
        # the transferred blocks, or its own local prefills).
        scrape "${urls[@]:0:$PD_P}" >"$WORK/$run.metrics"
        scrape "${urls[@]:$PD_P}" >"$WORK/$run.decode.metrics"
        printf '%s\n' "${urls[@]:0:$PD_P}" >"$WORK/$run.prefill"
    else
        scrape "${urls[@]}" >"$WORK/$run.metrics"
    fi
    # kvroute's own view: decisions it counted, prediction error, KV-event trust states.
    curl -s -m 5 "$ROUTER_URL/metrics" >"$WORK/$run.router.prom" || true
    printf '%s\n' "${urls[@]}" >"$WORK/$run.workers"
    stop_pids "${ROUTER_PIDS[@]}" "${pids[@]}"
    warn_refused "$WORK"/w*-"$run".log
done

CMP_DP=$DP CMP_PD=$PD CMP_REPLICAS=$REPLICAS CMP_SHARED=$([ -n "$REDIS_URL" ] && echo redis || echo none) \
python3 - "$WORK" "$JSON_OUT" "$WORKERS" "$BOUND" "$FORMAT" "$TRACE" "$KV_BLOCKS" "$BLOCK_SIZE" \
    "$TIME_SCALE" "$BYPASS_SHARE" "$KV_EVENTS" "${RUNS[@]}" <<'PY'
import json, math, os, re, sys

work, out, workers, bound, fmt, trace, kv, bs, ts, bypass, kv_events = sys.argv[1:12]
policies = sys.argv[12:]
workers = int(workers)
dp = int(os.environ.get("CMP_DP", "1"))
KV_STATES = {0: "exact", 1: "degraded", 2: "fallback"}


def router_metrics(name):
    """kvroute's /metrics at the end of the run: prediction error (histogram
    kvroute_cache_prediction_error_tokens, summed over models: mean = _sum / _count),
    mispredictions, requests it answered, KV-event trust per worker, tokenize sources."""
    path = os.path.join(work, name + ".router.prom")
    m = {"pred_sum": 0.0, "pred_count": 0.0, "mispredictions": 0.0, "router_requests": 0.0,
         "kv_events_state": {}, "tokenize": {}, "worker_attempts": {}, "pd": {}, "fallbacks": 0.0}
    if not os.path.exists(path):
        return None
    line_re = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$')
    with open(path) as f:
        for line in f:
            mm = line_re.match(line.strip())
            if not mm or line.startswith("#"):
                continue
            metric, labels, value = mm.group(1), dict(re.findall(r'(\w+)="([^"]*)"', mm.group(2) or "")), float(mm.group(3))
            if metric == "kvroute_cache_prediction_error_tokens_sum":
                m["pred_sum"] += value
            elif metric == "kvroute_cache_prediction_error_tokens_count":
                m["pred_count"] += value
            elif metric == "kvroute_cache_mispredictions_total":
                m["mispredictions"] += value
            elif metric == "kvroute_requests_total" and labels.get("endpoint", "").startswith("/v1/"):
                m["router_requests"] += value
            elif metric == "kvroute_kv_events_state":
                m["kv_events_state"][labels.get("worker", "")] = KV_STATES.get(int(value), value)
            elif metric == "kvroute_worker_requests_total":
                w = labels.get("worker", "")
                m["worker_attempts"][w] = m["worker_attempts"].get(w, 0) + value
            elif metric == "kvroute_pd_requests_total":
                res = labels.get("result", "")
                m["pd"][res] = m["pd"].get(res, 0) + int(value)
            elif metric == "kvroute_pd_fallbacks_total":
                m["fallbacks"] += value
            elif metric == "kvroute_tokenize_total":
                src = labels.get("source", "")
                m["tokenize"][src] = m["tokenize"].get(src, 0) + int(value)
    return m


def load(name):
    with open(os.path.join(work, name + ".json")) as f:
        b = json.load(f)
    with open(os.path.join(work, name + ".metrics")) as f:
        v = [int(x) for x in f.read().split()]
    hits, queries, missing = v[0], v[1], (v[2] if len(v) > 2 else 0)
    if missing:
        # A worker's counters could not be read: the bench's usage sums cover every answer.
        hits, queries = b["cached_tokens"], b["prompt_tokens"]
    # Hit rate from the workers' own counters (what the engine computed); the bench's usage sums
    # are kept to cross-check them.
    hr = hits / queries if queries else b.get("hit_rate")
    return b, hits, queries, hr


def fnum(x, pct=False, digits=3):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return ("%.1f%%" % (100 * x)) if pct else ("%.*f" % (digits, x))


result = {"bound_hit_rate": None, "policies": {}}
rows = []
if bound == "1":
    b, hits, queries, hr = load("bound")
    result["bound_hit_rate"] = hr
    result["bound"] = {"hit_rate": hr, "prompt_tokens": queries, "cached_tokens": hits,
                       "bench_hit_rate": b.get("hit_rate"), "ttft_p50_s": b["ttft_s"]["p50"],
                       "ttft_p99_s": b["ttft_s"]["p99"], "e2e_p50_s": b["e2e_s"]["p50"],
                       "errors": b["errors"], "errors_by_kind": b["errors_by_kind"], "requests": b["requests"]}
    rows.append(("pooled bound", result["bound"], None))
rr_uncached = None
for p in policies:
    b, hits, queries, hr = load(p)
    counts = [w["requests"] for w in b["workers"].values()]
    total = sum(counts)
    # With --dp a run's targets are its ranks, its plain engines or its separate sims.
    targets = workers if dp == 1 else workers * dp if not p.endswith("-plain") else workers
    mean = total / targets if targets else 0
    bh = result["bound_hit_rate"]
    row = {
        "hit_rate": hr,
        "bound_fraction": (hr / bh) if (hr is not None and bh) else None,
        "prompt_tokens": queries if queries else b["prompt_tokens"],
        "cached_tokens": hits if queries else b["cached_tokens"],
        "ttft_p50_s": b["ttft_s"]["p50"],
        "ttft_p90_s": b["ttft_s"].get("p90"),
        "ttft_p99_s": b["ttft_s"]["p99"],
        "e2e_p50_s": b["e2e_s"]["p50"],
        "load_max_over_mean": (max(counts) / mean) if counts and mean else None,
        "errors": b["errors"],
        "requests": b["requests"],
        "errors_by_kind": b["errors_by_kind"],
        "bench_hit_rate": b.get("hit_rate"),
        "decisions": b["decisions"],
        "worker_requests": b["workers"] and {k: v["requests"] for k, v in b["workers"].items()},
        "bypass_share": float(bypass),
        "bypassed_requests": b.get("bypassed_requests", 0),
        # The bench's usage sums split by path (kvroute → worker, or straight to a worker).
        "routed_hit_rate": b.get("routed_hit_rate"),
        "bypassed_hit_rate": b.get("bypassed_hit_rate"),
    }
    rm = router_metrics(p)
    if rm is not None:
        pc = rm["pred_count"]
        row["router_requests"] = int(rm["router_requests"])
        row["predictions"] = int(pc)
        row["prediction_error_mean_tokens"] = (rm["pred_sum"] / pc) if pc else None
        row["mispredictions"] = int(rm["mispredictions"])
        row["misprediction_rate"] = (rm["mispredictions"] / pc) if pc else None
        row["kv_events_state"] = rm["kv_events_state"]
        row["tokenize"] = rm["tokenize"]
        pf = os.path.join(work, p + ".prefill")
        if os.path.exists(pf):  # --pd: attempts on prefill workers per answered request
            prefill = set(open(pf).read().split())
            calls = sum(v for w, v in rm["worker_attempts"].items() if w in prefill)
            row["pd"] = {"results": rm["pd"], "fallbacks": int(rm["fallbacks"]),
                         "prefill_calls": int(calls),
                         "prefill_calls_per_request": calls / b["requests"] if b["requests"] else None}
            with open(os.path.join(work, p + ".decode.metrics")) as f:
                dv = [int(x) for x in f.read().split()]
            row["pd"]["decode_hit_rate"] = dv[0] / dv[1] if dv[1] else None
    row["uncached_tokens"] = row["prompt_tokens"] - row["cached_tokens"]
    if p == "round_robin":
        rr_uncached = row["uncached_tokens"]
    result["policies"][p] = row
    rows.append((p, row, b))
for p, row in result["policies"].items():
    row["uncached_vs_round_robin"] = (row["uncached_tokens"] / rr_uncached) if rr_uncached else None
if dp > 1:
    # Per policy: rank-aware routing against N separate engines (same capacity and compute)
    # and against the same engines routed as plain workers.
    result["dp"] = {"size": dp}
    for p in policies:
        if not p.endswith("-dp"):
            continue
        base = p[:-3]
        aware = result["policies"][p]["hit_rate"]
        sep = result["policies"].get(base + "-separate", {}).get("hit_rate")
        plain = result["policies"].get(base + "-plain", {}).get("hit_rate")
        result["dp"][base] = {
            "rank_aware_hit_rate": aware, "plain_hit_rate": plain, "separate_hit_rate": sep,
            "rank_aware_vs_separate": (aware / sep) if aware is not None and sep else None,
            "plain_vs_separate": (plain / sep) if plain is not None and sep else None,
            "rank_aware_of_bound": result["policies"][p].get("bound_fraction"),
            "plain_of_bound": result["policies"].get(base + "-plain", {}).get("bound_fraction")}
result["setup"] = {"format": fmt, "trace": trace, "workers": workers, "kv_blocks_per_worker": int(kv),
                   "data_parallel_size": dp,
                   "block_size": int(bs), "time_scale": float(ts), "bypass_share": float(bypass),
                   "kv_events": kv_events == "1", "pd": os.environ.get("CMP_PD") or None,
                   "replicas": int(os.environ.get("CMP_REPLICAS", "1")),
                   "shared_state": os.environ.get("CMP_SHARED", "none")}
with open(out, "w") as f:
    json.dump(result, f, indent=2)
    f.write("\n")

print("policy comparison: %s (%s), %d workers%s x %s blocks of %s tokens, time scale %s%s"
      % (fmt, trace, workers, (" x %d data-parallel ranks" % dp) if dp > 1 else "", kv, bs, ts,
         ", bypass share %s" % bypass if float(bypass) > 0 else ""))
hdr = ("policy", "requests", "errors", "hit rate", "of bound", "uncached tok", "vs RR",
       "TTFT p50", "TTFT p99", "E2E p50", "load max/mean", "pred err", "mispred")
print("%-16s %8s %6s %8s %8s %13s %6s %9s %9s %9s %13s %9s %8s" % hdr)
for name, row, _ in rows:
    unc = row["prompt_tokens"] - row["cached_tokens"]
    print("%-16s %8d %6d %8s %8s %13d %6s %9s %9s %9s %13s %9s %8s" % (
        name, row["requests"], row["errors"], fnum(row["hit_rate"], pct=True),
        fnum(row.get("bound_fraction"), digits=2) if name != "pooled bound" else "1.00",
        unc, fnum(row.get("uncached_vs_round_robin"), digits=2),
        fnum(row["ttft_p50_s"]), fnum(row["ttft_p99_s"]), fnum(row["e2e_p50_s"]),
        fnum(row.get("load_max_over_mean"), digits=2),
        fnum(row.get("prediction_error_mean_tokens"), digits=1),
        fnum(row.get("misprediction_rate"), pct=True)))
print("(pred err: kvroute's mean |predicted - reported| cached tokens per answer; mispred: share "
      "of answers off by more than a block; '-': the policy predicts nothing)")
for name, row, b in rows:
    if row["errors"]:
        print("  %s errors: %s" % (name, json.dumps(row.get("errors_by_kind", {}))))
    if row.get("bypassed_requests"):
        print("  %s: %d requests bypassed kvroute (hit rate %s), %d went through it (hit rate %s)" % (
            name, row["bypassed_requests"], fnum(row.get("bypassed_hit_rate"), pct=True),
            row.get("router_requests", 0), fnum(row.get("routed_hit_rate"), pct=True)))
    if row.get("kv_events_state") and name == "precise":
        states = {}
        for st in row["kv_events_state"].values():
            states[st] = states.get(st, 0) + 1
        print("  %s: decisions %s; KV events at the end: %s; token ids from %s" % (
            name, json.dumps(row["decisions"]), json.dumps(states), json.dumps(row.get("tokenize", {}))))
    if row.get("pd"):
        pd = row["pd"]
        print("  %s (prefill/decode %s): hit rate on the prefill side %s, decode side %s; TTFT "
              "p50/p90 %s / %s; prefill calls per request %s; results %s; local prefills %d" % (
                  name, os.environ.get("CMP_PD"), fnum(row["hit_rate"], pct=True),
                  fnum(pd.get("decode_hit_rate"), pct=True), fnum(row["ttft_p50_s"]),
                  fnum(row.get("ttft_p90_s")), fnum(pd.get("prefill_calls_per_request"), digits=2),
                  json.dumps(pd["results"]), pd["fallbacks"]))
PY

if [ -n "$PNG_OUT" ]; then
    if ! command -v gnuplot >/dev/null; then
        echo "compare.sh: gnuplot not installed; no PNG" >&2
    else
        python3 - "$JSON_OUT" >"$WORK/plot.dat" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
def v(x):
    return "NaN" if x is None else x
if r.get("bound_hit_rate") is not None:
    b = r["bound"]
    print('"pooled\\nbound" %s %s %s' % (100 * b["hit_rate"], v(b["ttft_p50_s"]), v(b["ttft_p99_s"])))
for p, row in r["policies"].items():
    hr = row["hit_rate"]
    print('"%s" %s %s %s' % (p.replace("_", "\\n"), "NaN" if hr is None else 100 * hr,
                             v(row["ttft_p50_s"]), v(row["ttft_p99_s"])))
PY
        gnuplot <<EOF
set terminal pngcairo size 1100,450 font "sans,10"
set output "$PNG_OUT"
set multiplot layout 1,2 title "kvroute policies on $FORMAT ($WORKERS workers x $KV_BLOCKS blocks)"
set bmargin 4
set style data histograms
set style fill solid 0.8 border -1
set boxwidth 0.8
set grid ytics
set yrange [0:*]
set title "prefix-cache hit rate (%)"
plot "$WORK/plot.dat" using 2:xtic(1) notitle lc rgb "#4c72b0"
set title "TTFT (s)"
set style histogram clustered gap 1
plot "$WORK/plot.dat" using 3:xtic(1) title "p50" lc rgb "#55a868", "" using 4 title "p99" lc rgb "#c44e52"
unset multiplot
EOF
        echo "compare.sh: wrote $PNG_OUT" >&2
    fi
fi

if [ "$SWEEP" = 1 ]; then
    python3 "$ROOT/scripts/sweep_report.py" "$WORK" "$JSON_OUT" "$PNG_OUT" "$BOUND" \
        "$FORMAT, $WORKERS workers${PROFILE:+, profile $PROFILE}" "${POLICY_LIST[@]}"
fi
