/* The prefill stage of a disaggregated request (see pd.h). */
#include "proxy/pd.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "events/kvevents.h"
#include "obs/status_stats.h"
#include "proxy/headers.h"
#include "util/buf.h"
#include "util/log.h"
#include "util/rand.h"
#include "util/time.h"
#include "workers/health.h"
#include "workers/registry.h"

#define MAX_HDRS 132
#define MAX_TRIED (16 + 256) /* tried workers, then the route's other roles and full workers */
#define URL_CAP 2048

struct kvr_pd_call {
    kvr_pd_request rq;
    kvr_pd_done_fn done;
    void *ud;
    kvr_pd_mode mode;
    kvr_upstream_attempt *att;
    kvr_worker *w;
    kvr_pick pick;
    const kvr_route_target *target;
    size_t tried[16];
    size_t ntried;       /* workers not to pick: the caller's exclusions, then those tried */
    size_t made;         /* attempts this call started */
    int trial;           /* the attempt is its worker's half-open breaker trial */
    int status;
    int truncated;       /* SGLang: the answer outgrew the bound; drained unread */
    uint64_t start_ns;
    kvr_buf answer;      /* the prefill's body, bounded */
    kvr_buf body;        /* what the attempt sends */
    kvr_pd_bootstrap bs;
    kvr_http_header hdrs[MAX_HDRS];
    size_t nhdrs;
    char auth[1100];
    char rank[KVR_RANK_HEADER_BUF];
    char url[URL_CAP];
    uv_timer_t *timer;   /* --pd-prefill-timeout-ms of the attempt in flight (own allocation:
                            its close outlives the call) */
    int detached;        /* its request ended: no callback, no retry (kvr_pd_call_detach) */
    kvr_route_keys own_keys; /* detached before its headers: copies of what the teach reads */
    char *own_model;     /* detached: the `model` label's copy */
    struct kvr_pd_call *prev, *next; /* detached: the list kvr_pd_detached_cancel_all ends */
};

static kvr_pd_call *g_detached;

static const kvr_upstream_cbs pd_cbs;

kvr_worker *kvr_pd_call_worker(const kvr_pd_call *c)
{
    return c->w;
}

const kvr_pick *kvr_pd_call_pick(const kvr_pd_call *c)
{
    return &c->pick;
}

const kvr_pd_bootstrap *kvr_pd_call_bootstrap(const kvr_pd_call *c)
{
    return &c->bs;
}

static void timer_closed(uv_handle_t *h)
{
    free(h);
}

static void call_free(kvr_pd_call *c)
{
    if (c->detached) {
        if (c->prev)
            c->prev->next = c->next;
        else
            g_detached = c->next;
        if (c->next)
            c->next->prev = c->prev;
    }
    if (c->timer)
        uv_close((uv_handle_t *)c->timer, timer_closed);
    free((char *)c->own_keys.text);
    free((char *)c->own_keys.session);
    free((uint32_t *)c->own_keys.tokens);
    free(c->own_model);
    kvr_buf_free(&c->answer);
    kvr_buf_free(&c->body);
    kvr_route_unref(c->rq.route);
    free(c);
}

/* Ends the attempt in flight: its slot, its kvroute_worker_requests_total{code}. */
static void attempt_end(kvr_pd_call *c, int code)
{
    c->rq.hooks->attempt_count(c->rq.app, c->w, code);
    c->att = NULL;
}

/* The body for prefill worker c->w: the mode's edits plus its target's model name. */
static int build_body(kvr_pd_call *c)
{
    kvr_body_edit e[KVR_PD_MAX_EDITS + 1];
    size_t n = c->mode == KVR_PD_SGLANG ? kvr_pd_sglang_edits(&c->bs, e)
                                        : kvr_pd_vllm_prefill_edits(e);
    char *enc;
    int m = kvr_body_edit_model(c->target->model, c->rq.client_model, &enc, &e[n]);
    if (m < 0)
        return -1;
    int rc = kvr_body_edit_apply(c->rq.body, c->rq.len, e, n + (size_t)m, &c->body);
    free(enc);
    return rc;
}

static void failed(kvr_pd_call *c, const char *reason, int client_error);

/* The attempt in flight took longer than --pd-prefill-timeout-ms: a failure of its worker
 * (a stopped or wedged engine), tried elsewhere like any other. */
