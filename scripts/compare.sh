#!/usr/bin/env bash
# Policy comparison: replays one trace against a fresh fleet of kvroute-sim workers behind
# kvroute, once per policy, plus once with no router against a single kvroute-sim holding the
# whole fleet's KV capacity (the pooled bound: perfect pooling, the best any routing over that
# fleet could reach). Prints one table; --json and --png write it. Usage: docs/bench.md.
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
  --policies LIST         comma-separated (default round_robin,least_load,consistent_hash,cache_aware)
  --kv-blocks N           KV capacity of one worker, blocks (default 32768 = 512Ki tokens;
                          see docs/bench.md for why this puts the fleet under cache pressure)
  --block-size N          tokens per KV block (default 16, vLLM's)
  --time-scale F          sim wall time per model time, and trace/think time scale (default 0.05)
  --max-requests N        replay the first N requests (default: all)
  --concurrency N         closed loop with N sessions (default for conversation traces: 16)
  --rate R                Poisson session arrivals per second
  --timestamps            the trace's arrival times (default for mooncake and azure)
  --think-ms MS           mean think time between turns before scaling (default 1000)
  --seed S                seed for the bench and the sims (default 1)
  --no-bound              skip the pooled-bound run
  --bench-arg ARG         extra kvroute-bench argument (repeatable)
  --sim-arg ARG           extra kvroute-sim argument for every worker (repeatable)
  --router-arg ARG        extra kvroute argument (repeatable)
  --replay-timeout S      bound on one replay, seconds (default 900)
  --keep                  keep the work directory (logs, per-run JSON) and print its path
EOF
}

TRACE="" FORMAT="" JSON_OUT="" PNG_OUT=""
WORKERS=4
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
MODEL=kvroute-sim-model

need() { [ $# -ge 2 ] || { echo "compare.sh: $1 needs a value" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
    case "$1" in
    --trace) need "$@"; TRACE=$2; shift 2 ;;
    --format) need "$@"; FORMAT=$2; shift 2 ;;
    --json) need "$@"; JSON_OUT=$2; shift 2 ;;
    --png) need "$@"; PNG_OUT=$2; shift 2 ;;
    --workers) need "$@"; WORKERS=$2; shift 2 ;;
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
    --sim-arg) need "$@"; SIM_EXTRA+=("$2"); shift 2 ;;
    --router-arg) need "$@"; ROUTER_EXTRA+=("$2"); shift 2 ;;
    --replay-timeout) need "$@"; REPLAY_TIMEOUT=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "compare.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
done
[ -n "$TRACE" ] && [ -n "$FORMAT" ] && [ -n "$JSON_OUT" ] || { usage >&2; exit 2; }
for n in "$WORKERS" "$KV_BLOCKS" "$BLOCK_SIZE" "$MAX_REQUESTS" "$SEED" "$REPLAY_TIMEOUT"; do
    [[ "$n" =~ ^[0-9]+$ ]] || { echo "compare.sh: '$n' is not a non-negative integer" >&2; exit 2; }
done
[ "$WORKERS" -ge 1 ] || { echo "compare.sh: --workers must be at least 1" >&2; exit 2; }

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
if [ "${MODE_ARGS[0]:-}" != "--timestamps" ] && [ "${MODE_ARGS[0]:-}" != "--rate" ] &&
    [[ " ${ROUTER_EXTRA[*]-} " != *balance-abs-threshold* ]]; then
    conc=${MODE_ARGS[1]:-16}
    gate=$((conc / WORKERS))
    [ "$gate" -ge 2 ] || gate=2
    ROUTER_EXTRA+=("--balance-abs-threshold=$gate")
