/* Metric families and the served model list. */
#include "app/app.h"

#include "obs/access_log.h"
#include "obs/otlp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "events/kvevents.h"
#include "routing/text_scan.h"
#include "upstream/egress.h"
#include "util/log.h"
#include "util/time.h"

static const double latency_bounds[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                        1,     2.5,  5,     10,   30,  60,  120, 300};
#define NB (sizeof(latency_bounds) / sizeof(latency_bounds[0]))

/* kvroute_kv_blocks{model,worker,medium}: each route's targets' resident blocks. */
static void refresh_kv_blocks(kvr_app *app, const kvr_route *rt)
{
    if (!app->kv)
        return;
    for (size_t t = 0; t < rt->ntargets; t++) {
        const kvr_worker *w = rt->targets[t].worker;
        if (!kvr_kv_events_configured(app->kv, w->id)) {
            /* A precise route's worker without events is routed approximately: say so. */
            const char *lw[] = {w->url};
            if (rt->ops->uses_tokens == 1)
                kvr_metric_set(kvr_metrics_find(app->metrics, "kvroute_kv_events_state"), lw,
                               KVR_KV_FALLBACK);
            continue;
        }
        kvr_kv_worker_stats ws;
        kvr_kv_index_worker_stats(kvr_kv_events_index(app->kv), w->id, &ws);
        for (int m = 0; m < KVR_KV_NMEDIA; m++) {
            const char *lv[] = {rt->name, w->url, kvr_kv_medium_name((kvr_kv_medium)m)};
            kvr_metric_set(app->m.kv_blocks, lv, (double)ws.blocks[m]);
        }
    }
}

static void refresh_index(kvr_app *app)
{
    for (size_t i = 0; app->routes && i < app->routes->n; i++) {
        kvr_route *rt = app->routes->routes[i];
        refresh_kv_blocks(app, rt);
        kvr_policy_stats st;
        kvr_route_stats(rt, &st);
        const char *lv[] = {rt->name};
        kvr_metric_set(app->m.index_blocks, lv, (double)st.index_blocks);
        kvr_metric_set(app->m.index_evictions, lv, (double)st.index_evictions);
        kvr_metric_set(app->m.sessions, lv, (double)st.sessions);
        kvr_metric_set(app->m.hash_overflows, lv, (double)st.hash_overflows);
        for (int r = 0; r < KVR_SESSION_EVICT_NREASONS; r++) {
            const char *lr[] = {rt->name,
                                kvr_session_evict_reason_name((kvr_session_evict_reason)r)};
            kvr_metric_set(app->m.session_evictions, lr, (double)st.session_evictions[r]);
        }
    }
}

/* A removed worker's gauges follow it until its last request ended, then its series go. */
static void refresh_departed(kvr_app *app)
{
    size_t k = 0;
    for (size_t i = 0; i < app->ndeparted; i++) {
        kvr_worker *w = app->departed[i];
        const char *lv[] = {w->url};
        if (w->inflight > 0) {
            kvr_metric_set(app->m.inflight, lv, (double)w->inflight);
            app->departed[k++] = w;
            continue;
        }
        /* Re-added under the same URL meanwhile: its series are the new worker's. */
        if (!kvr_registry_find_url(app->reg, w->url)) {
            kvr_metric *per_worker[] = {app->m.inflight, app->m.healthy, app->m.queue,
                                        app->m.kv_usage, app->m.breaker_state,
                                        app->m.kv_blocks, app->m.mispredictions,
                                        app->m.lmcache_occupancy, app->m.lmcache_polls,
                                        app->m.index_corrections};
            for (size_t m = 0; m < sizeof(per_worker) / sizeof(per_worker[0]); m++)
                kvr_metric_remove_matching(per_worker[m], "worker", w->url);
        }
        kvr_worker_unref(w);
    }
    app->ndeparted = k;
}

void kvr_app_depart(kvr_app *app, kvr_worker *w)
{
    kvr_worker **d = realloc(app->departed, (app->ndeparted + 1) * sizeof(*d));
    if (!d)
        return; /* its gauges then keep their last values: harmless */
    kvr_worker_ref(w);
    app->departed = d;
    app->departed[app->ndeparted++] = w;
}

