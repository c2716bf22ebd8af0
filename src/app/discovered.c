/* Workers found by Kubernetes discovery (src/workers/k8s.h) join the fleet as workers added at
 * run time, with source "kubernetes". */
#include <stdio.h>
#include <string.h>

#include "app/app.h"
#include "events/kvevents.h"
#include "upstream/egress.h"
#include "util/log.h"
#include "workers/discovery.h"
#include "workers/k8s.h"

static const char K8S_SOURCE[] = "kubernetes";

const char *kvr_app_worker_source(const kvr_app *app, const kvr_worker *w)
{
    const kvr_api_worker *aw = kvr_app_api_worker(app, w);
    return !aw ? "config" : aw->source ? aw->source : "api";
}

/* The routes of the configuration bound to `service` (routes[].service), into `names`. */
static size_t bound_routes(const kvr_app *app, const char *service, char **names, size_t cap)
{
    size_t n = 0;
    const kvr_config *c = app->live ? app->live : &app->cfg;
    for (size_t i = 0; i < c->nroutes && n < cap; i++)
        if (c->routes[i].k8s_service && strcmp(c->routes[i].k8s_service, service) == 0)
            names[n++] = (char *)c->routes[i].name;
    return n;
}

static int k8s_add(void *ud, const char *service, const char *name, const char *url,
                   const char *kv, const char *kv_replay)
{
    kvr_app *app = ud;
    char why[256];
    kvr_worker *dup;
    if (kvr_registry_find_url(app->reg, url) || kvr_registry_find_engine(app->reg, url, &dup, 1)) {
        KVR_WARN("msg=\"kubernetes endpoint is already a worker\" worker=%s", url);
        return -1;
    }
    if (!kvr_egress_check_url(app->egress, url, why, sizeof(why))) {
        KVR_WARN("msg=\"kubernetes endpoint refused by the egress policy\" worker=%s rule=\"%s\"",
                 url, why);
        return -1;
    }
    /* Pods are unique per namespace, not across services: a taken name falls back to the
     * URL, which is. */
    if (kvr_registry_find_name(app->reg, name))
        name = url;
    /* A service bound to routes feeds those routes only; else the usual rules (--model's
     * route, or the routes its /v1/models names). */
    char *routes[64];
    size_t nroutes = bound_routes(app, service, routes, 64);
    kvr_api_worker aw = {.url = (char *)url, .name = (char *)name, .weight = 1,
                         .role = KVR_ROLE_BOTH, .source = K8S_SOURCE, .routes = routes,
                         .nroutes = nroutes, .routes_set = nroutes > 0,
                         .data_parallel_size = app->cfg.k8s.data_parallel_size};
    kvr_errlist errs = {0};
    kvr_worker *w = kvr_app_add_worker(app, &aw, NULL, 0, &errs);
    if (!w) {
        KVR_WARN("msg=\"kubernetes endpoint not added\" worker=%s error=\"%s\"", url,
                 errs.n ? errs.msg[0] : "");
        kvr_errlist_free(&errs);
        return -1;
    }
    kvr_errlist_free(&errs);
    /* A data-parallel engine's rank r publishes on the events ports + r (vLLM). */
    kvr_worker *ranks[KVR_MAX_DP_SIZE] = {w};
    size_t n = 1 + kvr_registry_ranks(app->reg, w, ranks + 1, KVR_MAX_DP_SIZE - 1);
    for (size_t i = 0; kv && app->kv && i < n; i++) {
        char ep[300], rep[300];
        unsigned r = ranks[i]->dp_rank > 0 ? (unsigned)ranks[i]->dp_rank : 0;
        int bad = kvr_kv_events_offset(kv, r, ep, sizeof(ep)) < 0 ||
                  (kv_replay && kvr_kv_events_offset(kv_replay, r, rep, sizeof(rep)) < 0);
        kvr_kv_events_spec kvs = {ep, kv_replay ? rep : NULL, app->cfg.k8s.kv_topic, 0, 0};
        if (bad || kvr_kv_events_configure(app->kv, ranks[i], &kvs) < 0)
            KVR_WARN("msg=\"KV-event endpoint refused\" worker=%s endpoint=%s", ranks[i]->url,
                     kv);
    }
    kvr_discovery_probe(&app->wctx, w); /* its models at once, not at the next tick */
    return 0;
}

/* The workers an endpoint is: itself, or every rank of the data-parallel engine at it. */
static size_t endpoint_workers(kvr_app *app, const char *url, kvr_worker **out)
{
    if ((out[0] = kvr_registry_find_url(app->reg, url)))
        return 1;
    return kvr_registry_find_engine(app->reg, url, out, KVR_MAX_DP_SIZE);
}

static void k8s_set_draining(void *ud, const char *url, int draining)
{
    kvr_app *app = ud;
    kvr_worker *ws[KVR_MAX_DP_SIZE];
    size_t n = endpoint_workers(app, url, ws);
    for (size_t i = 0; i < n; i++)
        ws[i]->draining = draining;
}

static void k8s_remove(void *ud, const char *url)
{
    kvr_app *app = ud;
    kvr_worker *ws[KVR_MAX_DP_SIZE];
    size_t n = endpoint_workers(app, url, ws);
    for (size_t i = 0; i < n; i++)
        kvr_app_remove_worker(app, ws[i]);
}

int kvr_app_k8s_start(kvr_app *app, char *err, size_t cap)
{
    if (!app->cfg.k8s.nservices)
        return 0;
    kvr_k8s_hooks h = {
        .add = k8s_add,
        .set_draining = k8s_set_draining,
        .remove = k8s_remove,
        .allow_connect = kvr_app_allow_connect,
        .ud = app,
    };
    app->k8s = kvr_k8s_start(app->loop, &app->cfg.k8s, &h, app->m.discovery_errors, err, cap);
    return app->k8s ? 0 : -1;
}
