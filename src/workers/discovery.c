/* Model discovery from the workers' /v1/models. */
#include "workers/discovery.h"

#include <jansson.h>
#include <string.h>

#include "util/log.h"
#include "workers/engine.h"
#include "workers/periodic.h"
#include "workers/probe.h"

#define BODY_CAP (4 * 1024 * 1024)
#define MAX_MODELS 256
#define TICK_MS 1000

static kvr_periodic g_timer;
static uint64_t g_ticks;

int kvr_discovery_parse(const char *body, size_t len, const char **ids, size_t cap,
                        void **owner)
{
    json_t *j = json_loadb(body, len, 0, NULL);
    json_t *data = json_object_get(j, "data"), *m;
    *owner = NULL;
    if (!json_is_array(data)) {
        json_decref(j);
        return -1;
    }
    size_t i, n = 0;
    json_array_foreach(data, i, m)
    {
        const char *id = json_string_value(json_object_get(m, "id"));
        if (!id || !*id)
            continue;
        if (n == cap) {
            KVR_WARN("msg=\"worker lists more models than kvroute routes; the rest ignored\" "
                     "max=%zu listed=%zu",
                     cap, json_array_size(data));
            break;
        }
        int dup = 0;
        for (size_t k = 0; k < n && !dup; k++)
            dup = strcmp(ids[k], id) == 0;
        if (!dup)
            ids[n++] = id;
    }
    *owner = j;
    return (int)n;
}

static void on_models(kvr_workers_ctx *ctx, kvr_worker *w, int status, const char *body,
                      size_t len, kvr_upstream_err err)
{
    (void)err;
    if (status != 200 || !w)
        return;
    const char *ids[MAX_MODELS];
    void *owner;
    int n = kvr_discovery_parse(body, len, ids, MAX_MODELS, &owner);
    if (n < 0) {
        KVR_WARN("msg=\"worker /v1/models is not a model list\" worker=%s bytes=%zu%s", w->url,
                 len, len >= BODY_CAP ? " (cut at the 4 MiB cap)" : "");
        return;
    }
    kvr_worker *ranks[KVR_ENGINE_MAX_RANKS];
    size_t nr = kvr_engine_ranks(ctx, w, ranks);
    int changed = 0;
    for (size_t i = 0; i < nr; i++) /* an engine's ranks serve what it lists */
        changed |= kvr_worker_set_models(ranks[i], ids, (size_t)n);
    if (changed) {
        /* Model ids come from the worker: printable ASCII only, so a log line stays one. */
        char first[65] = "-";
        for (size_t i = 0; n && ids[0][i] && i < sizeof(first) - 1; i++) {
            unsigned char ch = (unsigned char)ids[0][i];
            first[i] = ch > 0x20 && ch < 0x7f && ch != '"' && ch != '\\' ? (char)ch : '?';
            first[i + 1] = '\0';
        }
        KVR_INFO("msg=\"worker models\" worker=%s models=%d first=%s", w->url, n, first);
        if (ctx->on_models)
            ctx->on_models(ctx->ud, w);
    }
    json_decref(owner);
}

static void tick(uv_timer_t *t)
{
    kvr_workers_ctx *ctx = t->data;
    uint64_t every = ctx->discovery_interval_s ? ctx->discovery_interval_s : 30;
    int full = g_ticks++ % every == 0;
    for (size_t i = 0; i < kvr_registry_count(ctx->reg); i++) {
        kvr_worker *w = kvr_registry_at(ctx->reg, i);
        if (w->engine != w)
            continue; /* one read per data-parallel engine */
        /* Workers that never answered are asked every tick, so a fleet starting up is
         * routable within a second of its workers serving. */
        if (full || !w->models)
            kvr_probe_worker(ctx, w, "/v1/models", BODY_CAP, TICK_MS, on_models);
    }
}

void kvr_discovery_start(kvr_workers_ctx *ctx)
{
    if (!ctx->discover || g_timer.running)
        return;
    g_ticks = 0;
    kvr_periodic_start(&g_timer, ctx->loop, tick, ctx, 0, TICK_MS);
}

void kvr_discovery_probe(kvr_workers_ctx *ctx, kvr_worker *w)
{
    if (ctx->discover)
        kvr_probe_worker(ctx, w->engine, "/v1/models", BODY_CAP, TICK_MS, on_models);
}

void kvr_discovery_stop(void)
{
    kvr_periodic_stop(&g_timer);
}