fi
IFS=, read -r -a POLICY_LIST <<<"$POLICIES"

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
# The sim's time scale is $SIM_TIME_SCALE when set, else $TIME_SCALE.
start_sim() {
    local name=$1 blocks=$2 seed=$3 port try ts=${SIM_TIME_SCALE:-$TIME_SCALE}
    shift 3
    for try in 1 2 3; do
        port=$(free_port)
        "$BUILD/kvroute-sim" --port "$port" --model "$MODEL" --kv-blocks "$blocks" \
            --block-size "$BLOCK_SIZE" --time-scale "$ts" --seed "$seed" \
            ${SIM_EXTRA[@]+"${SIM_EXTRA[@]}"} "$@" >"$WORK/$name.log" 2>&1 &
        SIM_PID=$!
        PIDS+=("$SIM_PID")
        SIM_URL="http://127.0.0.1:$port"
        if wait_http "$SIM_URL/health" 15 "$SIM_PID"; then return 0; fi
        stop_pids "$SIM_PID"
    done
    echo "compare.sh: kvroute-sim did not start; log:" >&2
    tail -20 "$WORK/$name.log" >&2
    return 1
}

# start_router POLICY URL…: sets ROUTER_PID and ROUTER_URL.
start_router() {
    local policy=$1 port try args=() u
    shift
    for u in "$@"; do args+=(--worker "$u"); done
    for try in 1 2 3; do
        port=$(free_port)
        "$BUILD/kvroute" "${args[@]}" --policy "$policy" --host 127.0.0.1 --port "$port" \
            ${ROUTER_EXTRA[@]+"${ROUTER_EXTRA[@]}"} >"$WORK/router-$policy.log" 2>&1 &
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
    tail -20 "$WORK/router-$policy.log" >&2
    return 1
}

