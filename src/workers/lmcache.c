/* LMCache status polling (see lmcache.h). */
#include "workers/lmcache.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"
#include "util/time.h"
#include "workers/engine.h"
#include "workers/fetch.h"
#include "workers/periodic.h"

#define BODY_CAP (64 * 1024)

static kvr_periodic g_timer;
static int g_stopped;

typedef struct lmc_poll {
    kvr_workers_ctx *ctx;
    kvr_worker *w;     /* referenced: the answer finds it even after a reload removed it */
    uint32_t gen;      /* w->lmcache_gen when sent */
    uint64_t sent_ms;
} lmc_poll;

int kvr_lmcache_parse(const char *body, size_t len, double *occupancy, int *available)
{
    json_t *j = json_loadb(body, len, 0, NULL);
    json_t *o = json_object_get(j, "occupancy"), *a = json_object_get(j, "cache_available");
    int ok = json_is_object(j) && json_is_number(o) && json_is_boolean(a);
    double v = ok ? json_number_value(o) : -1;
    ok = ok && isfinite(v) && v >= 0 && v <= 1;
    if (ok) {
        *occupancy = v;
        *available = json_is_true(a);
    }
    json_decref(j);
    return ok ? 0 : -1;
}

/* Length of "scheme://host[:port]" in `url`. */
static size_t origin_len(const char *url)
{
    const char *p = strstr(url, "://");
    return p ? (size_t)(p + 3 - url) + strcspn(p + 3, "/?#") : strlen(url);
}

/* The worker's own key goes only to its own origin: an LMCache endpoint elsewhere is another
 * party, and a key sent there would leak. */
static const char *bearer_for(const kvr_worker *w)
{
    const char *base = kvr_worker_base(w);
    size_t n = origin_len(base);
    if (!w->api_key || n != origin_len(w->lmcache_endpoint) ||
        strncmp(base, w->lmcache_endpoint, n) != 0)
        return NULL;
    return w->api_key;
}

static void count(kvr_workers_ctx *ctx, const kvr_worker *w, const char *result)
{
    const char *lv[] = {w->url, result};
    kvr_metric_inc(ctx->lmcache_polls, lv, 1);
}

/* A failed or malformed answer: the worker turns neutral now rather than after the window.
 * `quiet`: another rank of an engine whose rank 0 logs the change. */
static void forget(kvr_workers_ctx *ctx, kvr_worker *w, const char *result, const char *why,
                   int quiet)
{
    if (w->lmcache_occupancy >= 0 && !quiet)
        KVR_WARN("msg=\"lmcache endpoint %s: worker neutral\" worker=%s endpoint=%s reason=%s",
                 result, w->url, w->lmcache_endpoint, why);
    w->lmcache_occupancy = -1;
    w->lmcache_fresh_until_ms = 0;
    kvr_metric_remove_matching(ctx->lmcache_occupancy, "worker", w->url);
}

/* What one answer says, for every rank it speaks for. */
typedef struct lmc_result {
    const char *result; /* kvroute_lmcache_polls_total's result */
    char why[64];       /* why the worker turned neutral ("" when it did not) */
    double occ;
    int avail;
} lmc_result;

/* `quiet`: another rank of the engine whose rank 0 logs the change. */
static void apply(kvr_workers_ctx *ctx, kvr_worker *w, const lmc_result *r, uint64_t sent_ms,
                  int quiet)
{
    if (r->why[0]) {
        forget(ctx, w, r->result, r->why, quiet);
        return;
    }
    uint64_t window = KVR_LMCACHE_FRESH_INTERVALS * ctx->lmcache_interval_ms;
    if (w->lmcache_occupancy < 0 && !quiet)
        KVR_INFO("msg=\"lmcache endpoint answering\" worker=%s occupancy=%.3f "
                 "cache_available=%d", w->url, r->occ, r->avail);
    w->lmcache_occupancy = r->occ;
    w->lmcache_available = r->avail;
    w->lmcache_ok_ms = sent_ms;
    w->lmcache_fresh_until_ms = sent_ms + window;
    const char *lv[] = {w->url};
    kvr_metric_set(ctx->lmcache_occupancy, lv, r->occ);
}

