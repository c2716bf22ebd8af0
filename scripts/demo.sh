#!/usr/bin/env bash
# What `make demo` runs after deps and build: the policy comparison (scripts/compare.sh) on the
# two traces shipped in data/ — tau-bench airline (agent conversations with tool calls, a shared
# 6 KB policy prompt) and the Mooncake FAST'25 conversation trace (Kimi production arrivals and
# prefix-block ids) — and both tables on stdout. Sized to finish in under 5 minutes on 2 cores:
# the whole tau-bench trace (2,023 requests) and the first 1,000 Mooncake requests (330 s of
# the trace), both at time scale 0.05 (one simulated second = 50 ms of wall time).
# Results (JSON, PNG) go to $DEMO_OUT (default out/demo/).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${DEMO_OUT:-$ROOT/out/demo}
cd "$ROOT"
mkdir -p "$OUT"
for d in data/tau-bench-airline-gpt4o data/mooncake-fast25-conversation; do
    [ -d "$d" ] || { echo "demo.sh: $d is missing (the project ships it)" >&2; exit 1; }
done
png=()
command -v gnuplot >/dev/null && png=(--png)

start=$(date +%s)
echo "== tau-bench airline (GPT-4o agent, 140 conversations, 2,023 requests)"
scripts/compare.sh --trace data/tau-bench-airline-gpt4o --format tau \
    --time-scale 0.05 --json "$OUT/tau.json" ${png[@]+"${png[@]}" "$OUT/tau.png"}
echo
echo "== Mooncake FAST'25 conversation trace (first 1,000 requests, arrivals x 0.05)"
scripts/compare.sh --trace data/mooncake-fast25-conversation --format mooncake \
    --max-requests 1000 --time-scale 0.05 --json "$OUT/mooncake.json" \
    ${png[@]+"${png[@]}" "$OUT/mooncake.png"}
echo
# Latency under load (issue 16): tau-bench at 15, 30 and 45 sessions per model second over the
# H100 Llama-3.1-8B profile, round_robin against cache_aware and the pooled bound. Quick
# settings: 6 model seconds of arrivals per rate, 200 ms think time, answers capped at 32
# tokens. Time scale 0.5, not the tables' 0.05: every wall millisecond the router, the bench or
# a sim spends counts 1/time-scale model milliseconds, and at 0.05 the replay's ~14,000 wall
# requests/s saturate 2 cores, which then shows up as model TTFT (docs/performance.md).
sim=(--profile h100-llama3.1-8b)
echo "== tau-bench latency under load (rate sweep, ${sim[*]})"
scripts/compare.sh --trace data/tau-bench-airline-gpt4o --format tau --sweep 15,30,45 \
    --policies round_robin,cache_aware --time-scale 0.5 --think-ms 200 --sweep-duration 6 \
    --bench-arg --max-tokens-cap=32 "${sim[@]}" --json "$OUT/tau-sweep.json" \
    ${png[@]+"${png[@]}" "$OUT/tau-sweep.png"}
echo
echo "demo: finished in $(($(date +%s) - start)) s; JSON${png[@]+ and PNG} in $OUT"
echo "(hit rate: prompt tokens served from the workers' prefix caches; of bound: share of what one"
echo " worker holding the whole fleet's KV capacity reached; vs RR: prefill work left, relative"
echo " to round_robin; load max/mean: busiest worker's requests over the mean. docs/bench.md)"