static void on_timeout(uv_timer_t *t)
{
    kvr_pd_call *c = t->data;
    if (!c->att)
        return;
    kvr_app *app = c->rq.app;
    kvr_upstream_cancel(c->att);
    const char *lv[] = {c->w->url, "prefill_timeout"};
    kvr_metric_inc(app->m.upstream_errors, lv, 1);
    kvr_app_attempt_verdict(app, c->w, 1, c->trial);
    attempt_end(c, 0);
    failed(c, "prefill_timeout", 0);
}

static void arm_timer(kvr_pd_call *c)
{
    uint64_t ms = c->rq.app->cfg.pd_prefill_timeout_ms;
    if (!ms)
        return;
    if (!c->timer) {
        c->timer = malloc(sizeof(*c->timer));
        if (!c->timer)
            return; /* the upstream deadlines still apply */
        uv_timer_init(kvr_upstream_loop(c->rq.app->up), c->timer);
        c->timer->data = c;
    }
    uv_timer_start(c->timer, on_timeout, ms, 0);
}

/* Picks an untried eligible prefill worker with room and starts an attempt there (workers
 * whose body, URL or bootstrap cannot be made, or whose attempt cannot start, count as tried).
 * Returns 1 when one started, 0 when none is left within the attempt cap. */
static int attempt_next(kvr_pd_call *c)
{
    kvr_app *app = c->rq.app;
    kvr_route *r = c->rq.route;
    size_t ex[MAX_TRIED];
    for (;;) {
        size_t nex = c->ntried;
        memcpy(ex, c->tried, nex * sizeof(*ex));
        nex = kvr_route_role_exclude(r, 1, ex, nex, MAX_TRIED);
        for (size_t i = 0; i < r->ntargets && nex < MAX_TRIED; i++) {
            const kvr_worker *w = r->targets[i].worker;
            if (w->max_inflight && (uint64_t)kvr_worker_load(w) >= w->max_inflight)
                ex[nex++] = w->id;
        }
        if (c->ntried >= sizeof(c->tried) / sizeof(c->tried[0]) ||
            c->ntried > app->cfg.max_retries ||
            kvr_route_pick(r, ex, nex, c->rq.keys, NULL, 0, &c->pick, &c->target) < 0)
            return 0;
        c->w = c->pick.worker;
        c->tried[c->ntried++] = c->w->id;
        if (c->mode == KVR_PD_SGLANG &&
            kvr_pd_bootstrap_init(&c->bs, kvr_worker_base(c->w), c->w->bootstrap_port,
                                  kvr_rand_u64()) < 0)
            continue;
        c->nhdrs = 0;
        for (size_t i = 0; i < c->rq.nhdrs && c->nhdrs < MAX_HDRS - 2; i++) /* 2: key, rank */
            c->hdrs[c->nhdrs++] = c->rq.hdrs[i];
        c->nhdrs += kvr_worker_authorization(c->w, c->auth, sizeof(c->auth), &c->hdrs[c->nhdrs]);
        c->nhdrs += kvr_worker_rank_header(c->w, c->rank, &c->hdrs[c->nhdrs]);
        if (build_body(c) < 0 ||
            kvr_worker_url(c->w, kvr_endpoint_path(c->rq.ep), c->url, sizeof(c->url)) < 0)
            continue;
        c->rq.hooks->slot_take(c->w);
        c->trial = kvr_app_attempt_start(app, c->w);
        c->status = 0;
        c->truncated = 0;
        kvr_buf_reset(&c->answer);
        c->start_ns = kvr_now_ns();
        c->att = kvr_upstream_start(app->up, "POST", c->url, c->hdrs, c->nhdrs, c->body.data,
                                    c->body.len, &pd_cbs, c);
        if (!c->att) {
            kvr_app_attempt_abandon(app, c->w, c->trial);
            c->rq.hooks->slot_give(app, c->w);
            continue;
        }
        kvr_route_sent(r, c->w, c->rq.keys);
        kvr_kv_events_served(app->kv, c->w);
        arm_timer(c);
        c->made++;
        return 1;
    }
}

static void on_headers(void *ud, int status, const kvr_http_header *h, size_t n)
{
    (void)h;
    (void)n;
    kvr_pd_call *c = ud;
    c->status = status;
    /* The prefill worker computed the prompt's KV: the prefill side learns it now. */
    if (status / 100 == 2) {
        kvr_route_teach(c->rq.route, c->w, c->rq.keys);
        kvr_app_cluster_taught(c->rq.app, c->rq.route, c->w, c->rq.keys);
    }
}

