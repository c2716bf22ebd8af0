#!/usr/bin/env bash
# Builds and runs the cache_aware decision / prefix index memory benchmark
# (tests/bench/bench_index.c) against the sources, with the project's optimisation flags.
# Usage: tests/bench/run_index_bench.sh [--quick]     (from anywhere; output on stdout)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${BUILD:-build}/bench
mkdir -p "$out"
srcs="tests/bench/bench_index.c src/index/prefix_index.c src/index/session_map.c
      src/routing/hashring.c src/routing/policy.c src/routing/policy_simple.c
      src/routing/policy_cache_aware.c src/routing/policy_consistent_hash.c
      src/routing/policy_rendezvous_hash.c src/util/rand.c src/util/time.c"
# shellcheck disable=SC2086
${CC:-gcc} -std=c17 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Werror -Isrc -o "$out/bench_index" \
    $srcs -lxxhash -lm
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(uname -m), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) CPUs"
exec "$out/bench_index" "$@"