static void refresh_workers(void *ud)
{
    kvr_app *app = ud;
    refresh_index(app);
    refresh_departed(app);
    for (size_t i = 0; i < kvr_registry_count(app->reg); i++) {
        kvr_worker *w = kvr_registry_at(app->reg, i);
        const char *lv[] = {w->url};
        kvr_metric_set(app->m.inflight, lv, (double)w->inflight);
        kvr_metric_set(app->m.healthy, lv, kvr_worker_healthy(w));
        kvr_metric_set(app->m.breaker_state, lv, (double)kvr_worker_breaker(w)->state);
    }
    kvr_metric_set(app->m.access_dropped, NULL, (double)kvr_access_log_dropped(app->access));
    int st[KVR_HTTP_REFUSALS_MAX];
    uint64_t cnt[KVR_HTTP_REFUSALS_MAX];
    size_t nref = app->http ? kvr_http_server_refusals(app->http, st, cnt, KVR_HTTP_REFUSALS_MAX)
                            : 0;
    for (size_t i = 0; i < nref; i++) {
        char code[12];
        snprintf(code, sizeof(code), "%d", st[i]);
        const char *lv[] = {code};
        kvr_metric_set(app->m.http_refusals, lv, (double)cnt[i]);
    }
    uint64_t hits, misses;
    size_t bytes;
    kvr_text_cache_memo_stats(app->text_cache, &hits, &misses, &bytes);
    kvr_metric_set(app->m.text_cache_hits, NULL, (double)hits);
    kvr_metric_set(app->m.text_cache_misses, NULL, (double)misses);
    kvr_metric_set(app->m.text_cache_bytes, NULL, (double)bytes);
    double by_source[3] = {0, 0, 0};
    static const char *const sources[3] = {"config", "api", "kubernetes"};
    for (size_t i = 0; i < kvr_registry_count(app->reg); i++) {
        const char *src = kvr_app_worker_source(app, kvr_registry_at(app->reg, i));
        by_source[src[0] == 'c' ? 0 : src[0] == 'a' ? 1 : 2] += 1;
    }
    for (int i = 0; i < 3; i++) {
        const char *lv[] = {sources[i]};
        kvr_metric_set(app->m.discovery_workers, lv, by_source[i]);
    }
}

