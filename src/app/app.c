/* Metric families and the served model list. */
#include "app/app.h"

#include <stdlib.h>
#include <string.h>

#include "routing/policies.h"
#include "routing/policy_cache_aware.h"

static const double latency_bounds[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                        1,     2.5,  5,     10,   30,  60,  120, 300};
#define NB (sizeof(latency_bounds) / sizeof(latency_bounds[0]))

static void refresh_index(kvr_app *app)
{
    if (app->policy_ops != &kvr_policy_cache_aware || !app->policy)
        return;
    kvr_cache_aware_stats st;
    kvr_cache_aware_stats_get(app->policy, &st);
    const char *model = app->nmodels ? app->models[0] : "";
    const char *lv[] = {model};
    kvr_metric_set(app->m.index_blocks, lv, (double)st.index_blocks);
    kvr_metric_set(app->m.index_evictions, lv, (double)st.index_evictions);
    kvr_metric_set(app->m.sessions, lv, (double)st.sessions);
    for (int r = 0; r < KVR_SESSION_EVICT_NREASONS; r++) {
        const char *lr[] = {model, kvr_session_evict_reason_name((kvr_session_evict_reason)r)};
        kvr_metric_set(app->m.session_evictions, lr, (double)st.session_evictions[r]);
    }
}

static void refresh_workers(void *ud)
{
    kvr_app *app = ud;
    refresh_index(app);
    for (size_t i = 0; i < kvr_registry_count(app->reg); i++) {
        kvr_worker *w = kvr_registry_at(app->reg, i);
        const char *lv[] = {w->url};
        kvr_metric_set(app->m.inflight, lv, (double)w->inflight);
        kvr_metric_set(app->m.healthy, lv, w->healthy);
    }
}

void kvr_app_metrics_init(kvr_app *app)
{
    kvr_metrics *r = app->metrics;
    kvr_app_metrics *m = &app->m;
    const char *mec[] = {"model", "endpoint", "code"};
    const char *me[] = {"model", "endpoint"};
    const char *w[] = {"worker"};
    const char *wc[] = {"worker", "code"};
    const char *wk[] = {"worker", "kind"};
    const char *mpd[] = {"model", "policy", "decision"};
    const char *mw[] = {"model", "worker"};
    m->requests = kvr_metrics_counter(r, "kvroute_requests_total",
                                      "Client requests answered, by final status code", 3, mec);
    m->duration = kvr_metrics_histogram(r, "kvroute_request_duration_seconds",
                                        "Time from a request's first byte to its last response "
                                        "byte",
                                        2, me, latency_bounds, NB);
    m->ttft = kvr_metrics_histogram(r, "kvroute_ttft_seconds",
                                    "Time from a request's first byte to the first upstream "
                                    "body byte",
                                    2, me, latency_bounds, NB);
    m->inflight = kvr_metrics_gauge(r, "kvroute_worker_inflight",
                                    "Upstream attempts in progress per worker", 1, w);
    m->healthy = kvr_metrics_gauge(r, "kvroute_worker_healthy",
                                   "1 while the worker's last health check passed", 1, w);
    m->worker_requests = kvr_metrics_counter(r, "kvroute_worker_requests_total",
                                             "Upstream attempts per worker by status code "
                                             "(0 = no response)",
                                             2, wc);
    m->decisions = kvr_metrics_counter(r, "kvroute_decisions_total",
                                       "Routing decisions by label", 3, mpd);
    m->upstream_errors = kvr_metrics_counter(r, "kvroute_upstream_errors_total",
                                             "Upstream attempts that failed, by kind", 2, wk);
    m->prompt_tokens = kvr_metrics_counter(r, "kvroute_prompt_tokens_total",
                                           "usage.prompt_tokens of answered requests", 2, mw);
    m->cached_tokens = kvr_metrics_counter(r, "kvroute_cached_tokens_total",
                                           "usage.prompt_tokens_details.cached_tokens", 2, mw);
    m->completion_tokens = kvr_metrics_counter(r, "kvroute_completion_tokens_total",
                                               "usage.completion_tokens", 2, mw);
    m->client_aborts = kvr_metrics_counter(r, "kvroute_client_aborts_total",
                                           "Requests whose client went away before the end",
                                           2, me);
    static const double ratio_bounds[] = {0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1};
    const char *mo[] = {"model"};
    m->match_ratio = kvr_metrics_histogram(r, "kvroute_prefix_match_ratio",
                                           "Best prefix match ratio over eligible workers at "
                                           "decision time",
                                           1, mo, ratio_bounds,
                                           sizeof(ratio_bounds) / sizeof(ratio_bounds[0]));
    m->queue = kvr_metrics_gauge(r, "kvroute_worker_queue",
                                 "Requests waiting in the worker's queue (scraped "
                                 "vllm:num_requests_waiting)",
                                 1, w);
    m->kv_usage = kvr_metrics_gauge(r, "kvroute_worker_kv_usage",
                                    "Worker KV cache usage 0..1 (scraped "
                                    "vllm:kv_cache_usage_perc)",
                                    1, w);
    m->index_blocks = kvr_metrics_gauge(r, "kvroute_index_blocks",
                                        "Distinct block keys in the prefix index", 1, mo);
    m->index_evictions = kvr_metrics_counter(r, "kvroute_index_evictions_total",
                                             "Prefix index entries evicted by the caps", 1, mo);
    m->sessions = kvr_metrics_gauge(r, "kvroute_sessions", "Live session map entries", 1, mo);
    const char *mr[] = {"model", "reason"};
    m->session_evictions = kvr_metrics_counter(r, "kvroute_session_evictions_total",
                                               "Session map entries dropped, by reason", 2, mr);
    kvr_metrics_add_process(r);
    kvr_metrics_on_render(r, refresh_workers, app);
}

int kvr_app_add_model(kvr_app *app, const char *name)
{
    if (kvr_app_serves(app, name))
        return 0;
    if (app->nmodels == KVR_MAX_MODELS)
        return -1;
    char *c = strdup(name);
    if (!c)
        return -1;
    app->models[app->nmodels++] = c;
    return 0;
}

int kvr_app_serves(const kvr_app *app, const char *name)
{
    for (size_t i = 0; i < app->nmodels; i++)
        if (strcmp(app->models[i], name) == 0)
            return 1;
    return 0;
}

void kvr_app_forget_worker(kvr_app *app, kvr_worker *w)
{
    if (app->policy_ops->forget_worker)
        app->policy_ops->forget_worker(app->policy, w);
    if (app->response_pins)
        kvr_session_map_forget_worker(app->response_pins, w->id);
}
