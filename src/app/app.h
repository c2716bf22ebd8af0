/* The daemon's state: one per process, owned by the loop thread. Modules that serve requests
 * (api, proxy) get it by pointer. */
#ifndef KVR_APP_APP_H
#define KVR_APP_APP_H
#include <stddef.h>
#include <uv.h>

#include "config/config.h"
#include "http/server.h"
#include "obs/metrics.h"
#include "routing/keys.h"
#include "routing/route.h"
#include "upstream/upstream.h"
#include "workers/ctx.h"
#include "workers/registry.h"

/** Metric families kvroute exports (names are contracts: docs/metrics.md). */
typedef struct kvr_app_metrics {
    kvr_metric *requests;          /**< kvroute_requests_total{model,endpoint,code} */
    kvr_metric *duration;          /**< kvroute_request_duration_seconds{model,endpoint} */
    kvr_metric *ttft;              /**< kvroute_ttft_seconds{model,endpoint} */
    kvr_metric *inflight;          /**< kvroute_worker_inflight{worker} */
    kvr_metric *healthy;           /**< kvroute_worker_healthy{worker} */
    kvr_metric *worker_requests;   /**< kvroute_worker_requests_total{worker,code} */
    kvr_metric *decisions;         /**< kvroute_decisions_total{model,policy,decision} */
    kvr_metric *upstream_errors;   /**< kvroute_upstream_errors_total{worker,kind} */
    kvr_metric *prompt_tokens;     /**< kvroute_prompt_tokens_total{model,worker} */
    kvr_metric *cached_tokens;     /**< kvroute_cached_tokens_total{model,worker} */
    kvr_metric *completion_tokens; /**< kvroute_completion_tokens_total{model,worker} */
    kvr_metric *client_aborts;     /**< kvroute_client_aborts_total{model,endpoint} */
    kvr_metric *http_refusals;     /**< kvroute_http_refusals_total{status} */
    kvr_metric *match_ratio;       /**< kvroute_prefix_match_ratio{model} (histogram) */
    kvr_metric *index_blocks;      /**< kvroute_index_blocks{model} */
    kvr_metric *index_evictions;   /**< kvroute_index_evictions_total{model} */
    kvr_metric *sessions;          /**< kvroute_sessions{model} */
    kvr_metric *hash_overflows;    /**< kvroute_hash_overflows_total{model} */
    kvr_metric *session_evictions; /**< kvroute_session_evictions_total{model,reason} */
    kvr_metric *queue;             /**< kvroute_worker_queue{worker} (scraped) */
    kvr_metric *kv_usage;          /**< kvroute_worker_kv_usage{worker} (scraped) */
    kvr_metric *lmcache_occupancy; /**< kvroute_lmcache_occupancy{worker} (polled) */
    kvr_metric *lmcache_polls;     /**< kvroute_lmcache_polls_total{worker,result} */
    kvr_metric *reloads;           /**< kvroute_config_reloads_total{result} */
    kvr_metric *breaker_state;     /**< kvroute_worker_breaker_state{worker} (0, 1, 2) */
    kvr_metric *breaker_transitions; /**< kvroute_breaker_transitions_total{worker,state} */
    kvr_metric *retries;           /**< kvroute_retries_total{model,reason} */
    kvr_metric *pd_requests;       /**< kvroute_pd_requests_total{model,result} */
    kvr_metric *pd_prefill_seconds; /**< kvroute_pd_prefill_seconds{model} (histogram) */
    kvr_metric *pd_fallbacks;      /**< kvroute_pd_fallbacks_total{model,reason} */
    kvr_metric *auth_failures;     /**< kvroute_auth_failures_total{reason} */
    kvr_metric *egress_denied;     /**< kvroute_egress_denied_total{endpoint} */
    kvr_metric *queue_depth;       /**< kvroute_queue_depth{model} */
    kvr_metric *queue_wait;        /**< kvroute_queue_wait_seconds{model} (histogram) */
    kvr_metric *rejected;          /**< kvroute_rejected_total{model,reason} */
    kvr_metric *generation;        /**< kvroute_config_generation */
    kvr_metric *prediction_error;  /**< kvroute_cache_prediction_error_tokens{model} (histogram) */
    kvr_metric *mispredictions;    /**< kvroute_cache_mispredictions_total{model,worker} */
    kvr_metric *index_corrections; /**< kvroute_index_corrections_total{model,worker} */
    kvr_metric *kv_blocks;         /**< kvroute_kv_blocks{model,worker,medium} */
    kvr_metric *tokenize_seconds;  /**< kvroute_tokenize_seconds{model} (histogram) */
    kvr_metric *tokenize;          /**< kvroute_tokenize_total{model,source} */
    kvr_metric *discovery_workers; /**< kvroute_discovery_workers{source}: config, api,
                                        kubernetes */
    kvr_metric *discovery_errors;  /**< kvroute_discovery_errors_total{source} */
    kvr_metric *access_dropped;    /**< kvroute_access_log_dropped_total (mirrors the sink's
                                        count at render) */
    kvr_metric *text_cache_hits;   /**< kvroute_routing_text_cache_hits_total (messages whose
                                        kept text was reused; mirrored at render) */
    kvr_metric *text_cache_misses; /**< kvroute_routing_text_cache_misses_total (messages long
                                        enough to keep whose text was built) */
    kvr_metric *text_cache_bytes;  /**< kvroute_routing_text_cache_bytes (kept texts now) */
} kvr_app_metrics;