void kvr_app_metrics_init(kvr_app *app)
{
    kvr_metrics *r = app->metrics;
    kvr_app_metrics *m = &app->m;
    const char *mec[] = {"model", "endpoint", "code", "key"};
    const char *me[] = {"model", "endpoint"};
    const char *w[] = {"worker"};
    const char *wc[] = {"worker", "code"};
    const char *wk[] = {"worker", "kind"};
    const char *mpd[] = {"model", "policy", "decision"};
    const char *mw[] = {"model", "worker"};
    m->requests = kvr_metrics_counter(r, "kvroute_requests_total",
                                      "Client requests answered, by final status code and "
                                      "client key name (- without auth)",
                                      4, mec);
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
    const char *mst[] = {"status"};
    m->http_refusals = kvr_metrics_counter(r, "kvroute_http_refusals_total",
                                           "Requests the HTTP layer answered with an error "
                                           "before any handler saw them",
                                           1, mst);
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
    m->lmcache_occupancy = kvr_metrics_gauge(r, "kvroute_lmcache_occupancy",
                                             "Occupancy 0..1 in the worker's last well-formed "
                                             "LMCache status answer",
                                             1, w);
    const char *wr[] = {"worker", "result"};
    m->lmcache_polls = kvr_metrics_counter(r, "kvroute_lmcache_polls_total",
                                           "LMCache status polls by result: ok, stale, "
                                           "malformed, error",
                                           2, wr);
    m->index_blocks = kvr_metrics_gauge(r, "kvroute_index_blocks",
                                        "Distinct block keys in the prefix index", 1, mo);
    m->index_evictions = kvr_metrics_counter(r, "kvroute_index_evictions_total",
                                             "Prefix index entries evicted by the caps", 1, mo);
    m->sessions = kvr_metrics_gauge(r, "kvroute_sessions", "Live session map entries", 1, mo);
    m->hash_overflows = kvr_metrics_counter(r, "kvroute_hash_overflows_total",
                                            "consistent_hash/rendezvous_hash picks that passed "
                                            "over the key's owner at its load bound",
                                            1, mo);
    const char *mr[] = {"model", "reason"};
    m->session_evictions = kvr_metrics_counter(r, "kvroute_session_evictions_total",
                                               "Session map entries dropped, by reason", 2, mr);
    const char *res[] = {"result"};
    m->reloads = kvr_metrics_counter(r, "kvroute_config_reloads_total",
                                     "Config reloads (SIGHUP, POST /reload) by result", 1, res);
    m->generation = kvr_metrics_gauge(r, "kvroute_config_generation",
                                      "Configurations applied since start (+1 per reload)", 0,
                                      NULL);
    /* Token errors span one block (16) to whole long prompts. */
    static const double tok_bounds[] = {0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192,
                                        16384, 32768, 65536};
    m->prediction_error = kvr_metrics_histogram(
        r, "kvroute_cache_prediction_error_tokens",
        "|predicted - reported| cached prompt tokens on the chosen worker, per 2xx answer that "
        "reports usage.prompt_tokens_details.cached_tokens",
        1, mo, tok_bounds, sizeof(tok_bounds) / sizeof(tok_bounds[0]));
    m->mispredictions = kvr_metrics_counter(r, "kvroute_cache_mispredictions_total",
                                            "Answers whose reported cached tokens were off the "
                                            "prediction by more than one block",
                                            2, mw);
    m->index_corrections = kvr_metrics_counter(
        r, "kvroute_index_corrections_total",
        "Answers whose reported cached tokens fell short of the prefix index's prediction by "
        "more than one block, so the index dropped what the worker evidently evicted",
        2, mw);
    const char *mwm[] = {"model", "worker", "medium"};
    m->kv_blocks = kvr_metrics_gauge(r, "kvroute_kv_blocks",
                                     "Blocks the worker's KV events say it holds, by tier", 3,
                                     mwm);
    static const double tk_bounds[] = {0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1,
                                       0.2, 0.5, 1};
    m->tokenize_seconds = kvr_metrics_histogram(r, "kvroute_tokenize_seconds",
                                                "Time to get a request's token ids (precise)",
                                                1, mo, tk_bounds,
                                                sizeof(tk_bounds) / sizeof(tk_bounds[0]));
    const char *ms[] = {"model", "source"};
    m->tokenize = kvr_metrics_counter(r, "kvroute_tokenize_total",
                                      "Token id lookups by source (header, prompt_ids, cache, "
                                      "worker) or failure (timeout, failed, none)",
                                      2, ms);
    kvr_otlp_metrics_register(r);
    m->breaker_state = kvr_metrics_gauge(r, "kvroute_worker_breaker_state",
                                         "Circuit breaker state: 0 closed, 1 open, 2 half_open",
                                         1, w);
    const char *ws[] = {"worker", "state"};
    m->breaker_transitions = kvr_metrics_counter(r, "kvroute_breaker_transitions_total",
                                                 "Circuit breaker transitions, by the state "
                                                 "entered",
                                                 2, ws);
    m->retries = kvr_metrics_counter(r, "kvroute_retries_total",
                                     "Requests retried on another worker, by the failure that "
                                     "caused it",
                                     2, mr);
    const char *mres[] = {"model", "result"};
    m->pd_requests = kvr_metrics_counter(r, "kvroute_pd_requests_total",
                                         "Requests of disaggregated routes, by result: ok "
                                         "(prefill and decode workers), local_prefill (a decode "
                                         "worker prefilled itself), error",
                                         2, mres);
    m->pd_prefill_seconds = kvr_metrics_histogram(r, "kvroute_pd_prefill_seconds",
                                                  "Time a disaggregated request's successful "
                                                  "prefill call took, sent to answered",
                                                  1, mo, latency_bounds, NB);
    m->pd_fallbacks = kvr_metrics_counter(r, "kvroute_pd_fallbacks_total",
                                          "Disaggregated requests prefilled on a decode worker, "
                                          "by the last prefill failure (no_prefill_worker, "
                                          "connect, http_503, no_kv_transfer_params, ...)",
                                          2, mr);
    const char *rs[] = {"reason"}, *ep[] = {"endpoint"};
    m->auth_failures = kvr_metrics_counter(r, "kvroute_auth_failures_total",
                                           "Requests refused for a missing or invalid client API "
                                           "key",
                                           1, rs);
    m->egress_denied = kvr_metrics_counter(r, "kvroute_egress_denied_total",
                                           "Connections the egress policy refused at connect "
                                           "time",
                                           1, ep);
    m->queue_depth = kvr_metrics_gauge(r, "kvroute_queue_depth",
                                       "Requests waiting in the admission queue", 1, mo);
    m->queue_wait = kvr_metrics_histogram(r, "kvroute_queue_wait_seconds",
                                          "Time requests waited in the admission queue", 1, mo,
                                          latency_bounds, NB);
    m->rejected = kvr_metrics_counter(r, "kvroute_rejected_total",
                                      "Requests refused by admission: queue_full, "
                                      "queue_timeout, rate_limited",
                                      2, mr);
    const char *src[] = {"source"};
    m->discovery_workers = kvr_metrics_gauge(r, "kvroute_discovery_workers",
                                             "Registered workers by where they came from: "
                                             "config, api (POST /workers), kubernetes",
                                             1, src);
    m->discovery_errors = kvr_metrics_counter(r, "kvroute_discovery_errors_total",
                                              "Failed discovery calls (Kubernetes API: no "
                                              "connection, refused token, 410 excluded, "
                                              "malformed answers)",
                                              1, src);
    const char *k8s_src[] = {"kubernetes"};
    kvr_metric_inc(m->discovery_errors, k8s_src, 0);
    /* Both results exist from the start, so rate() and alerts see a 0 before the first. */
    const char *ok[] = {"ok"}, *error[] = {"error"};
    kvr_metric_inc(m->reloads, ok, 0);
    kvr_metric_inc(m->reloads, error, 0);
    m->access_dropped = kvr_metrics_counter(r, "kvroute_access_log_dropped_total",
                                            "Access-log lines dropped: buffer full or write "
                                            "error (--access-log)",
                                            0, NULL);
    kvr_metric_set(m->access_dropped, NULL, 0);
    m->text_cache_hits = kvr_metrics_counter(r, "kvroute_routing_text_cache_hits_total",
                                             "Messages whose routing text was reused from an "
                                             "earlier request (--routing-text-cache-bytes)",
                                             0, NULL);
    m->text_cache_misses = kvr_metrics_counter(r, "kvroute_routing_text_cache_misses_total",
                                               "Messages long enough to keep whose routing "
                                               "text was built",
                                               0, NULL);
    m->text_cache_bytes = kvr_metrics_gauge(r, "kvroute_routing_text_cache_bytes",
                                            "Memory the kept routing texts take, bytes", 0,
                                            NULL);
    kvr_metric_set(m->text_cache_hits, NULL, 0);
    kvr_metric_set(m->text_cache_misses, NULL, 0);
    kvr_metric_set(m->text_cache_bytes, NULL, 0);
    kvr_metrics_add_process(r);
    kvr_metrics_on_render(r, refresh_workers, app);
}

