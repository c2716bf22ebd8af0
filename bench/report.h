/* Turning a replay's records into the numbers kvroute-bench prints and writes with --json. */
#ifndef KVR_BENCH_REPORT_H
#define KVR_BENCH_REPORT_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "replay.h"

/** One worker's row (named by x-kvroute-worker, or the replayed URL without a router). */
typedef struct kvr_bench_worker_row {
    const char *name;     /**< borrowed from the run's tally */
    uint64_t requests;    /**< responses it sent */
    double share;         /**< requests / all requests with a response */
    int64_t max_inflight; /**< most requests in flight on it at once (headers → end); whole
                               run only (0 in a window's summary) */
    double mean_inflight; /**< time-weighted mean over the whole replay (whole run only) */
    double busy_share;    /**< share of the window's time it had a request in flight (0–1) */
} kvr_bench_worker_row;

/** The summary of a run. Borrows names from the run: free the summary before the run. */
typedef struct kvr_bench_summary {
    size_t planned;            /**< requests the trace offered */
    size_t requests;           /**< requests finished (ok + errors) */
    size_t ok;                 /**< 2xx responses that streamed to the end with usage */
    size_t errors;             /**< requests with an error of any kind */
    const kvr_bench_tally *error_kinds; /**< kind → count (borrowed) */
    const kvr_bench_tally *decisions;   /**< decision label → count (borrowed) */
    size_t with_usage;         /**< requests whose response reported usage */
    size_t session_header;     /**< requests sent with x-session-id */
    size_t bypassed;           /**< requests sent straight to a worker (--bypass-share) */
    int64_t bypassed_prompt_tokens; /**< Σ usage.prompt_tokens of the bypassed requests */
    int64_t bypassed_cached_tokens; /**< Σ cached tokens of the bypassed requests */
    int64_t prompt_tokens;     /**< Σ usage.prompt_tokens */
    int64_t cached_tokens;     /**< Σ usage.prompt_tokens_details.cached_tokens */
    int64_t completion_tokens; /**< Σ usage.completion_tokens */
    double hit_rate;           /**< Σcached / Σprompt; NAN without usage */
    double ttft_p50, ttft_p90, ttft_p99; /**< model seconds, successful requests; NAN when none */
    double e2e_p50, e2e_p99;   /**< model seconds, successful requests; NAN when none */
    double itl_p50, itl_p90;   /**< model seconds: each successful request's mean inter-token
                                    latency, (E2E − TTFT) / (completion tokens − 1), over the
                                    requests with ≥ 2 tokens; NAN when none */
    size_t good;               /**< requests that succeeded with TTFT ≤ the TTFT SLO and mean
                                    inter-token latency ≤ the ITL SLO (one token: TTFT only) */
    double goodput;            /**< good / requests (errors count as missing the SLO); NAN
                                    when no request finished */
    double slo_ttft_s, slo_itl_s; /**< the SLO used, model seconds */
    double offered_rps;        /**< requests sent ÷ model seconds from the first send to the
                                    last; NAN with fewer than 2 requests */
    double achieved_rps;       /**< successful requests ÷ model seconds from the first send to
                                    the last completion; NAN when none succeeded */
    double output_tok_s;       /**< Σ completion tokens / elapsed model seconds */
    double requests_s;         /**< finished requests / elapsed model seconds */
    double elapsed_s;          /**< length of the replay (or window), model seconds */
    double wall_s;             /**< the same in wall seconds */
    kvr_bench_worker_row *workers; /**< owned array, in first-seen order */
    size_t nworkers;           /**< rows */
    double load_max_over_mean; /**< busiest worker's requests / mean over the workers seen
                                    (compare.sh recomputes it over the whole fleet) */
    bool interrupted;          /**< the run was stopped early */
} kvr_bench_summary;

/** Computes the summary of `run`. Returns 0, or -1 when memory ran out. */
int kvr_bench_summarize(const kvr_bench_run *run, kvr_bench_summary *s);

/** A part of a run: one pass of a sweep. */
typedef struct kvr_bench_window {
    size_t from, to;          /**< records [from, to) */
    uint64_t start_ns;        /**< monotonic start of the window */
    uint64_t end_ns;          /**< monotonic end */
    const double *busy0;      /**< per worker (the run's worker indices): its gauge's
                                   kvr_bench_gauge_busy_until(start_ns) (borrowed; NULL = 0) */
    size_t nbusy0;            /**< entries of busy0; workers beyond count 0 */
} kvr_bench_window;

/** Summary of the records and time of window `w` of `run`: per-worker requests count the
 *  window's records (workers without any are listed with 0), busy shares its time, in-flight
 *  maxima and means are left 0. Returns 0, or -1 when memory ran out. */
int kvr_bench_summarize_window(const kvr_bench_run *run, const kvr_bench_window *w,
                               kvr_bench_summary *s);
/** The mean inter-token latency of record `r` in wall seconds, (E2E − TTFT) / (tokens − 1);
 *  NAN for a failed request or one with fewer than 2 completion tokens. */
double kvr_bench_record_itl(const kvr_bench_record *r);
/** Frees the summary's own arrays. */
void kvr_bench_summary_free(kvr_bench_summary *s);
/** Prints the human table. `title` heads it (e.g. "tau @ http://…"). */
void kvr_bench_print_table(FILE *f, const char *title, const kvr_bench_summary *s);
/** Builds the --json object: the table's numbers, with NAN as null; times in seconds. `meta`
 *  (may be NULL) is stored under "config" (reference stolen). Returns NULL when out of memory;
 *  the caller owns the result. */
json_t *kvr_bench_summary_json(const kvr_bench_summary *s, json_t *meta);
/** Writes one JSON line per record to `path` (--records), for offline analysis. Returns 0 or
 *  -1 (errno set by stdio). */
int kvr_bench_write_records(const char *path, const kvr_bench_trace *t, const kvr_bench_run *run);

#endif