/** A worker added at run time (POST /workers). The fleet is built from the configuration plus
 *  these, until the next reload or restart drops them (they are not written anywhere). */
typedef struct kvr_api_worker {
    char *url;            /**< base URL (owned) */
    char *name;           /**< its name (owned; the URL unless given) */
    double weight;        /**< > 0 (1) */
    kvr_worker_role role; /**< stored on the worker */
    uint16_t bootstrap_port; /**< a prefill worker's SGLang bootstrap port (0 = 8998) */
    char **routes;        /**< route names (or aliases) it is a target of (owned), when
                               routes_set; else the routes whose model it lists */
    size_t nroutes;
    int routes_set;
    uint32_t data_parallel_size; /**< as posted (`data_parallel_size`; 0 or 1 = plain): the
                                      admin API adds one entry per rank (dp_url set) */
    char *dp_url;         /**< a rank's engine URL (owned; NULL = a plain worker): this entry
                               is rank dp_rank, its url "dp_url#r" */
    int dp_rank;
    const char *source;   /**< who added it: NULL = the admin API ("api"), "kubernetes" =
                               Kubernetes discovery (static string); shown by /workers and
                               counted in kvroute_discovery_workers{source}. Kubernetes'
                               workers survive reloads (the watch owns them) */
} kvr_api_worker;

/** Frees what `aw` owns (not `aw` itself). */
void kvr_api_worker_free(kvr_api_worker *aw);

/** The process-wide state. */
typedef struct kvr_app {
    uv_loop_t *loop;
    kvr_config cfg;                      /**< as loaded at start: global settings (a reload
                                              changes workers, routes and route defaults) */
    kvr_config *live;                    /**< the configuration the fleet was last built from
                                              (&cfg, or a reloaded one owned by the app) */
    int argc;                            /**< the command line, re-applied over the file on
                                              every reload */
    char **argv;
    kvr_http_server *http;
    kvr_upstream *up;
    kvr_registry *reg;
    kvr_workers_ctx wctx;                /**< health checks, scraping, discovery */
    kvr_metrics *metrics;
    kvr_app_metrics m;
    kvr_route_table *routes;             /**< the current routes (swapped by reloads) */
    kvr_api_worker *api_workers;         /**< workers added at run time (POST /workers) */
    size_t napi_workers;
    int discovering;                     /**< routes come from the workers' /v1/models */
    uint64_t generation;                 /**< +1 per applied reload */
    kvr_worker **departed;               /**< workers a reload removed, referenced until their
                                              last request ended and their gauges are gone */
    size_t ndeparted;
    int draining;                        /**< draining: the listener closed, in-flight
                                              requests finishing (after the shutdown delay) */
    int shutting_down;                   /**< SIGTERM received: /readyz answers 503 while
                                              kvroute still serves (--shutdown-delay-ms) */
    struct kvr_auth *auth;               /**< client keys (NULL = no client auth) */
    struct kvr_auth **auth_retired;      /**< stores replaced by reloads: requests in flight
                                              still label metrics with their key names */
    size_t nauth_retired;
    struct kvr_egress *egress;           /**< the egress policy in force */
    struct kvr_admission *admission;     /**< requests waiting for a slot */
    struct kvr_ratelimits *ratelimits;   /**< per-key limits in force */
    kvr_session_sources session_sources; /**< parsed --session-keys */
    struct kvr_kv_events *kv;            /**< KV events and the KV block index */
    struct kvr_tokenizer *tokenizer;     /**< prompt token ids for precise routing */
    struct kvr_otlp *otlp;               /**< span exporter (NULL: no --otlp-endpoint) */
    struct kvr_access_log *access;       /**< the access log (NULL: no --access-log) */
    struct kvr_k8s *k8s;                 /**< Kubernetes discovery (NULL: no --k8s-service) */
    struct kvr_cluster *cluster;         /**< the replicas' shared state (NULL: no --redis) */
    uint64_t *cluster_keys;              /**< scratch: one entry's block keys */
    size_t ncluster_keys;
    struct kvr_status_stats *status;     /**< the admin GET /status figures (NULL = none
                                              kept) */
    struct kvr_text_cache *text_cache;   /**< the tools sections of recent chat requests'
                                              routing texts (routing/text_scan.h; NULL =
                                              none kept) */
} kvr_app;