/* The ranks of a data-parallel engine share its LMCache endpoint: one poll, through the
 * engine's rank 0, speaks for all of them. */
static void apply_engine(kvr_workers_ctx *ctx, kvr_worker *w, const lmc_result *r,
                         uint64_t sent_ms)
{
    kvr_worker *ranks[KVR_ENGINE_MAX_RANKS];
    size_t n = kvr_engine_ranks(ctx, w, ranks); /* w itself first */
    for (size_t i = 0; i < n; i++)
        if (i == 0 || (ranks[i]->lmcache_endpoint &&
                       !strcmp(ranks[i]->lmcache_endpoint, w->lmcache_endpoint)))
            apply(ctx, ranks[i], r, sent_ms, i > 0);
}

static void on_answer(void *ud, int status, const char *body, size_t len, int truncated,
                      kvr_upstream_err err)
{
    lmc_poll *p = ud;
    kvr_worker *w = p->w;
    kvr_workers_ctx *ctx = p->ctx;
    if (p->gen == w->lmcache_gen)
        w->lmcache_polling = 0;
    /* An endpoint changed (or removed) meanwhile: this answer is about another one. */
    int current = !g_stopped && !w->removed && p->gen == w->lmcache_gen && w->lmcache_endpoint;
    lmc_result r = {.result = "ok"};
    if (!current) {
        /* dropped */
    } else {
        if (status != 200) {
            r.result = "error";
            if (status)
                snprintf(r.why, sizeof(r.why), "status_%d", status);
            else
                snprintf(r.why, sizeof(r.why), "%s", kvr_upstream_err_name(err));
        } else if (truncated || kvr_lmcache_parse(body, len, &r.occ, &r.avail) < 0) {
            r.result = "malformed";
            snprintf(r.why, sizeof(r.why), "%s",
                     truncated ? "too_large" : "not_the_expected_json");
        } else if (kvr_now_ms() >=
                   p->sent_ms + KVR_LMCACHE_FRESH_INTERVALS * ctx->lmcache_interval_ms) {
            r.result = "stale";
        }
        apply_engine(ctx, w, &r, p->sent_ms);
        count(ctx, w, r.result);
    }
    kvr_worker_unref(w);
    free(p);
}

static void poll_worker(kvr_workers_ctx *ctx, kvr_worker *w)
{
    lmc_poll *p = malloc(sizeof(*p));
    if (!p)
        return;
    *p = (lmc_poll){ctx, w, w->lmcache_gen, kvr_now_ms()};
    kvr_worker_ref(w);
    w->lmcache_polling = 1;
    uint64_t deadline = KVR_LMCACHE_DEADLINE_INTERVALS * ctx->lmcache_interval_ms;
    if (kvr_fetch(ctx->loop, ctx->up, w->lmcache_endpoint, bearer_for(w), BODY_CAP, deadline,
                  on_answer, p) < 0) {
        w->lmcache_polling = 0;
        lmc_result r = {.result = "error", .why = "cannot_start"};
        apply_engine(ctx, w, &r, p->sent_ms);
        count(ctx, w, r.result);
        kvr_worker_unref(w);
        free(p);
    }
}

static void round_cb(uv_timer_t *t)
{
    kvr_workers_ctx *ctx = t->data;
    for (size_t i = 0; i < kvr_registry_count(ctx->reg); i++) {
        kvr_worker *w = kvr_registry_at(ctx->reg, i);
        /* a data-parallel engine's other ranks hear through its rank 0 (apply_engine) */
        int via_rank0 = w->engine != w && w->engine->lmcache_endpoint && w->lmcache_endpoint &&
                        !strcmp(w->engine->lmcache_endpoint, w->lmcache_endpoint);
        if (w->lmcache_endpoint && !w->lmcache_polling && !via_rank0)
            poll_worker(ctx, w);
    }
}

void kvr_lmcache_start(kvr_workers_ctx *ctx)
{
    if (!ctx->lmcache_interval_ms)
        return;
    g_stopped = 0;
    kvr_periodic_start(&g_timer, ctx->loop, round_cb, ctx, 0, ctx->lmcache_interval_ms);
}

void kvr_lmcache_stop(void)
{
    g_stopped = 1;
    kvr_periodic_stop(&g_timer);
}
