/* Rate sweeps: one open-loop pass of Poisson session arrivals per rate (sessions per model
 * second), each summarised on its own (TTFT, inter-token latency, E2E, goodput, per-worker
 * requests and busy share), and the automatic variant that first finds the rate at which the
 * fleet stops meeting its SLO by a bounded ramp. Usage: docs/bench.md ("Rate sweeps"). */
#ifndef KVR_BENCH_SWEEP_H
#define KVR_BENCH_SWEEP_H
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include <jansson.h>

#include "replay.h"
#include "report.h"

/** Most rates one sweep takes (a list or --sweep-points). */
#define KVR_BENCH_SWEEP_MAX_RATES 64
/** Most sessions one pass starts (rate × duration is cut to it). */
#define KVR_BENCH_SWEEP_MAX_SESSIONS 20000

/** How to sweep. */
typedef struct kvr_bench_sweep_opts {
    const double *rates;  /**< the rates, sessions per model second, in the order to run them
                               (borrowed); ignored when `automatic` */
    size_t nrates;        /**< entries of rates (1..KVR_BENCH_SWEEP_MAX_RATES) */
    bool automatic;       /**< find the saturation rate first, then sweep 10 %..120 % of it */
    double duration_s;    /**< model seconds of arrivals per pass: a pass starts
                               max(2, ⌈rate × duration⌉) sessions (at most
                               KVR_BENCH_SWEEP_MAX_SESSIONS), copies of the trace's in order */
    size_t points;        /**< automatic: rates from 10 % to 120 % of saturation (≥ 2) */
    double start_rate;    /**< automatic: the ramp's first rate, sessions per model second */
    size_t max_probes;    /**< automatic: most ramp passes (≥ 2) */
} kvr_bench_sweep_opts;

/** Fills `o` with the defaults: duration 60 s, 6 points, ramp from 0.5 sessions/s, 10 probes. */
void kvr_bench_sweep_opts_defaults(kvr_bench_sweep_opts *o);

/** One pass of a sweep (or of the automatic ramp). */
typedef struct kvr_bench_sweep_point {
    double offered_rate;   /**< sessions per model second, as given */
    size_t sessions;       /**< sessions the pass started */
    kvr_bench_summary s;   /**< the pass's window summary (owns its worker rows; borrows names
                                from the run, so free the result before the run) */
} kvr_bench_sweep_point;

/** What a sweep measured. Free with kvr_bench_sweep_result_free(). */
typedef struct kvr_bench_sweep_result {
    kvr_bench_sweep_point *points; /**< one per rate, in the order run (owned) */
    size_t npoints;                /**< entries of points */
    kvr_bench_sweep_point *probes; /**< automatic: the ramp's passes, in the order run (owned) */
    size_t nprobes;                /**< entries of probes */
    double saturation_rate;        /**< automatic: the highest ramp rate that was not saturated
                                        (sessions per model second); NAN otherwise or when the
                                        ramp found none */
} kvr_bench_sweep_result;

/** Parses "R1,R2,…" (positive finite numbers, at most KVR_BENCH_SWEEP_MAX_RATES) into out[],
 *  in the given order. Returns the count, or -1 for anything else. */
int kvr_bench_sweep_parse_rates(const char *s, double *out, size_t cap);
/** The automatic sweep's rates: `points` (≥ 2) evenly spaced from 0.1 × sat to 1.2 × sat. */
void kvr_bench_sweep_auto_rates(double sat, size_t points, double *out);
/** True when a pass missed its SLO: goodput below 0.9, more than 5 % of requests failed, or no
 *  request finished. */
bool kvr_bench_sweep_saturated(const kvr_bench_summary *s);

/** Runs the sweep `o` with the settings of `base` (its mode, rate, sessions, pass and append
 *  are replaced per pass) into `run` (zeroed first; every pass appends to it, so a summary of
 *  `run` covers the whole sweep) and `res`. Stops early when base->stop is set (run->interrupted).
 *  Returns 0, or -1 with a message in err[errlen] when a pass could not run. */
int kvr_bench_sweep_run(const kvr_bench_trace *t, const kvr_bench_config *base,
                        const kvr_bench_sweep_opts *o, kvr_bench_run *run,
                        kvr_bench_sweep_result *res, char *err, size_t errlen);
/** Frees what a result owns. */
void kvr_bench_sweep_result_free(kvr_bench_sweep_result *res);

/** One point as JSON: {"offered_rate", "offered_rps", "achieved_rps", "sessions", "requests",
 *  "ok", "errors", "ttft_s": {p50, p90, p99}, "itl_s": {p50, p90}, "e2e_s": {p50, p99},
 *  "output_tps", "goodput", "hit_rate", "elapsed_s", "workers": {name: {requests,
 *  busy_share}}}; times model seconds, rates per model second, null for undefined numbers.
 *  NULL when out of memory; the caller owns the result. */
json_t *kvr_bench_sweep_point_json(const kvr_bench_sweep_point *p);
/** The points as a JSON array (the bench's "sweep"); NULL when out of memory. */
json_t *kvr_bench_sweep_json(const kvr_bench_sweep_result *res);
/** Prints one row per point (and the ramp's rows and saturation rate when automatic). */
void kvr_bench_sweep_print(FILE *f, const kvr_bench_sweep_result *res);

#endif
