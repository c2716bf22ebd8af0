/* The replayer: sends a trace's turns to an OpenAI-compatible URL as streaming chat-completions
 * requests from one thread (libcurl multi, curl_multi_poll loop) and records what each request
 * cost: status, TTFT, end-to-end time, usage tokens, and the worker and decision kvroute
 * reported. */
#ifndef KVR_BENCH_REPLAY_H
#define KVR_BENCH_REPLAY_H
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "stats.h"
#include "trace.h"

/** When sessions start. */
typedef enum kvr_bench_mode {
    KVR_BENCH_MODE_CONCURRENCY, /**< closed loop: `concurrency` sessions active at a time, the
                                     next starts when one finishes its last turn */
    KVR_BENCH_MODE_RATE,        /**< open loop: sessions start as a Poisson process of `rate`
                                     sessions per model second (a request-trace row is a
                                     session) */
    KVR_BENCH_MODE_TIMESTAMPS,  /**< open loop: sessions start at the trace's arrival times ×
                                     `time_scale` (Mooncake, Azure) */
} kvr_bench_mode;

/** Replay settings (the command-line flags). */
typedef struct kvr_bench_config {
    const char *url;             /**< base URL, e.g. "http://127.0.0.1:8000" (no trailing path) */
    const char *const *urls;     /**< several base URLs (router replicas behind a balancer):
                                      every request goes to one of them, per `spread_random`;
                                      NULL = `url` alone. `url` is urls[0] then */
    size_t nurls;                /**< entries of urls (0 = only `url`) */
    bool spread_random;          /**< false: round robin over urls in send order (as a load
                                      balancer's default); true: uniformly at random (seeded,
                                      kvr_bench_spread_pick) */
    const char *model;           /**< "model" of every request */
    const char *api_key;         /**< sent as "Authorization: Bearer …" when non-NULL */
    kvr_bench_mode mode;         /**< session start discipline */
    unsigned concurrency;        /**< CONCURRENCY: sessions active at once (≥ 1) */
    double rate;                 /**< RATE: session arrivals per model second (> 0) */
    double time_scale;           /**< the workers' time scale: wall time = model time × it.
                                      Arrival gaps, trace times and think times are model
                                      times multiplied by it; every time reported is wall ÷ it
                                      (0: nothing sleeps and times are reported as measured) */
    double think_ms;             /**< mean think time between a session's turns, model ms;
                                      drawn exponentially per turn, 0 = none */
    double slo_ttft_ms;          /**< goodput: a request meets the SLO when its TTFT is at most
                                      this many model ms (default 2000) … */
    double slo_itl_ms;           /**< … and its mean inter-token latency at most this (100) */
    size_t sessions;             /**< sessions to start (0 = the trace's); session v replays the
                                      trace's session v mod n as copy v / n (CONCURRENCY and
                                      RATE only) */
    uint32_t pass;               /**< 0 for a plain replay; a sweep numbers its passes from 1.
                                      Every copy of a session in a pass other than 0, and every
                                      copy past the first, carries a tag of (pass, copy) in its
                                      prompt (kvr_bench_body_opts.variant) and session id, so
                                      no pass or copy hits what another left in a cache, while
                                      a shared system prompt stays shared */
    bool append;                 /**< add to the run passed to kvr_bench_replay() (its records,
                                      tallies and gauges) instead of starting it afresh */
    double session_header_share; /**< share of sessions (0–1) sent with `x-session-id`;
                                      conversation formats only (a request-trace row is no
                                      real session, and a unique id per row would only scatter
                                      session-keyed policies) */
    uint64_t seed;               /**< seeds header choice, think times, arrivals, synthetic text */
    uint32_t max_tokens_cap;     /**< cap on max_tokens (0 = none) */
    uint32_t default_max_tokens; /**< max_tokens when a turn's answer length is unknown */
    bool ignore_eos;             /**< send vLLM's "ignore_eos": true */
    unsigned max_inflight;       /**< hard cap on concurrent requests in every mode */
    long timeout_ms;             /**< whole-request timeout (libcurl CURLOPT_TIMEOUT_MS) */
    long connect_timeout_ms;     /**< connect timeout */
    size_t max_event_bytes;      /**< cap on one SSE event / error body kept, bytes */
    double bypass_share;         /**< share of requests (0–1) sent straight to one of
                                      `bypass_workers` instead of `url`, as another router or a
                                      direct client would send them; each request's fate and
                                      worker are kvr_bench_bypass_pick() of (seed, session,
                                      turn), so every policy replays the same bypass */
    const char *const *bypass_workers; /**< worker base URLs for bypassed requests */
    size_t nbypass_workers;      /**< entries of bypass_workers (≥ 1 when bypass_share > 0) */
    int progress;                /**< 0 none, 1 a line every 10 s, 2 redraw a bar (a TTY) */
    volatile sig_atomic_t *stop; /**< when set to non-zero (SIGINT), stop starting requests and
                                      abort the ones in flight; may be NULL */
} kvr_bench_config;

/** Fills `c` with the defaults documented in docs/bench.md (url, model left NULL). */
void kvr_bench_config_defaults(kvr_bench_config *c);

