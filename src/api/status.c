/* GET /status and the status page's files. */
#include "api/status.h"

#include <jansson.h>
#include <string.h>

#include "api/admin.h"
#include "api/web_assets.h"
#include "obs/status_stats.h"
#include "util/time.h"

/* A scraped value, or null while unknown (< 0). */
static json_t *scraped(double v, int integer)
{
    if (v < 0)
        return json_null();
    return integer ? json_integer((json_int_t)v) : json_real(v);
}

static json_t *route_json(kvr_route *rt)
{
    json_t *workers = json_array();
    for (size_t t = 0; t < rt->ntargets; t++) {
        const kvr_worker *w = rt->targets[t].worker;
        kvr_policy_worker_stats st;
        kvr_route_worker_stats(rt, w, &st);
        json_array_append_new(
            workers,
            json_pack("{s:s,s:s,s:b,s:b,s:s,s:b,s:I,s:o,s:o,s:I,s:I}", "name", w->name, "url",
                      w->url, "eligible", kvr_worker_eligible(w), "healthy", kvr_worker_healthy(w),
                      "breaker", kvr_breaker_state_name(kvr_worker_breaker(w)->state), "draining",
                      w->draining, "inflight", (json_int_t)w->inflight, "queue",
                      scraped(w->queue, 1), "kv_usage", scraped(w->kv_usage, 0),
                      "index_blocks", (json_int_t)st.index_blocks, "sessions",
                      (json_int_t)st.sessions));
    }
    return json_pack("{s:s,s:s,s:o}", "name", rt->name, "policy", rt->ops->name, "workers",
                     workers);
}

void kvr_admin_status(kvr_app *app, kvr_http_req *r)
{
    json_t *routes = json_array();
    for (size_t i = 0; i < app->routes->n; i++)
        json_array_append_new(routes, route_json(app->routes->routes[i]));
    double wall_s = (double)kvr_unix_ns() / 1e9;
    json_t *o = json_pack("{s:I,s:I,s:o}", "time", (json_int_t)wall_s, "generation",
                          (json_int_t)app->generation, "routes", routes);
    if (app->status)
        kvr_status_stats_json(app->status, kvr_now_ms(), wall_s, o);
    kvr_admin_reply(r, 200, o);
}

int kvr_admin_web(kvr_http_req *r)
{
    const char *path = kvr_http_req_path(r), *method = kvr_http_req_method(r);
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
        return 0;
    for (size_t i = 0; i < kvr_web_nassets; i++) {
        const kvr_web_asset *a = &kvr_web_assets[i];
        if (strcmp(path, a->path) != 0)
            continue;
        /* The page loads nothing from elsewhere, and no other site may frame it. */
        static const char csp[] = "default-src 'self'; img-src 'self' data:; "
                                  "frame-ancestors 'none'";
        kvr_http_header h[] = {
            {"Cache-Control", 13, "no-cache", 8},
            {"X-Content-Type-Options", 22, "nosniff", 7},
            {"Content-Security-Policy", 23, csp, sizeof(csp) - 1},
        };
        kvr_http_resp_simple(r, 200, a->content_type, h, 3, a->data, a->len);
        return 1;
    }
    return 0;
}