/** Registers kvroute's metric families in app->metrics (which must exist). */
void kvr_app_metrics_init(kvr_app *app);

/** Builds (or rebuilds) the fleet from `c` and the workers added at run time: registers them
 *  (a worker whose URL is already registered is kept with its load, health and learned state;
 *  its name and weight are updated), removes the workers neither has (each finishes its
 *  requests), and makes the routes (kvr_app_build_routes). Returns 0, or -1 with messages in
 *  `errs` (nothing changed then). `c` must outlive the next call (discovery rebuilds from it):
 *  the app keeps it as app->live. */
int kvr_app_apply(kvr_app *app, kvr_config *c, kvr_errlist *errs);

/** Re-reads the config file and the command line and applies them (SIGHUP, POST /reload).
 *  Workers added at run time are dropped (the new configuration is the whole fleet); a
 *  configuration that fails validation changes nothing, those workers included. Counts
 *  kvroute_config_reloads_total{result} and kvroute_config_generation; logs every error and
 *  every changed setting that needs a restart. Returns 0, or -1 with the errors in `errs`. */
int kvr_app_reload(kvr_app *app, kvr_errlist *errs);

/** Rebuilds the discovered routes from the workers' current model lists (discovery). */
void kvr_app_rediscover(kvr_app *app);

/** Makes the routes from `c` and the registered workers (those added at run time included)
 *  and swaps them in (requests in progress keep theirs): the file's routes, else one route
 *  `--model` over every worker, else one per model the workers list. A route keeps what it
 *  learned when its name and policy survive. Call again with app->live when the fleet
 *  changed (a worker's weight, a worker added or removed). Returns 0, or -1 with messages in
 *  `errs` (the routes then unchanged). */
int kvr_app_build_routes(kvr_app *app, const kvr_config *c, kvr_errlist *errs);

/** Adds worker `aw` (copied) at run time — a data-parallel engine (data_parallel_size > 1,
 *  dp_url unset) as its ranks "URL#r" named "NAME#r", all or none, returning rank 0 (its
 *  other ranks: kvr_registry_ranks) —: registers it (role set; `models`, `nmodels` ids,
 *  may be NULL, as its /v1/models list) and rebuilds the routes keeping what they learned.
 *  Its targets: the routes `aw` names; else, with --model, that one route (as any --worker);
 *  else the routes whose name, alias or target model its list holds (a discovered route is
 *  a model it lists). The caller checked that its URL and name are free. Returns the worker,
 *  or NULL with messages in `errs` (nothing changed). */
kvr_worker *kvr_app_add_worker(kvr_app *app, const kvr_api_worker *aw,
                               const char *const *models, size_t nmodels, kvr_errlist *errs);

/** Removes worker `w`, added at run time, as a reload removes one: it leaves the registry and
 *  the routes at once (never eligible again; what was learned about it forgotten) and its
 *  requests in flight finish. Returns 0, or -1 when `w` was not added at run time. */
int kvr_app_remove_worker(kvr_app *app, kvr_worker *w);