/** The outcome of one request. */
typedef struct kvr_bench_record {
    uint32_t session;          /**< index into the trace's sessions */
    uint32_t copy;             /**< which copy of that session (kvr_bench_config.sessions) */
    uint32_t pass;             /**< kvr_bench_config.pass of the replay that sent it */
    uint32_t turn;             /**< turn index within the session */
    int status;                /**< HTTP status; 0 when no response came */
    int error;                 /**< index into kvr_bench_run.errors, -1 for success */
    int worker;                /**< index into kvr_bench_run.workers (x-kvroute-worker, or the
                                    URL when the header is absent), -1 when no response */
    int decision;              /**< index into kvr_bench_run.decisions, -1 when absent */
    bool session_header;       /**< the request carried x-session-id */
    bool bypassed;             /**< sent straight to a worker (--bypass-share), not to `url` */
    double start_s;            /**< send time, wall seconds since the run started */
    double ttft_s;             /**< time to the first content byte, wall s; NAN when none came */
    double e2e_s;              /**< time to the end of the response, wall s */
    int64_t prompt_tokens;     /**< usage.prompt_tokens; -1 when not reported */
    int64_t cached_tokens;     /**< usage.prompt_tokens_details.cached_tokens (0 when usage came
                                    without it); -1 when no usage */
    int64_t completion_tokens; /**< usage.completion_tokens; -1 when not reported */
} kvr_bench_record;

/** Everything a replay measured. Free with kvr_bench_run_free(). */
typedef struct kvr_bench_run {
    kvr_bench_record *records;  /**< one per finished request, in completion order (owned) */
    size_t nrecords;            /**< records stored */
    size_t planned;             /**< requests the trace offered */
    kvr_bench_tally errors;     /**< error kind → requests: "http_503", "timeout", "connect",
                                     "transfer", "stream_error", "no_usage", "no_done", … */
    kvr_bench_tally workers;    /**< worker → requests that got a response from it */
    kvr_bench_tally decisions;  /**< x-kvroute-decision label → requests */
    kvr_bench_gauge *inflight;  /**< per worker (same index as workers): requests between its
                                     response headers and the end of the response (owned) */
    size_t inflight_cap;        /**< allocated gauges */
    uint64_t start_ns;          /**< monotonic start of the replay (of the first, appending) */
    uint64_t end_ns;            /**< monotonic end */
    double elapsed_s;           /**< end − start, wall seconds */
    double model_per_wall;      /**< model seconds per wall second: 1 / time_scale (1 when the
                                     scale is 0); reports multiply wall times by it */
    double slo_ttft_s;          /**< the config's SLO, model seconds */
    double slo_itl_s;           /**< the config's SLO, model seconds */
    bool interrupted;           /**< stopped by the stop flag before the trace ended */
} kvr_bench_run;

/** Replays `t` as `c` says, filling `out` (zeroed first unless c->append). Returns 0 (request failures are
 *  recorded, not returned), or -1 with a message in err[errlen] when the replay could not run
 *  at all (bad config, libcurl could not start, out of memory). */
int kvr_bench_replay(const kvr_bench_trace *t, const kvr_bench_config *c, kvr_bench_run *out,
                     char *err, size_t errlen);
/** Frees what a run owns. */
void kvr_bench_run_free(kvr_bench_run *r);

/** Picks which sessions carry `x-session-id`: exactly round(share × n) of the n sessions,
 *  chosen by a seeded hash so the choice is stable across runs and policies. Writes n flags
 *  into `out`. Returns 0, or -1 when memory ran out. */
int kvr_bench_pick_header_sessions(size_t n, double share, uint64_t seed, bool *out);
/** Bypass choice for turn `turn` of session `session`: -1 when the request goes to the router
 *  (probability 1 − share), else the index (uniform in [0, nworkers)) of the worker it goes to
 *  directly. A pure function of (seed, session, turn), so every policy's run bypasses the same
 *  requests to the same workers. share ≤ 0 or nworkers == 0 always gives -1. */
int kvr_bench_bypass_pick(uint64_t seed, size_t session, size_t turn, double share, size_t nworkers);
/** The URL (index below `nurls` >= 1) a request goes to with --spread random: a pure function
 *  of (seed, session, turn), so every policy's run spreads the same requests alike. */
size_t kvr_bench_spread_pick(uint64_t seed, size_t session, size_t turn, size_t nurls);
/** The body variant (kvr_bench_body_opts.variant) of copy `copy` of a session in sweep pass
 *  `pass`: 0 for copy 0 of pass 0 (the trace as recorded), else (pass << 32) | copy. */
uint64_t kvr_bench_variant(uint32_t pass, uint32_t copy);
/** A think time in ms for turn `turn` of session `session`: exponential with mean `mean_ms`,
 *  a pure function of (seed, session, turn) so runs are reproducible. */
double kvr_bench_think_ms(uint64_t seed, size_t session, size_t turn, double mean_ms);

/** What the streaming parser extracted from one response. */
typedef struct kvr_bench_stream {
    bool first_content;        /**< a chunk with non-empty content, reasoning or tool calls came */
    bool done;                 /**< `data: [DONE]` came */
    bool error;                /**< an event carried an "error" object */
    bool bad_json;             /**< an event's data was not JSON */
    bool usage;                /**< a non-null usage object came */
    int64_t prompt_tokens;     /**< from usage; -1 until seen */
    int64_t cached_tokens;     /**< from usage.prompt_tokens_details; 0 when usage lacks it */
    int64_t completion_tokens; /**< from usage; -1 until seen */
} kvr_bench_stream;

/** Initialises `s` to "nothing seen". */
void kvr_bench_stream_init(kvr_bench_stream *s);
/** Digests one SSE event's data (an OpenAI chat.completion.chunk, "[DONE]" or an error
 *  object). Returns true when this event carried the response's first content. Chunks after the
 *  first content are parsed only when they hold a non-null "usage" or an "error", since usage
 *  comes in the final chunk and parsing every token's chunk would cost more CPU than the worker
 *  simulator. */
bool kvr_bench_stream_event(kvr_bench_stream *s, const char *data, size_t len);

#endif
