/* Operational endpoints. */
#include "api/ops.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/reply.h"
#include "util/time.h"

static void reply_json(kvr_app *app, kvr_http_req *r, int status, json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!s) {
        kvr_reply_error(app, r, NULL, 500, "out of memory", NULL, NULL, NULL, 0);
        return;
    }
    kvr_reply_count(app, r, NULL, status);
    kvr_http_resp_simple(r, status, "application/json", NULL, 0, s, strlen(s));
    free(s);
}

static json_t *model_object(const char *id)
{
    return json_pack("{s:s,s:s,s:I,s:s}", "id", id, "object", "model", "created",
                     (json_int_t)kvr_unix_time(), "owned_by", "kvroute");
}

void kvr_api_models(kvr_app *app, kvr_http_req *r)
{
    json_t *data = json_array();
    for (size_t i = 0; i < app->routes->n; i++) {
        const kvr_route *rt = app->routes->routes[i];
        json_array_append_new(data, model_object(rt->name));
        for (size_t a = 0; a < rt->naliases; a++)
            json_array_append_new(data, model_object(rt->aliases[a]));
    }
    reply_json(app, r, 200, json_pack("{s:s,s:o}", "object", "list", "data", data));
}

void kvr_api_model(kvr_app *app, kvr_http_req *r, const char *id)
{
    if (!kvr_app_route(app, id)) {
        kvr_reply_error(app, r, NULL, 404, "The model does not exist or is not served here",
                      "model", "model_not_found", NULL, 0);
        return;
    }
    reply_json(app, r, 200, model_object(id));
}

void kvr_api_healthz(kvr_app *app, kvr_http_req *r)
{
    reply_json(app, r, app->draining ? 503 : 200,
               json_pack("{s:s}", "status", app->draining ? "draining" : "ok"));
}

void kvr_api_readyz(kvr_app *app, kvr_http_req *r)
{
    size_t n = kvr_registry_eligible_count(app->reg);
    /* A replica sharing state is ready once it replayed the routing log (or gave up on it
     * after --redis-warm-timeout-ms): it then routes like the others from its first request.
     * From SIGTERM on it is not ready (--shutdown-delay-ms). */
    int warm = !app->cluster || kvr_cluster_warm(app->cluster);
    int stopping = app->draining || app->shutting_down;
    /* Prefill workers alone answer no request (a disaggregated route's decode side is down). */
    int ready = kvr_registry_serving_count(app->reg) > 0 && app->routes->n > 0 && !stopping &&
                warm;
    json_t *j = json_pack("{s:s,s:I,s:I}", "status",
                          ready ? "ready" : stopping ? "shutting_down" : "not_ready",
                          "eligible_workers", (json_int_t)n, "workers",
                          (json_int_t)kvr_registry_count(app->reg));
    if (app->cluster)
        json_object_set_new(j, "cluster_warm", json_boolean(warm));
    reply_json(app, r, ready ? 200 : 503, j);
}

void kvr_api_metrics(kvr_app *app, kvr_http_req *r)
{
    kvr_buf b;
    kvr_buf_init(&b, 0);
    kvr_reply_count(app, r, NULL, 200);
    if (kvr_metrics_render(app->metrics, &b) < 0) {
        kvr_buf_free(&b);
        kvr_reply_error(app, r, NULL, 500, "metrics rendering failed", NULL, NULL, NULL, 0);
        return;
    }
    kvr_http_resp_simple(r, 200, "text/plain; version=0.0.4; charset=utf-8", NULL, 0, b.data,
                         b.len);
    kvr_buf_free(&b);
}
