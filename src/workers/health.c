/* Active health checks. */
#include "workers/health.h"

#include "util/log.h"
#include "util/time.h"
#include "workers/engine.h"
#include "workers/periodic.h"
#include "workers/probe.h"

#define BODY_CAP (64 * 1024)

static kvr_periodic g_timer;

/* Down longer than forget_after_ms: its engine may have restarted or evicted everything. */
static void maybe_forget(kvr_workers_ctx *ctx, kvr_worker *w, uint64_t now_ms)
{
    if (w->healthy || w->forgotten || !w->down_since_ms ||
        now_ms - w->down_since_ms < ctx->forget_after_ms)
        return;
    w->forgotten = 1;
    KVR_INFO("msg=\"worker down too long: forgetting what was learned\" worker=%s down_ms=%llu",
             w->url, (unsigned long long)(now_ms - w->down_since_ms));
    kvr_engine_forget(ctx, w);
}

void kvr_health_apply(kvr_workers_ctx *ctx, kvr_worker *w, int ok, uint64_t now_ms)
{
    w = w->engine;
    uint32_t up = ctx->healthy_threshold ? ctx->healthy_threshold : 1;
    uint32_t down = ctx->unhealthy_threshold ? ctx->unhealthy_threshold : 1;
    if (ok) {
        w->check_fails = 0;
        if (++w->check_passes >= up && !w->healthy) {
            KVR_INFO("msg=\"worker healthy\" worker=%s down_ms=%llu", w->url,
                     (unsigned long long)(now_ms - w->down_since_ms));
            w->healthy = 1;
            w->down_since_ms = 0;
            w->forgotten = 0;
        }
        return;
    }
    w->check_passes = 0;
    if (++w->check_fails >= down && w->healthy) {
        KVR_WARN("msg=\"worker unhealthy\" worker=%s failed_checks=%u", w->url, w->check_fails);
        w->healthy = 0;
        w->down_since_ms = now_ms;
        if (ctx->on_down)
            ctx->on_down(ctx->ud, w);
    }
    maybe_forget(ctx, w, now_ms);
}

void kvr_health_mark_down(kvr_workers_ctx *ctx, kvr_worker *w, uint64_t now_ms)
{
    w = w->engine;
    if (!ctx->health_interval_ms || !w->healthy)
        return;
    KVR_WARN("msg=\"worker unreachable: unhealthy until its checks pass\" worker=%s", w->url);
    w->healthy = 0;
    w->check_passes = 0;
    w->down_since_ms = now_ms;
}

static void on_health(kvr_workers_ctx *ctx, kvr_worker *w, int status, const char *body,
                      size_t len, kvr_upstream_err err)
{
    (void)body, (void)len;
    if (!w)
        return;
    int ok = status >= 200 && status < 300;
    if (!ok)
        KVR_DEBUG("msg=\"health check failed\" worker=%s status=%d kind=%s", w->url, status,
                  kvr_upstream_err_name(err));
    kvr_health_apply(ctx, w, ok, kvr_now_ms());
}

static void round_cb(uv_timer_t *t)
{
    kvr_workers_ctx *ctx = t->data;
    /* A probe must end before the next round starts, or slow workers pile probes up. */
    uint64_t timeout = ctx->health_interval_ms < 5000 ? ctx->health_interval_ms : 5000;
    uint64_t now = kvr_now_ms();
    for (size_t i = 0; i < kvr_registry_count(ctx->reg); i++) {
        kvr_worker *w = kvr_registry_at(ctx->reg, i);
        if (w->engine != w)
            continue; /* one check per data-parallel engine, by rank 0 */
        maybe_forget(ctx, w, now);
        kvr_probe_worker(ctx, w, ctx->health_path, BODY_CAP, timeout, on_health);
    }
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
