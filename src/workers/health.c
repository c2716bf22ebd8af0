/* Active health checks. */
#include "workers/health.h"

#include "util/log.h"
#include "workers/periodic.h"
#include "workers/probe.h"

#define BODY_CAP (64 * 1024)

static kvr_periodic g_timer;

static void on_health(kvr_workers_ctx *ctx, kvr_worker *w, int status, const char *body,
                      size_t len, kvr_upstream_err err)
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
            kvr_health_mark_down(ctx, w);
        }
    }
}

void kvr_health_mark_down(kvr_workers_ctx *ctx, kvr_worker *w)
{
    if (!w->healthy)
        return;
    w->healthy = 0;
    /* A worker that failed may come back restarted with an empty cache: what was learned about
     * it is no longer true. */
    if (ctx->on_down)
        ctx->on_down(ctx->ud, w);
}

static void round_cb(uv_timer_t *t)
{
    kvr_workers_ctx *ctx = t->data;
    /* A probe must end before the next round starts, or slow workers pile probes up. */
    uint64_t timeout = ctx->health_interval_ms < 5000 ? ctx->health_interval_ms : 5000;
    for (size_t i = 0; i < kvr_registry_count(ctx->reg); i++)
        kvr_probe_worker(ctx, kvr_registry_at(ctx->reg, i), ctx->health_path, BODY_CAP, timeout,
                         on_health);
}

void kvr_health_start(kvr_workers_ctx *ctx)
{
    if (!ctx->health_interval_ms)
        return;
    kvr_periodic_start(&g_timer, ctx->loop, round_cb, ctx, 0, ctx->health_interval_ms);
}

void kvr_health_stop(void)
{
    kvr_periodic_stop(&g_timer);
}