# scrape URL…: prints "hits queries" summed over the workers' vLLM prefix-cache counters.
scrape() {
    local u hits=0 queries=0 h q
    for u in "$@"; do
        read -r h q < <(curl -s -m 5 "$u/metrics" | awk '
            /^vllm:prefix_cache_hits_total[{ ]/ { h += $NF }
            /^vllm:prefix_cache_queries_total[{ ]/ { q += $NF }
            END { printf "%.0f %.0f\n", h, q }')
        hits=$((hits + h))
        queries=$((queries + q))
    done
    echo "$hits $queries"
}

# replay NAME URL: runs kvroute-bench, leaving $WORK/NAME.json and NAME.txt.
replay() {
    local name=$1 url=$2 rc=0
    local args=(--url "$url" --model "$MODEL" --trace "$TRACE" --format "$FORMAT"
        "${MODE_ARGS[@]}" --time-scale "$TIME_SCALE" --think-ms "$THINK_MS" --seed "$SEED"
        --json "$WORK/$name.json" --progress lines)
    [ "$MAX_REQUESTS" -gt 0 ] && args+=(--max-requests "$MAX_REQUESTS")
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

echo "compare.sh: $FORMAT trace $TRACE, $WORKERS workers x $KV_BLOCKS blocks of $BLOCK_SIZE tokens, time scale $TIME_SCALE, ${MODE_ARGS[*]}" >&2

# Sims of the fleet get the same seeds in every run, so runs differ only by the policy.
if [ "$BOUND" = 1 ]; then
    # One worker with the whole fleet's KV capacity, and its compute too: the fleet's batch
    # slots and tokens per step (kvroute-sim's defaults 256 and 8192, times the workers) at a
    # time scale divided by the workers, so it serves the fleet's load without the queueing
    # one small worker would add (queued requests hold KV blocks and would lower the bound).
    extra=(--max-num-seqs $((256 * WORKERS)) --max-num-batched-tokens $((8192 * WORKERS)))
    BOUND_TIME_SCALE=$(python3 -c "print($TIME_SCALE / $WORKERS)")
    echo "compare.sh: pooled bound: one kvroute-sim with $((WORKERS * KV_BLOCKS)) blocks ${extra[*]}" >&2
    SIM_TIME_SCALE=$BOUND_TIME_SCALE start_sim bound $((WORKERS * KV_BLOCKS)) "$SEED" "${extra[@]}"
    replay bound "$SIM_URL"
    scrape "$SIM_URL" >"$WORK/bound.metrics"
    stop_pids "$SIM_PID"
fi

for policy in "${POLICY_LIST[@]}"; do
    echo "compare.sh: policy $policy" >&2
    urls=() pids=()
    for i in $(seq "$WORKERS"); do
        start_sim "w$i-$policy" "$KV_BLOCKS" $((SEED + i))
        urls+=("$SIM_URL")
        pids+=("$SIM_PID")
    done
    start_router "$policy" "${urls[@]}"
    replay "$policy" "$ROUTER_URL"
    scrape "${urls[@]}" >"$WORK/$policy.metrics"
    printf '%s\n' "${urls[@]}" >"$WORK/$policy.workers"
    stop_pids "$ROUTER_PID" "${pids[@]}"
done

python3 - "$WORK" "$JSON_OUT" "$WORKERS" "$BOUND" "$FORMAT" "$TRACE" "$KV_BLOCKS" "$BLOCK_SIZE" \
    "$TIME_SCALE" "${POLICY_LIST[@]}" <<'PY'
import json, math, os, sys

work, out, workers, bound, fmt, trace, kv, bs, ts = sys.argv[1:10]
policies = sys.argv[10:]
workers = int(workers)


def load(name):
    with open(os.path.join(work, name + ".json")) as f:
        b = json.load(f)
    with open(os.path.join(work, name + ".metrics")) as f:
        hits, queries = (int(x) for x in f.read().split())
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
                       "errors": b["errors"], "requests": b["requests"]}
    rows.append(("pooled bound", result["bound"], None))
rr_uncached = None
for p in policies:
    b, hits, queries, hr = load(p)
    counts = [w["requests"] for w in b["workers"].values()]
    total = sum(counts)
    mean = total / workers if workers else 0
    bh = result["bound_hit_rate"]
    row = {
        "hit_rate": hr,
        "bound_fraction": (hr / bh) if (hr is not None and bh) else None,
        "prompt_tokens": queries if queries else b["prompt_tokens"],
        "cached_tokens": hits if queries else b["cached_tokens"],
        "ttft_p50_s": b["ttft_s"]["p50"],
        "ttft_p99_s": b["ttft_s"]["p99"],
        "e2e_p50_s": b["e2e_s"]["p50"],
        "load_max_over_mean": (max(counts) / mean) if counts and mean else None,
        "errors": b["errors"],
        "requests": b["requests"],
        "errors_by_kind": b["errors_by_kind"],
        "bench_hit_rate": b.get("hit_rate"),
        "decisions": b["decisions"],
        "worker_requests": b["workers"] and {k: v["requests"] for k, v in b["workers"].items()},
    }
    row["uncached_tokens"] = row["prompt_tokens"] - row["cached_tokens"]
    if p == "round_robin":
        rr_uncached = row["uncached_tokens"]
    result["policies"][p] = row
    rows.append((p, row, b))
for p, row in result["policies"].items():
    row["uncached_vs_round_robin"] = (row["uncached_tokens"] / rr_uncached) if rr_uncached else None
result["setup"] = {"format": fmt, "trace": trace, "workers": workers, "kv_blocks_per_worker": int(kv),
                   "block_size": int(bs), "time_scale": float(ts)}
with open(out, "w") as f:
    json.dump(result, f, indent=2)
    f.write("\n")

print("policy comparison: %s (%s), %d workers x %s blocks of %s tokens, time scale %s"
      % (fmt, trace, workers, kv, bs, ts))
hdr = ("policy", "requests", "errors", "hit rate", "of bound", "uncached tok", "vs RR",
       "TTFT p50", "TTFT p99", "E2E p50", "load max/mean")
print("%-16s %8s %6s %8s %8s %13s %6s %9s %9s %9s %13s" % hdr)
for name, row, _ in rows:
    unc = row["prompt_tokens"] - row["cached_tokens"]
    print("%-16s %8d %6d %8s %8s %13d %6s %9s %9s %9s %13s" % (
        name, row["requests"], row["errors"], fnum(row["hit_rate"], pct=True),
        fnum(row.get("bound_fraction"), digits=2) if name != "pooled bound" else "1.00",
        unc, fnum(row.get("uncached_vs_round_robin"), digits=2),
        fnum(row["ttft_p50_s"]), fnum(row["ttft_p99_s"]), fnum(row["e2e_p50_s"]),
        fnum(row.get("load_max_over_mean"), digits=2)))
for name, row, b in rows:
    if row["errors"]:
        print("  %s errors: %s" % (name, json.dumps(row.get("errors_by_kind", {}))))
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
