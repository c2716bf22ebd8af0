/* Active health checks and model discovery. */
#include "workers/health.h"

#include <jansson.h>
#include <stdlib.h>

#include "util/log.h"
#include "workers/probe.h"

#define BODY_CAP (64 * 1024)

static uv_timer_t g_timer;
static int g_running;

static void on_health(kvr_app *app, kvr_worker *w, int status, const char *body, size_t len,
                      kvr_upstream_err err)
{
    (void)body;
    (void)len;
    int ok = status >= 200 && status < 300;
    if (w && ok != w->healthy) {
        if (ok) {
            KVR_INFO("msg=\"worker healthy\" worker=%s", w->url);
            w->healthy = 1;
        } else {
            KVR_WARN("msg=\"worker unhealthy\" worker=%s status=%d kind=%s", w->url, status,
                     kvr_upstream_err_name(err));
            kvr_health_mark_down(app, w);
        }
    }
}

static void on_models(kvr_app *app, kvr_worker *w, int status, const char *body, size_t len,
                      kvr_upstream_err err)
{
    (void)err;
    if (status != 200 || !w)
        return;
    json_t *j = json_loadb(body, len, 0, NULL);
    json_t *data = json_object_get(j, "data"), *m;
    size_t i;
    json_array_foreach(data, i, m)
    {
        const char *id = json_string_value(json_object_get(m, "id"));
        if (id && !kvr_app_serves(app, id) && kvr_app_add_model(app, id) == 0)
            KVR_INFO("msg=\"model discovered\" model=%s worker=%s", id, w->url);
    }
    json_decref(j);
}

static uint64_t probe_timeout(const kvr_app *app)
{
    /* A probe must end before the next round starts, or slow workers pile probes up. */
    uint64_t t = app->cfg.health_interval_ms ? app->cfg.health_interval_ms : 1000;
    return t < 5000 ? t : 5000;
}

void kvr_health_mark_down(kvr_app *app, kvr_worker *w)
{
    if (!w->healthy)
        return;
    w->healthy = 0;
    /* A worker that failed may come back restarted with an empty cache: what was learned about
     * it is no longer true. */
    kvr_app_forget_worker(app, w);
}

static void round_cb(uv_timer_t *t)
{
    kvr_app *app = t->data;
    for (size_t i = 0; i < kvr_registry_count(app->reg); i++) {
        kvr_worker *w = kvr_registry_at(app->reg, i);
        if (app->cfg.health_interval_ms)
            kvr_probe_worker(app, w, app->cfg.health_path, BODY_CAP, probe_timeout(app), on_health);
        if (app->nmodels == 0)
            kvr_probe_worker(app, w, "/v1/models", BODY_CAP, probe_timeout(app), on_models);
    }
    /* With health checks off, keep asking for models only until one is known. */
    if (!app->cfg.health_interval_ms && app->nmodels > 0)
        uv_timer_stop(t);
}

void kvr_health_start(kvr_app *app)
{
    uint64_t every = app->cfg.health_interval_ms ? app->cfg.health_interval_ms : 1000;
    if (!app->cfg.health_interval_ms && app->nmodels > 0)
        return;
    uv_timer_init(app->loop, &g_timer);
    g_timer.data = app;
    uv_timer_start(&g_timer, round_cb, 0, every);
    g_running = 1;
}

void kvr_health_stop(kvr_app *app)
{
    (void)app;
    if (g_running) {
        g_running = 0;
        uv_timer_stop(&g_timer);
        uv_close((uv_handle_t *)&g_timer, NULL);
    }
}