static void breaker_changed(kvr_app *app, kvr_worker *w, int entered)
{
    if (entered < 0)
        return;
    const char *name = kvr_breaker_state_name((kvr_breaker_state)entered);
    const char *lv[] = {w->url, name}, *lw[] = {w->url};
    kvr_metric_inc(app->m.breaker_transitions, lv, 1);
    kvr_metric_set(app->m.breaker_state, lw, entered);
    if (entered == KVR_BREAKER_OPEN)
        KVR_WARN("msg=\"circuit breaker open\" worker=%s cooldown_ms=%llu", w->url,
                 (unsigned long long)w->breaker.cooldown_ms);
    else
        KVR_INFO("msg=\"circuit breaker %s\" worker=%s", name, w->url);
}

int kvr_app_attempt_start(kvr_app *app, kvr_worker *w)
{
    (void)app;
    return kvr_breaker_on_start(kvr_worker_breaker(w));
}

void kvr_app_attempt_verdict(kvr_app *app, kvr_worker *w, int failure, int trial)
{
    breaker_changed(app, w->engine,
                    kvr_breaker_on_result(kvr_worker_breaker(w), &app->cfg.breaker, failure,
                                          trial, kvr_now_ms()));
}

void kvr_app_attempt_abandon(kvr_app *app, kvr_worker *w, int trial)
{
    (void)app;
    kvr_breaker_on_abandon(kvr_worker_breaker(w), trial);
}

