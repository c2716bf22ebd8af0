/* The daemon's state: one per process, owned by the loop thread. Modules that serve requests
 * (api, proxy, workers) get it by pointer. */
#ifndef KVR_APP_APP_H
#define KVR_APP_APP_H
#include <stddef.h>
#include <uv.h>

#include "config/config.h"
#include "http/server.h"
#include "obs/metrics.h"
#include "index/session_map.h"
#include "routing/keys.h"
#include "routing/policy.h"
#include "upstream/upstream.h"
#include "workers/registry.h"

#define KVR_MAX_MODELS 32

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
    kvr_metric *match_ratio;       /**< kvroute_prefix_match_ratio{model} (histogram) */
    kvr_metric *index_blocks;      /**< kvroute_index_blocks{model} */
    kvr_metric *index_evictions;   /**< kvroute_index_evictions_total{model} */
    kvr_metric *sessions;          /**< kvroute_sessions{model} */
    kvr_metric *session_evictions; /**< kvroute_session_evictions_total{model,reason} */
    kvr_metric *queue;             /**< kvroute_worker_queue{worker} (scraped) */
    kvr_metric *kv_usage;          /**< kvroute_worker_kv_usage{worker} (scraped) */
} kvr_app_metrics;

/** The process-wide state. */
typedef struct kvr_app {
    uv_loop_t *loop;
    kvr_config cfg;
    kvr_http_server *http;
    kvr_upstream *up;
    kvr_registry *reg;
    kvr_metrics *metrics;
    kvr_app_metrics m;
    const kvr_policy_ops *policy_ops;
    void *policy;                        /**< the policy instance (one model for now) */
    char *models[KVR_MAX_MODELS];        /**< served model names (owned) */
    size_t nmodels;
    int draining;                        /**< SIGTERM received */
    kvr_session_sources session_sources; /**< parsed --session-keys */
    kvr_session_map *response_pins;      /**< Responses API response id → worker */
    kvr_worker **scratch;                /**< room for every worker: eligible-set building */
} kvr_app;

/** Registers kvroute's metric families in app->metrics (which must exist). */
void kvr_app_metrics_init(kvr_app *app);
/** Forgets everything learned about `w` (sessions, prefix index, response pins): it left,
 *  restarted or lost its cache. */
void kvr_app_forget_worker(kvr_app *app, kvr_worker *w);
/** Adds a served model name (copied) unless present. Returns 0, or -1 when the list is full. */
int kvr_app_add_model(kvr_app *app, const char *name);
/** True when `name` is a served model. */
int kvr_app_serves(const kvr_app *app, const char *name);

#endif