static void finish(kvr_pd_call *c, int ok, char *kvtp, const char *reason, int client_error)
{
    kvr_pd_result res = {.ok = ok, .kvtp = kvtp, .worker = c->w, .pick = c->pick,
                         .reason = reason, .client_error = client_error,
                         .attempts = c->made};
    kvr_pd_done_fn done = c->done;
    void *ud = c->ud;
    int detached = c->detached;
    call_free(c);
    if (detached)
        free(kvtp);
    else
        done(ud, &res);
}

/* The attempt failed for `reason`: another prefill worker, or the end of the stage. */
static void failed(kvr_pd_call *c, const char *reason, int client_error)
{
    kvr_app *app = c->rq.app;
    KVR_WARN("msg=\"prefill failed\" worker=%s reason=%s attempt=%zu", c->w->url, reason,
             c->ntried);
    if (!client_error && c->mode == KVR_PD_VLLM && !c->detached &&
        kvr_route_retry_allowed(c->rq.route, app->cfg.retry_budget, kvr_now_ms())) {
        kvr_worker *w = c->w;
        kvr_pick pick = c->pick;
        const kvr_route_target *t = c->target;
        if (attempt_next(c)) {
            const char *lv[] = {c->rq.model, reason};
            kvr_metric_inc(app->m.retries, lv, 1);
            return;
        }
        c->w = w; /* the failure reported is the last attempt's */
        c->pick = pick;
        c->target = t;
    }
    finish(c, 0, NULL, reason, client_error);
}

static int on_body(void *ud, const char *data, size_t len)
{
    kvr_pd_call *c = ud;
    if (c->mode == KVR_PD_SGLANG && (c->truncated || c->answer.len + len >
                                                         c->rq.app->cfg.pd_max_prefill_bytes)) {
        c->truncated = 1; /* its answer is drained, read for usage only when it fits */
        return 0;
    }
    if (c->answer.len + len > c->rq.app->cfg.pd_max_prefill_bytes) {
        /* Cancelled from inside its own callback (allowed): it ends here, as a failure. */
        kvr_upstream_cancel(c->att);
        kvr_app_attempt_verdict(c->rq.app, c->w, 1, c->trial);
        attempt_end(c, c->status);
        failed(c, "too_large", 0);
        return 0;
    }
    if (kvr_buf_append(&c->answer, data, len) < 0) {
        kvr_upstream_cancel(c->att);
        kvr_app_attempt_abandon(c->rq.app, c->w, c->trial);
        attempt_end(c, c->status);
        failed(c, "out_of_memory", 0);
    }
    return 0;
}

/* The prefill's usage: its prompt was computed (or found cached) on the prefill worker. */
static void count_usage(kvr_pd_call *c, const kvr_pd_answer *a)
{
    if (a->prompt < 0)
        return;
    kvr_app *app = c->rq.app;
    const char *lv[] = {c->rq.model, c->w->url};
    kvr_metric_inc(app->m.prompt_tokens, lv, (double)a->prompt);
    kvr_metric_inc(app->m.cached_tokens, lv, (double)a->cached);
    kvr_status_stats_tokens(app->status, kvr_now_ms(), a->prompt, a->cached);
}