/** The run-time entry of `w`, or NULL for a configured worker. */
kvr_api_worker *kvr_app_api_worker(const kvr_app *app, const kvr_worker *w);

/** The route a client's `model` names (name or alias), or NULL. Borrowed: take a reference
 *  (kvr_route_ref) to keep it past the current loop callback. */
kvr_route *kvr_app_route(kvr_app *app, const char *model);

/** Forgets everything every route learned about `w` (it left, restarted or lost its cache),
 *  and its KV block index entries (its KV events are then replayed from 0). */
void kvr_app_forget_worker(kvr_app *app, kvr_worker *w);

/** Keeps `w` (just removed by a reload) referenced until its in-flight requests ended, so its
 *  kvroute_worker_inflight series follows them to 0 and then disappears with its other
 *  per-worker gauges. */
void kvr_app_depart(kvr_app *app, kvr_worker *w);

/** An upstream attempt starts on `w` (after kvr_worker_acquire). Returns 1 when it is the
 *  circuit breaker's half-open trial (give that back with the verdict), else 0. */
int kvr_app_attempt_start(kvr_app *app, kvr_worker *w);
/** The attempt's verdict for `w`'s circuit breaker (`failure`: connect error or timeout,
 *  first-byte timeout, cut before the response ended, 5xx, stalled stream; 0 for anything
 *  else, 4xx included). Counts and logs the transitions. */
void kvr_app_attempt_verdict(kvr_app *app, kvr_worker *w, int failure, int trial);
/** The attempt ended with no verdict (client abort, shutdown): frees a trial's slot. */
void kvr_app_attempt_abandon(kvr_app *app, kvr_worker *w, int trial);
/** Moves open breakers whose cooldown passed to half_open (call periodically). */
void kvr_app_breaker_tick(kvr_app *app);

/** The upstream client's connect-time hook (kvr_upstream_opts.allow_connect, `ud` = the app):
 *  checks the address against app->egress and counts kvroute_egress_denied_total{endpoint}
 *  (endpoint = the URL's scheme, host and port) when refused. */
int kvr_app_allow_connect(void *ud, const char *url, const struct sockaddr *sa);

/** Starts Kubernetes discovery (src/workers/k8s.h) when the configuration names services:
 *  the endpoints it finds are workers added as at run time with source "kubernetes" (egress
 *  policy checked first; named after their pod, or their URL when that name is taken), set
 *  draining and removed as their EndpointSlices say; without --model their /v1/models is read
 *  at once. Returns 0 (also with no services), or -1 with the reason in `err`. */
int kvr_app_k8s_start(kvr_app *app, char *err, size_t cap);

/** The source of `w` as /workers and kvroute_discovery_workers name it: "config", "api" or
 *  "kubernetes". */
const char *kvr_app_worker_source(const kvr_app *app, const kvr_worker *w);
/** Starts sharing routing state through Redis when --redis is set (src/app/replicas.c):
 *  other replicas' log entries are applied to the routes, this replica's loads published
 *  and theirs added to the workers' remote_inflight. Returns 0 (also without --redis), or -1
 *  with a reason in `err`. */
int kvr_app_cluster_start(kvr_app *app, char *err, size_t cap);
/** Worker `w` of route `r` was just taught keys `k` (kvr_route_teach): appends it to the
 *  routing log (block keys and session digest only). No-op without a cluster, or for a
 *  policy that learns nothing. */
void kvr_app_cluster_taught(kvr_app *app, kvr_route *r, kvr_worker *w, const kvr_route_keys *k);
/** The self-correcting index of route `r` found `w` without part of keys `k`'s text (it
 *  reported `cached` of `prompt` tokens; kvr_route_correct returned 1): tells the other
 *  replicas which block it lacked, so they drop what it used no later too. */
void kvr_app_cluster_corrected(kvr_app *app, kvr_route *r, kvr_worker *w,
                               const kvr_route_keys *k, int64_t cached, int64_t prompt);
/** Worker `w` lost its cache (restart, long outage): tells the other replicas. */
void kvr_app_cluster_forgot(kvr_app *app, kvr_worker *w);

/** Sets up app->wctx from the configuration (after reg, up and metrics exist). */
void kvr_app_workers_ctx_init(kvr_app *app);

#endif
