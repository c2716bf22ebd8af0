/* Worker metrics scraping. */
#include "workers/scrape.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"
#include "workers/engine.h"
#include "workers/periodic.h"
#include "workers/probe.h"

#define BODY_CAP (4 * 1024 * 1024)

static kvr_periodic g_timer;

static void add(double *slot, double v)
{
    *slot = *slot < 0 ? v : *slot + v;
}

static const char *label(const kvr_prom_sample *s, const char *name)
{
    for (size_t i = 0; i < s->nlabels; i++)
        if (strcmp(s->label_names[i], name) == 0)
            return s->label_values[i];
    return NULL;
}

typedef struct parse_ctx {
    kvr_scrape_result *r;
    const char *engine; /* keep only this engine's labelled samples (NULL = all) */
    int labelled;       /* a sample carried an `engine` label */
} parse_ctx;

static void on_sample(void *ud, const kvr_prom_sample *s)
{
    parse_ctx *pc = ud;
    kvr_scrape_result *r = pc->r;
    const char *eng = label(s, "engine");
    if (eng) {
        pc->labelled = 1;
        if (pc->engine && strcmp(eng, pc->engine) != 0)
            return;
    }
    if (strcmp(s->name, "vllm:num_requests_running") == 0) {
        add(&r->running, s->value);
    } else if (strcmp(s->name, "vllm:num_requests_waiting") == 0) {
        add(&r->waiting, s->value);
    } else if (strcmp(s->name, "vllm:kv_cache_usage_perc") == 0 ||
               strcmp(s->name, "vllm:gpu_cache_usage_perc") == 0) {
        if (s->value > r->kv_usage)
            r->kv_usage = s->value;
    } else if (strcmp(s->name, "process_start_time_seconds") == 0) {
        r->start_time = s->value;
    } else if (strcmp(s->name, "vllm:cache_config_info") == 0) {
        const char *nb = label(s, "num_gpu_blocks"), *bs = label(s, "block_size");
        if (nb && bs && atof(nb) > 0 && atof(bs) > 0) {
            r->kv_tokens = atof(nb) * atof(bs);
            r->block_size = atof(bs);
        }
    }
}

static int parse(const char *text, size_t len, const char *engine, kvr_scrape_result *out)
{
    out->running = out->waiting = out->kv_usage = out->kv_tokens = out->start_time = -1;
    out->block_size = 0;
    parse_ctx pc = {out, engine, 0};
    kvr_prom_parse(text, len, on_sample, &pc);
    return pc.labelled;
}

void kvr_scrape_parse(const char *text, size_t len, kvr_scrape_result *out)
{
    parse(text, len, NULL, out);
}

void kvr_scrape_parse_rank(const char *text, size_t len, int rank, int ranks,
                           kvr_scrape_result *out)
{
    char eng[16];
    snprintf(eng, sizeof(eng), "%d", rank);
    if (parse(text, len, eng, out) || ranks <= 1)
        return;
    if (out->running > 0)
        out->running /= ranks;
    if (out->waiting > 0)
        out->waiting /= ranks;
}

/* One rank's (or a plain worker's) figures. The process's start time is the engine's: only
 * its own worker acts on a restart, for every rank. */
static void apply(kvr_workers_ctx *ctx, kvr_worker *w, const kvr_scrape_result *rr)
{
    kvr_scrape_result r = *rr;
    w->running = r.running;
    w->queue = r.waiting;
    w->kv_usage = r.kv_usage;
    const char *lv[] = {w->url};
    if (r.waiting >= 0)
        kvr_metric_set(ctx->queue, lv, r.waiting);
    if (r.kv_usage >= 0)
        kvr_metric_set(ctx->kv_usage, lv, r.kv_usage);
    if (r.start_time > 0 && w->engine == w) {
        if (w->start_time > 0 && r.start_time != w->start_time) {
            KVR_INFO("msg=\"worker restarted: forgetting what was learned\" worker=%s", w->url);
            kvr_engine_forget(ctx, w); /* every rank restarted with it */
        }
        w->start_time = r.start_time;
    }
    if (r.block_size > 0 && r.block_size < 1e6)
        w->kv_block_size = (uint32_t)r.block_size;
    int64_t tokens = r.kv_tokens >= 0 ? (int64_t)r.kv_tokens : -1;
    if (tokens != w->kv_tokens) {
        w->kv_tokens = tokens;
        /* cache_aware reads kv_tokens when it next teaches this worker (its index cap). */
        KVR_INFO("msg=\"worker KV capacity\" worker=%s tokens=%lld", w->url, (long long)tokens);
    }
}

static void on_metrics(kvr_workers_ctx *ctx, kvr_worker *w, int status, const char *body, size_t len,
                       kvr_upstream_err err)
{
    (void)err;
    if (!w || status != 200)
        return;
    kvr_scrape_result r;
    if (w->dp_size <= 1) {
        kvr_scrape_parse(body, len, &r);
        apply(ctx, w, &r);
        return;
    }
    kvr_worker *ranks[KVR_ENGINE_MAX_RANKS];
    size_t n = kvr_engine_ranks(ctx, w, ranks);
    for (size_t i = 0; i < n; i++) {
        kvr_scrape_parse_rank(body, len, ranks[i]->dp_rank, w->dp_size, &r);
        apply(ctx, ranks[i], &r);
    }
}

static void round_cb(uv_timer_t *t)
{
    kvr_workers_ctx *ctx = t->data;
    /* A scrape must end before the next one starts. */
    uint64_t timeout = ctx->scrape_interval_s * 1000;
    for (size_t i = 0; i < kvr_registry_count(ctx->reg); i++) {
        kvr_worker *w = kvr_registry_at(ctx->reg, i);
        if (w->engine == w) /* one read per data-parallel engine */
            kvr_probe_worker(ctx, w, "/metrics", BODY_CAP, timeout, on_metrics);
    }
}

void kvr_scrape_start(kvr_workers_ctx *ctx)
{
    if (!ctx->scrape_interval_s)
        return;
    kvr_periodic_start(&g_timer, ctx->loop, round_cb, ctx, 0, ctx->scrape_interval_s * 1000);
}

void kvr_scrape_stop(void)
{
    kvr_periodic_stop(&g_timer);
}