static void on_done(void *ud, kvr_upstream_err err, const char *msg, int got_headers)
{
    (void)msg;
    kvr_pd_call *c = ud;
    kvr_app *app = c->rq.app;
    if (c->timer)
        uv_timer_stop(c->timer);
    int code = got_headers ? c->status : 0;
    if (err != KVR_UP_OK) {
        const char *lv[] = {c->w->url, kvr_upstream_err_name(err)};
        kvr_metric_inc(app->m.upstream_errors, lv, 1);
        if (err == KVR_UP_CONNECT)
            kvr_health_mark_down(&app->wctx, c->w, kvr_now_ms());
    }
    int worker_failed = err != KVR_UP_OK || c->status >= 500;
    kvr_pd_answer a = {.prompt = -1};
    const char *reason = NULL;
    char why[24];
    if (err != KVR_UP_OK) {
        reason = kvr_upstream_err_name(err);
    } else if (c->status / 100 != 2) {
        snprintf(why, sizeof(why), "http_%d", c->status);
        reason = why;
    } else if ((c->truncated || kvr_pd_read_answer(c->answer.data, c->answer.len, &a) < 0) &&
               c->mode == KVR_PD_VLLM) {
        reason = "bad_answer"; /* SGLang's may be a stream: only its status matters */
        worker_failed = 1;
    } else if (c->mode == KVR_PD_VLLM && !a.kvtp) {
        reason = "no_kv_transfer_params";
        worker_failed = 1;
    }
    kvr_app_attempt_verdict(app, c->w, worker_failed, c->trial);
    attempt_end(c, code);
    if (c->status / 100 == 2 && a.prompt >= 0)
        count_usage(c, &a);
    if (reason) {
        kvr_pd_answer_free(&a);
        failed(c, reason, c->status >= 400 && c->status < 500);
        return;
    }
    const char *lm[] = {c->rq.model};
    kvr_metric_observe(app->m.pd_prefill_seconds, lm,
                       (double)(kvr_now_ns() - c->start_ns) / 1e9);
    char *kvtp = a.kvtp;
    a.kvtp = NULL;
    finish(c, 1, kvtp, NULL, 0);
}

static const kvr_upstream_cbs pd_cbs = {on_headers, on_body, on_done};

kvr_pd_call *kvr_pd_call_start(const kvr_pd_request *rq, kvr_pd_done_fn done, void *ud,
                               kvr_pd_result *now)
{
    *now = (kvr_pd_result){.reason = "no_prefill_worker"};
    kvr_pd_call *c = calloc(1, sizeof(*c));
    if (!c) {
        now->reason = "out_of_memory";
        return NULL;
    }
    c->rq = *rq;
    for (size_t i = 0; i < rq->nexclude && c->ntried < sizeof(c->tried) / sizeof(c->tried[0]); i++)
        c->tried[c->ntried++] = rq->exclude[i];
    c->done = done;
    c->ud = ud;
    c->mode = rq->route->pd->mode;
    kvr_route_ref(rq->route);
    kvr_buf_init(&c->answer, 0);
    kvr_buf_init(&c->body, 0);
    if (!attempt_next(c)) {
        now->attempts = c->made;
        call_free(c);
        return NULL;
    }
    return c;
}

void kvr_pd_call_cancel(kvr_pd_call *c)
{
    if (!c)
        return;
    if (c->att) {
        kvr_upstream_cancel(c->att);
        kvr_app_attempt_abandon(c->rq.app, c->w, c->trial);
        attempt_end(c, c->status);
    }
    call_free(c);
}

/* A copy of `len` bytes of `src` (NULL when src is), or -1 when out of memory. */
static int dup_bytes(const void *src, size_t len, const void **out)
{
    *out = NULL;
    if (!src)
        return 0;
    void *d = malloc(len ? len : 1);
    if (!d)
        return -1;
    memcpy(d, src, len);
    *out = d;
    return 0;
}

void kvr_pd_call_detach(kvr_pd_call *c)
{
    if (!c)
        return;
    if (!c->att) {
        kvr_pd_call_cancel(c);
        return;
    }
    c->own_model = strdup(c->rq.model);
    if (!c->own_model) {
        kvr_pd_call_cancel(c);
        return;
    }
    c->rq.model = c->own_model;
    if (!c->status) { /* its teach is still to come: the request's keys go with it */
        const kvr_route_keys *k = c->rq.keys;
        kvr_route_keys *o = &c->own_keys;
        o->text_len = k->text_len;
        o->session_len = k->session_len;
        o->ntokens = k->ntokens;
        if (dup_bytes(k->text, k->text_len, (const void **)&o->text) < 0 ||
            dup_bytes(k->session, k->session_len, (const void **)&o->session) < 0 ||
            dup_bytes(k->tokens, k->ntokens * sizeof(*k->tokens),
                      (const void **)&o->tokens) < 0) {
            kvr_pd_call_cancel(c);
            return;
        }
    }
    c->rq.keys = &c->own_keys; /* (after the headers, nothing reads them again) */
    c->rq.body = NULL;
    c->rq.client_model = NULL;
    c->rq.hdrs = NULL;
    c->rq.nhdrs = 0;
    c->detached = 1;
    c->next = g_detached;
    if (g_detached)
        g_detached->prev = c;
    g_detached = c;
}

void kvr_pd_detached_cancel_all(void)
{
    while (g_detached)
        kvr_pd_call_cancel(g_detached);
}
