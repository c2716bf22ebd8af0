/* Metric families and the served model list. */
#include "app/app.h"

#include <stdlib.h>
#include <string.h>

static const double latency_bounds[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                        1,     2.5,  5,     10,   30,  60,  120, 300};
#define NB (sizeof(latency_bounds) / sizeof(latency_bounds[0]))

static void refresh_workers(void *ud)
{
    kvr_app *app = ud;
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