void kvr_app_breaker_tick(kvr_app *app)
{
    uint64_t now = kvr_now_ms();
    for (size_t i = 0; i < kvr_registry_count(app->reg); i++) {
        kvr_worker *w = kvr_registry_at(app->reg, i);
        if (w->engine == w) /* a data-parallel engine's ranks share rank 0's breaker */
            breaker_changed(app, w, kvr_breaker_tick(&w->breaker, now));
    }
}

int kvr_app_allow_connect(void *ud, const char *url, const struct sockaddr *sa)
{
    kvr_app *app = ud;
    char host[256], why[300];
    if (!kvr_egress_active(app->egress))
        return 1;
    if (kvr_egress_url_host(url, host, sizeof(host)) < 0)
        host[0] = '\0';
    if (kvr_egress_check_addr(app->egress, host[0] ? host : NULL, sa, why, sizeof(why)))
        return 1;
    /* The label is the endpoint without its path: bounded by the configured endpoints. */
    char endpoint[300];
    const char *p = strstr(url, "://");
    size_t n = p ? (size_t)(p + 3 - url) + strcspn(p + 3, "/?#") : strlen(url);
    snprintf(endpoint, sizeof(endpoint), "%.*s", (int)n, url);
    const char *lv[] = {endpoint};
    kvr_metric_inc(app->m.egress_denied, lv, 1);
    KVR_WARN("msg=\"egress denied\" endpoint=%s rule=\"%s\"", endpoint, why);
    return 0;
}

kvr_route *kvr_app_route(kvr_app *app, const char *model)
{
    return kvr_route_table_find(app->routes, model);
}

void kvr_app_forget_worker(kvr_app *app, kvr_worker *w)
{
    for (size_t i = 0; app->routes && i < app->routes->n; i++)
        kvr_route_forget_worker(app->routes->routes[i], w);
    if (app->kv)
        kvr_kv_events_forget(app->kv, w);
}

static void on_worker_forget(void *ud, kvr_worker *w)
{
    kvr_app_forget_worker(ud, w);
    kvr_app_cluster_forgot(ud, w);
}

static void on_worker_models(void *ud, kvr_worker *w)
{
    (void)w;
    kvr_app_rediscover(ud);
}

void kvr_app_workers_ctx_init(kvr_app *app)
{
    app->wctx = (kvr_workers_ctx){
        .loop = app->loop,
        .up = app->up,
        .reg = app->reg,
        .health_interval_ms = app->cfg.health_interval_ms,
        .health_path = app->cfg.health_path,
        .unhealthy_threshold = app->cfg.unhealthy_threshold,
        .healthy_threshold = app->cfg.healthy_threshold,
        .forget_after_ms = app->cfg.forget_after_ms,
        .scrape_interval_s = app->cfg.scrape_interval_s,
        .discovery_interval_s = app->cfg.discovery_interval_s,
        .discover = app->discovering,
        .lmcache_interval_ms = app->cfg.lmcache_interval_ms,
        .queue = app->m.queue,
        .kv_usage = app->m.kv_usage,
        .lmcache_occupancy = app->m.lmcache_occupancy,
        .lmcache_polls = app->m.lmcache_polls,
        .on_forget = on_worker_forget,
        .on_models = on_worker_models,
        .ud = app,
    };
}
