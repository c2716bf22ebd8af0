/* Numbers kvroute-bench reports: latency percentiles, time-weighted in-flight gauges and
 * name → count tallies (errors by kind, requests per worker, decision labels). */
#ifndef KVR_BENCH_STATS_H
#define KVR_BENCH_STATS_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/** Percentile `q` (0–100) of `v[0..n)`, which must be sorted ascending, by linear
 *  interpolation between closest ranks (numpy's default "linear" method, so results can be
 *  checked against numpy.percentile). Returns NAN when n == 0; q is clamped to [0, 100]. */
double kvr_bench_percentile_sorted(const double *v, size_t n, double q);

/** A growable list of samples (seconds, usually). All-zero is a valid empty list. */
typedef struct kvr_bench_samples {
    double *v;   /**< owned; NULL while empty */
    size_t n;    /**< samples stored */
    size_t cap;  /**< allocated slots */
    bool sorted; /**< v is sorted ascending (set by percentile queries, cleared by adds) */
} kvr_bench_samples;

/** Appends one sample; NAN is ignored. Returns 0, or -1 when memory ran out. */
int kvr_bench_samples_add(kvr_bench_samples *s, double x);
/** Percentile `q` (0–100) of the samples (sorts them in place once); NAN when empty. */
double kvr_bench_samples_pct(kvr_bench_samples *s, double q);
/** Arithmetic mean; NAN when empty. */
double kvr_bench_samples_mean(const kvr_bench_samples *s);
/** Frees the storage; the list is then empty. */
void kvr_bench_samples_free(kvr_bench_samples *s);

/** A counter that changes over time (requests in flight on one worker), with its maximum and
 *  its time integral so the mean over a window can be reported. Times are monotonic ns. */
typedef struct kvr_bench_gauge {
    int64_t cur;       /**< current value */
    int64_t max;       /**< largest value seen */
    double area;       /**< ∫ value dt, value × seconds, up to last_ns */
    double busy;       /**< ∫ [value > 0] dt, seconds, up to last_ns */
    uint64_t last_ns;  /**< time of the last change (0 = never changed) */
} kvr_bench_gauge;

/** Adds `delta` (may be negative) at time `now_ns`, integrating the previous value since the
 *  last change. */
void kvr_bench_gauge_add(kvr_bench_gauge *g, int64_t delta, uint64_t now_ns);
/** Time-weighted mean of the value between `start_ns` and `end_ns` (the value is taken to be 0
 *  before its first change and constant after its last). Returns 0 for an empty window. */
double kvr_bench_gauge_mean(const kvr_bench_gauge *g, uint64_t start_ns, uint64_t end_ns);
/** Seconds the value was above 0 from its first change up to `now_ns` (the value is taken to
 *  be constant after its last change). The difference of two readings is the busy time of a
 *  window: a worker's busy share = that ÷ the window's length. */
double kvr_bench_gauge_busy_until(const kvr_bench_gauge *g, uint64_t now_ns);

/** Name → count table for a handful of distinct names (linear search: a bench run sees a few
 *  workers, decision labels and error kinds, not thousands). All-zero is a valid empty tally. */
typedef struct kvr_bench_tally {
    char **names;     /**< owned NUL-terminated copies, in first-seen order */
    uint64_t *counts; /**< counts[i] belongs to names[i] */
    size_t n;         /**< distinct names */
    size_t cap;       /**< allocated slots */
} kvr_bench_tally;

/** Index of `name` (added with count 0 if new); -1 when memory ran out. */
int kvr_bench_tally_index(kvr_bench_tally *t, const char *name);
/** Adds `by` to `name`'s count; returns its index or -1 when memory ran out. */
int kvr_bench_tally_add(kvr_bench_tally *t, const char *name, uint64_t by);
/** Sum of all counts. */
uint64_t kvr_bench_tally_total(const kvr_bench_tally *t);
/** Frees names and counts; the tally is then empty. */
void kvr_bench_tally_free(kvr_bench_tally *t);

/** num / den, or NAN when den is 0 (a hit rate of nothing is unknown, not 0). */
double kvr_bench_ratio(double num, double den);

#endif
