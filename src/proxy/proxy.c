/* A proxied request's life. One `preq` per client request; it owns at most one upstream
 * attempt, and one in-flight unit on the attempt's worker from kvr_upstream_start() until the
 * attempt ends or is cancelled (DESIGN §4 step 6: the only place that changes the counter). */
#include "proxy/proxy.h"

#include <jansson.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "app/reply.h"
#include "obs/status_stats.h"
#include "proxy/admission.h"
#include "proxy/headers.h"
#include "proxy/body_edit.h"
#include "proxy/pd.h"
#include "cluster/cluster.h"
#include "proxy/ratelimit.h"
#include "proxy/spans.h"
#include "proxy/keys.h"
#include "proxy/tokenize.h"
#include "proxy/usage.h"
#include "events/kvevents.h"
#include "util/json_read.h"
#include "util/fmt.h"
#include "util/log.h"
#include "workers/health.h"
#include "util/oai_error.h"
#include "util/rand.h"
#include "util/time.h"

#define MAX_FWD_HEADERS 128
#define URL_CAP 2048
#define MAX_ATTEMPTS 16           /* 1 + the largest --max-retries */
#define SSE_HOLD_CAP (1u << 20)   /* an SSE event longer than this is relayed unheld */

typedef struct preq {
    struct preq *prev, *next; /* the live list, for kvr_proxy_shutdown() */
    kvr_app *app;
    kvr_http_req *req;
    kvr_upstream_attempt *att;
    kvr_worker *w;
    kvr_route *route;     /* referenced for the request's life: a reload cuts nothing */
    const kvr_route_target *target;
    kvr_pick pick;
    kvr_endpoint ep;
    kvr_worker *fixed;    /* the only worker that may answer (a stored response's), or NULL;
                             referenced by the route */
    kvr_request_keys keys; /* freed once taught (2xx headers), or at the end when the reply or
                              the reported usage may still teach them */
    char *model;          /* the route's public name: the `model` label */
    char *client_model;   /* `model` as the client sent it; NULL when it sent none */
    char *pin;            /* previous_response_id (Responses API), NULL when none */
    size_t pin_len;
    kvr_buf body_rw;      /* the body with `model` rewritten for the current target */
    char request_id[72];
    char match[8];
    int status;           /* worker's status, 0 until headers */
    int sse;              /* worker answered text/event-stream */
    int paused;           /* on_body refused bytes: waiting for on_drain */
    int got_body;         /* first body byte seen (TTFT taken) */
    int counted;          /* the decision label was counted (once per request) */
    int trial;            /* the current attempt is its worker's half-open breaker trial */
    int verdict;          /* the current attempt's breaker verdict was given */
    int body_pending;     /* the response is relayed: free the body once it is all sent */
    int teach_reply;      /* keys kept until the reply is complete (completion teaching) */
    int refresh_owed;     /* the first byte taught only new blocks: the prompt's held run is
                             refreshed by the reply's teach, or by refresh_prompt() */
    int correct;          /* the approximate index over-/under-predicted: correct it */
    int prefilling;       /* counted in w->prefilling (taught, first body byte not seen) */
    int unsettled;        /* w had prefilling attempts when this one was sent */
    int pinned;           /* the Responses API id of the answer is pinned to its worker */
    char attempts[KVR_FMT_U64_MAX]; /* x-kvroute-attempts */
    size_t tried[MAX_ATTEMPTS]; /* worker ids already attempted */
    const kvr_worker *tried_engine[MAX_ATTEMPTS]; /* and their engines (kvr_worker.engine) */
    size_t ntried;
    kvr_buf held;         /* SSE: bytes of an event not yet complete, relayed when it is */
    kvr_usage usage;
    size_t nfwd, nfixed;  /* fwd: headers of every attempt, then the worker's Authorization
                             and the attempt's traceparent */
    kvr_waiter waiter;    /* in the admission queue while no slot is free */
    const char *key;      /* the client key's name ("-" without auth) */
    uint64_t rl_tokens;   /* tokens counted against the key's limit before the answer */
    kvr_ratelimit_info rl;
    struct kvr_cluster_rate_op *rate_op; /* the cross-replica rate check in flight */
    struct kvr_cluster_wait *warm_wait;  /* waiting for the replica's warm start */
    int warm_waited;                     /* ... done (once per request) */
    char rl_val[6][24];   /* x-ratelimit-* values */
    double pf_tokens;     /* cost: the current attempt's predicted prefill tokens ... */
    double pf_ahead;      /* ... and what was outstanding at its worker before it */
    uint64_t pf_start_ns; /* ... when it was sent */
    int pf_open;          /* its prefill is accounted, first byte not seen yet */
    kvr_tokenize_op *tok; /* fetching the prompt's token ids (precise) */
    int tok_sync;         /* inside kvr_tokenize(): its callback must not route yet */
    uint64_t tok_start_ns;
    uint64_t start_ns;    /* the request's arrival (kvr_now_ns) */
    uint64_t first_byte_ns; /* the relayed answer's first body byte, 0 before */
    uint64_t headers_ns;  /* when the worker's response headers were relayed, 0 before */
    char client[64];      /* the client's address (the request is gone when preq_free runs) */
    int final_status;     /* what the client was answered: the server span's status */
    kvr_req_trace tr;     /* the request's trace (tr.on when --otlp-endpoint is set) */
    char span_name[80];   /* "METHOD /endpoint" */
    char method[12];
    int span_open;        /* the current attempt's client span is not recorded yet; its: */
    int span_code;        /* ... worker status (0 = none) */
    const char *span_err; /* ... failure, or NULL */
    const char *span_decision;
    double span_match;
    uint64_t att_start_ns, att_end_ns;
    /* Prefill/decode disaggregation (route->pd): the stage this request is in. */
    int pd;               /* 0, PD_DECODE (prefilled by pf_w) or PD_LOCAL (a decode worker
                             prefills itself) */
    kvr_pd_call *pd_call; /* the prefill call in flight */
    kvr_worker *pf_w;     /* the prefill worker (taught; x-kvroute-prefill-worker) */
    kvr_pick pf_pick;     /* its pick: the request's decision */
    char *kvtp;           /* vLLM: the prefill answer's kv_transfer_params (JSON) */
    size_t pf_tried[MAX_ATTEMPTS]; /* SGLang: prefill workers whose pair failed */
    size_t npf_tried;
    size_t pf_attempts;   /* prefill attempts made (x-kvroute-attempts counts them too) */
    const char *pd_reason; /* ... and the last failure */
    kvr_pd_bootstrap bs;  /* SGLang: the bootstrap both calls carry ... */
    int has_bs;           /* ... when set */
    /* Not zeroed by preq_new (~7 KB a request would clear for nothing): each is written
     * before it is read (url and auth start as empty strings, fwd up to nfwd). */
    char url[URL_CAP];
    kvr_http_header fwd[MAX_FWD_HEADERS + 3];
    char auth[1100];      /* "Bearer <worker key>" of the current attempt */
    char dp_rank[KVR_RANK_HEADER_BUF]; /* the current attempt's X-data-parallel-rank value */
} preq;

enum { PD_DECODE = 1, PD_LOCAL = 2 };

/* The worker learns from this request: its input lands in the worker's KV cache. A
 * request about a stored response, or one that only tokenizes (tokenize, detokenize,
 * count_tokens), teaches nothing; nor does a decode attempt, whose prompt's KV came from the
 * prefill worker (taught by proxy/pd.c when it answered). */
static int teaches(const preq *p)
{
    return !p->fixed && kvr_endpoint_fills_cache(p->ep) && p->pd != PD_DECODE;
}

/* The pick the client is told of: a disaggregated request's prefill pick (its decode worker is
 * x-kvroute-worker), else the worker's. */
static const kvr_pick *shown(const preq *p)
{
    return p->pd == PD_DECODE ? &p->pf_pick : &p->pick;
}

/* Where picks and retries of the attempts relayed to the client are made: a disaggregated
 * request's decode side once prefilled elsewhere, else the route. */
static kvr_route *pick_route(const preq *p)
{
    return p->pd == PD_DECODE ? p->route->pd->decode : p->route;
}

/* The worker holding the request's prompt KV: where completion teaching goes. */
static kvr_worker *cache_worker(const preq *p)
{
    return p->pd == PD_DECODE ? p->pf_w : p->w;
}

static void set_request_id(preq *p)
{
    /* Echo the client's id when it is a sane token, so logs on both sides correlate. */
    const char *id = kvr_http_req_header(p->req, "x-request-id");
    size_t n = id ? strlen(id) : 0;
    int ok = n > 0 && n < sizeof(p->request_id);
    for (size_t i = 0; ok && i < n; i++)
        ok = id[i] > 0x20 && id[i] < 0x7f;
    if (ok) {
        memcpy(p->request_id, id, n + 1);
        return;
    }
    _Static_assert(sizeof(p->request_id) >= 4 + 32 + 1, "request id buffer");
    memcpy(p->request_id, "kvr-", 4);
    kvr_fmt_hex64(p->request_id + 4, kvr_rand_u64());
    kvr_fmt_hex64(p->request_id + 20, kvr_rand_u64());
    p->request_id[36] = '\0';
}

static void count_decision(preq *p)
{
    const kvr_pick *pk = shown(p);
    if (p->counted || !pk->decision)
        return; /* no decision yet (queued, or fetching token ids): nothing to count */
    p->counted = 1;
    const char *lv[] = {p->model, p->route->ops->name, pk->decision};
    kvr_metric_inc(p->app->m.decisions, lv, 1);
    kvr_status_stats_decision(p->app->status, pk->decision);
}

static preq *g_live;

static void preq_link(preq *p)
{
    p->next = g_live;
    if (g_live)
        g_live->prev = p;
    g_live = p;
}

static void prefill_close(preq *p, int first_byte);

static void span_facts(const preq *p, kvr_span_facts *f)
{
    *f = (kvr_span_facts){.name = p->span_name, .method = p->method, .route = p->model,
                          .policy = p->route->ops->name, .request_id = p->request_id,
                          .has_usage = p->usage.found, .prompt = p->usage.prompt,
                          .cached = p->usage.cached, .completion = p->usage.completion,
                          .match = -1, .ttft_ms = -1, .headers_ms = -1};
}

/* Records the current attempt's client span, once, when the attempt is over. */
static void attempt_span_close(preq *p)
{
    if (!p->span_open)
        return;
    p->span_open = 0;
    kvr_span_facts f;
    span_facts(p, &f);
    f.decision = p->span_decision;
    f.match = p->span_match;
    f.worker = p->w->url;
    f.url = p->url;
    f.attempt = p->ntried;
    f.status = p->span_code;
    f.error = p->span_err;
    f.start_mono_ns = p->att_start_ns;
    f.end_mono_ns = p->att_end_ns ? p->att_end_ns : kvr_now_ns();
    if (p->first_byte_ns >= p->att_start_ns && p->span_code)
        f.ttft_ms = (double)(p->first_byte_ns - p->att_start_ns) / 1e6;
    f.has_usage = f.has_usage && p->span_code;
    kvr_span_attempt(p->app->otlp, &p->tr, &f);
}

/* The request's end: its server span (its last attempt's span first), its access-log line
 * and its /status count, all from the same facts. */
static void request_done(preq *p)
{
    if (!p->app)
        return; /* never started (out of memory): answered and counted by kvr_reply_error */
    kvr_span_facts f;
    span_facts(p, &f);
    f.decision = shown(p)->decision;
    f.match = shown(p)->decision ? shown(p)->match : -1;
    f.worker = p->w ? p->w->url : NULL;
    f.prefill_worker = p->pd == PD_DECODE ? p->pf_w->url : NULL;
    f.attempt = p->ntried;
    f.status = p->final_status;
    f.start_mono_ns = p->start_ns;
    f.end_mono_ns = kvr_now_ns();
    if (p->first_byte_ns)
        f.ttft_ms = (double)(p->first_byte_ns - p->start_ns) / 1e6;
    if (p->headers_ns)
        f.headers_ms = (double)(p->headers_ns - p->start_ns) / 1e6;
    f.stream = p->sse;
    f.client = p->client;
    f.key = strcmp(p->key, "-") ? p->key : NULL;
    /* A relayed answer cut by its worker (an SSE error event or a truncated body ended it): a
     * failure, though the status said 200. A client that left is no failure of kvroute's. */
    if (p->span_err && p->status && strcmp(p->span_err, "client_gone") != 0)
        f.error = p->span_err;
    if (p->tr.on) {
        attempt_span_close(p);
        kvr_span_server(p->app->otlp, &p->tr, &f);
    }
    if (p->pd || p->pd_call) { /* (a request ended during its prefill stage counts too) */
        const char *lv[] = {p->model, p->final_status / 100 != 2 ? "error"
                                      : p->pd == PD_LOCAL    ? "local_prefill"
                                                             : "ok"};
        kvr_metric_inc(p->app->m.pd_requests, lv, 1);
    }
    kvr_reply_done(p->app, &f);
}

static void preq_free(preq *p)
{
    request_done(p);
    prefill_close(p, 0); /* attempts close it as they end; this only guards against a leak */
    if (p->prev)
        p->prev->next = p->next;
    else if (g_live == p)
        g_live = p->next;
    if (p->next)
        p->next->prev = p->prev;
    if (p->tok)
        kvr_tokenize_cancel(p->tok);
    /* The decode's whole answer relayed before the prefill's own arrived (SGLang): the prefill
     * finishes alone, so its worker still learns the prompt. Otherwise it is of no use now. */
    if (p->pd_call && p->final_status / 100 == 2 && !p->span_err)
        kvr_pd_call_detach(p->pd_call);
    else
        kvr_pd_call_cancel(p->pd_call);
    free(p->kvtp);
    kvr_cluster_rate_cancel(p->rate_op);
    kvr_cluster_wait_cancel(p->warm_wait);
    if (p->prefilling)
        p->w->prefilling--;
    kvr_buf_free(&p->held);
    kvr_request_keys_free(&p->keys);
    kvr_usage_free(&p->usage);
    kvr_buf_free(&p->body_rw);
    kvr_route_unref(p->route);
    free(p->model);
    free(p->client_model);
    free(p->pin);
    free(p);
}

static uint64_t g_inflight;     /* attempts in flight in the process (--max-inflight) */
static uv_timer_t g_admit_timer; /* dispatches the admission queue and expires its waiters */
static uv_timer_t g_down_timer;  /* fails the attempts of engines that turned unhealthy */
static void schedule_dispatch(kvr_app *app);

static void slot_take(kvr_worker *w)
{
    kvr_worker_acquire(w);
    g_inflight++;
}

/* A slot freed: queued requests get their turn on the next loop iteration (never from inside
 * the callback that freed it). */
static void slot_give(kvr_app *app, kvr_worker *w)
{
    kvr_worker_release(w);
    g_inflight--;
    if (kvr_admission_depth(app->admission))
        schedule_dispatch(app);
}

/* Ends the in-flight unit of the current attempt: exactly once per kvr_worker_acquire. */
/* Counts an attempt on `w` that ended with `code` (0 = no response) and frees its slot. */
static void attempt_count(kvr_app *app, kvr_worker *w, int code)
{
    char c[KVR_FMT_U64_MAX];
    kvr_fmt_u64(c, (uint64_t)(code < 0 ? 0 : code));
    const char *lv[] = {w->url, c};
    kvr_metric_inc(app->m.worker_requests, lv, 1);
    slot_give(app, w);
}

/* cost: the attempt's prefill is outstanding at its worker from its start until its first
 * byte; a 2xx stream's first byte also times that prefill (a whole body arrives after
 * decoding, an error says nothing about it). */
static void prefill_open(preq *p)
{
    if (!p->route->ops->prefill_start)
        return;
    p->pf_open = 1;
    p->pf_tokens = p->pick.prefill_tokens;
    p->pf_start_ns = kvr_now_ns();
    p->pf_ahead = kvr_route_prefill_start(p->route, p->w, p->pf_tokens);
}

static void prefill_close(preq *p, int first_byte)
{
    if (!p->pf_open)
        return;
    p->pf_open = 0;
    double ms = first_byte && p->sse && p->status / 100 == 2
                    ? (double)(kvr_now_ns() - p->pf_start_ns) / 1e6
                    : -1;
    kvr_route_prefill_end(p->route, p->w, p->pf_tokens, p->pf_ahead, ms);
}

static void attempt_ended(preq *p, int code)
{
    p->att_end_ns = kvr_now_ns();
    prefill_close(p, 0);
    attempt_count(p->app, p->w, code);
    p->att = NULL;
}

/* How far the policy's view of the chosen worker's cache was from what the worker reported:
 * exact picks predicted resident tokens; approximate ones a byte ratio, which turns into tokens
 * with the request's reported prompt size. */
static void count_prediction(preq *p)
{
    if (!p->pick.index || !p->usage.has_cached || p->status / 100 != 2 || p->usage.prompt <= 0)
        return;
    double predicted = p->pick.predicted_tokens >= 0
                           ? (double)p->pick.predicted_tokens
                           : (p->pick.chosen_match > 0 ? p->pick.chosen_match : 0) *
                                 (double)p->usage.prompt;
    double err = predicted - (double)p->usage.cached;
    if (err < 0)
        err = -err;
    const char *lm[] = {p->model};
    kvr_metric_observe(p->app->m.prediction_error, lm, err);
    double block = p->pick.block_size ? p->pick.block_size : 16;
    const char *lw[] = {p->model, p->w->url};
    if (err > block)
        kvr_metric_inc(p->app->m.mispredictions, lw, 1);
    else
        kvr_metric_inc(p->app->m.mispredictions, lw, 0);
    /* The approximate index learns from its own errors (the exact one from KV events). A
     * shortfall is no evidence of eviction when another attempt on the worker was still
     * computing what it taught when this one was sent: that prefix was not cached yet. */
    if (p->pick.predicted_tokens < 0) {
        p->correct = err > block && (!p->unsettled || (double)p->usage.cached > predicted);
        if (!p->correct)
            kvr_metric_inc(p->app->m.index_corrections, lw, 0);
    }
}

/* Runs after completion teaching, so that all the worker has just cached (prompt and reply)
 * is recent and stays; `prompt_len` is the routing text's length as routed (the keys may have
 * the reply appended now), which the reported share of cached tokens is a share of. */
static void correct_index(preq *p, size_t prompt_len)
{
    kvr_route_keys k = p->keys.k;
    k.text_len = prompt_len < k.text_len ? prompt_len : k.text_len;
    const char *lw[] = {p->model, p->w->url};
    int fixed = kvr_route_correct(p->route, p->w, &k, &p->pick, p->usage.cached,
                                  p->usage.prompt);
    kvr_metric_inc(p->app->m.index_corrections, lw, fixed);
    if (fixed) { /* the others drop what it lost, then learn the prompt again, as here */
        kvr_app_cluster_corrected(p->app, p->route, p->w, &k, p->usage.cached, p->usage.prompt);
        kvr_app_cluster_taught(p->app, p->route, p->w, &k);
    }
}

/* The worker now also holds its own reply (engines cache generated tokens too): teach the
 * request's text followed by the reply, framed as the next turn will send it, so a follow-up
 * without a session id still finds this worker. Replies over the cap teach nothing more. */
static void teach_reply(preq *p)
{
    const char *s;
    size_t n;
    json_t *reply = NULL;
    int rc;
    if (p->ep != KVR_EP_MESSAGES && kvr_usage_reply_text(&p->usage, &s, &n)) {
        /* Text alone, the usual answer: appended as is, no tree built for it. */
        rc = kvr_route_text_append_reply_text(&p->keys.text, (kvr_route_kind)p->ep, s, n);
    } else {
        reply = kvr_usage_reply(&p->usage, p->ep == KVR_EP_COMPLETIONS);
        rc = reply ? kvr_route_text_append_reply(&p->keys.text, (kvr_route_kind)p->ep, reply)
                   : 0;
    }
    if (rc == 1) {
        p->keys.k.text = p->keys.text.data;
        p->keys.k.text_len = p->keys.text.len;
        p->refresh_owed = 0;
        kvr_route_teach(p->route, cache_worker(p), &p->keys.k);
        kvr_app_cluster_taught(p->app, p->route, cache_worker(p), &p->keys.k);
    }
    json_decref(reply);
}

/* The prompt's teach when the answer started recorded only new blocks (refresh_later): a
 * request that ends without its reply's teach (no reply text, a failure, the client gone)
 * refreshes the prompt's recency here, as that teach would have. */
static void refresh_prompt(preq *p)
{
    if (!p->refresh_owed)
        return;
    p->refresh_owed = 0;
    kvr_route_teach(p->route, p->w, &p->keys.k);
}

static void count_usage(preq *p)
{
    kvr_usage_finish(&p->usage);
    if (!p->usage.found)
        return;
    const char *lv[] = {p->model, p->w->url};
    if (p->pd == PD_DECODE) { /* the prompt was counted where it was prefilled (proxy/pd.c) */
        kvr_metric_inc(p->app->m.completion_tokens, lv, (double)p->usage.completion);
        return;
    }
    kvr_metric_inc(p->app->m.prompt_tokens, lv, (double)p->usage.prompt);
    kvr_metric_inc(p->app->m.cached_tokens, lv, (double)p->usage.cached);
    kvr_metric_inc(p->app->m.completion_tokens, lv, (double)p->usage.completion);
    kvr_status_stats_tokens(p->app->status, kvr_now_ms(), p->usage.prompt, p->usage.cached);
    count_prediction(p);
}

static void queue_left(preq *p);

static void on_client_gone(void *ud)
{
    preq *p = ud;
    if (p->waiter.queued)
        queue_left(p); /* gone from the queue at once, never reaching a worker */
    count_decision(p);
    refresh_prompt(p);
    if (p->att) {
        kvr_upstream_cancel(p->att);
        kvr_app_attempt_abandon(p->app, p->w, p->trial);
        p->span_code = p->status;
        p->span_err = "client_gone";
        attempt_ended(p, p->status);
    }
    const char *lv[] = {p->model, kvr_http_req_endpoint(p->req)};
    kvr_metric_inc(p->app->m.client_aborts, lv, 1);
    p->final_status = 499;
    kvr_reply_count(p->app, p->req, p->model, 499);
    kvr_http_resp_abort(p->req);
    preq_free(p);
}

static void on_drain(void *ud)
{
    preq *p = ud;
    if (p->paused && p->att) {
        p->paused = 0;
        kvr_upstream_resume(p->att);
    }
}

static int64_t parse_content_length(const char *v, size_t n)
{
    int64_t x = 0;
    if (n == 0 || n > 18)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (v[i] < '0' || v[i] > '9')
            return -1;
        x = x * 10 + (v[i] - '0');
    }
    return x;
}

static int retry_elsewhere(preq *p, const char *reason);
static int enqueue(preq *p);
static size_t exclude_full(preq *p, size_t *ex, size_t cap, size_t *nfull);
static void local_prefill_label(preq *p);
static void give_verdict(preq *p, int failure);

/* OpenAI's x-ratelimit-* headers for a key with limits (6 entries at `out`); returns how many. */
static size_t ratelimit_headers(preq *p, kvr_http_header *out)
{
    static const char *const names[6] = {
        "x-ratelimit-limit-requests", "x-ratelimit-remaining-requests",
        "x-ratelimit-reset-requests", "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"};
    if (!p->rl.limited)
        return 0;
    const kvr_ratelimit_info *i = &p->rl;
    snprintf(p->rl_val[0], 24, "%llu", (unsigned long long)i->limit_requests);
    snprintf(p->rl_val[1], 24, "%llu", (unsigned long long)i->remaining_requests);
    snprintf(p->rl_val[2], 24, "%llus", (unsigned long long)i->reset_requests_s);
    snprintf(p->rl_val[3], 24, "%llu", (unsigned long long)i->limit_tokens);
    snprintf(p->rl_val[4], 24, "%llu", (unsigned long long)i->remaining_tokens);
    snprintf(p->rl_val[5], 24, "%llus", (unsigned long long)i->reset_tokens_s);
    for (size_t k = 0; k < 6; k++)
        out[k] = (kvr_http_header){names[k], strlen(names[k]), p->rl_val[k],
                                   strlen(p->rl_val[k])};
    return 6;
}
static void release_body(preq *p);

/* 500/502/503/504 say the worker failed this request, not that the request is wrong. */
static int retryable_status(int status)
{
    return status == 500 || status == 502 || status == 503 || status == 504;
}

static void on_headers(void *ud, int status, const kvr_http_header *h, size_t n)
{
    preq *p = ud;
    p->status = status;
    if (status >= 500) {
        give_verdict(p, 1);
    } else if (p->trial) {
        /* A half-open trial answered (a 4xx is no failure either): the worker serves again,
         * and the requests waiting for it need not wait for the whole answer (a long stream).
         * Later failures of this answer count as any closed breaker's. */
        kvr_app_attempt_verdict(p->app, p->w, 0, 1);
        p->trial = 0;
    }
    if (retryable_status(status)) {
        /* Nothing reached the client yet: try another worker, relaying this answer only
         * when none is left. The attempt is cancelled from inside its own callback (allowed). */
        char reason[24];
        snprintf(reason, sizeof(reason), "http_%d", status);
        kvr_upstream_attempt *att = p->att;
        kvr_worker *w = p->w;
        kvr_app *app = p->app;
        prefill_close(p, 0);
        p->span_code = status;
        p->att_end_ns = kvr_now_ns();
        /* On -1 the request was answered and freed: only the saved pointers are used below. */
        if (retry_elsewhere(p, reason) != 0) {
            KVR_INFO("msg=\"worker failed: retried elsewhere\" worker=%s status=%d", w->url,
                     status);
            kvr_upstream_cancel(att);
            attempt_count(app, w, status);
            return;
        }
    }
    kvr_http_header out[MAX_FWD_HEADERS + 12];
    size_t k = 0;
    int64_t clen = -1;
    const char *conn = NULL;
    char connbuf[256];
    for (size_t i = 0; i < n; i++)
        if (kvr_header_is(h[i].name, h[i].name_len, "connection")) {
            size_t cn = h[i].value_len < sizeof(connbuf) ? h[i].value_len : sizeof(connbuf) - 1;
            memcpy(connbuf, h[i].value, cn);
            connbuf[cn] = '\0';
            conn = connbuf;
        }
    for (size_t i = 0; i < n && k < MAX_FWD_HEADERS; i++) {
        const char *nm = h[i].name;
        size_t nl = h[i].name_len;
        if (kvr_hop_by_hop(nm, nl, conn) || kvr_header_is(nm, nl, "date") ||
            kvr_header_is(nm, nl, "x-request-id") || (nl > 10 && !strncasecmp(nm, "x-kvroute-", 10)))
            continue;
        if (kvr_header_is(nm, nl, "content-length")) {
            clen = parse_content_length(h[i].value, h[i].value_len);
            continue;
        }
        if (kvr_header_is(nm, nl, "content-type") && h[i].value_len >= 17 &&
            !strncasecmp(h[i].value, "text/event-stream", 17))
            p->sse = 1;
        out[k++] = h[i];
    }
    const kvr_pick *pk = shown(p);
    out[k++] = (kvr_http_header){"x-kvroute-worker", 16, p->w->url, strlen(p->w->url)};
    out[k++] = (kvr_http_header){"x-kvroute-decision", 18, pk->decision, strlen(pk->decision)};
    if (p->pd == PD_DECODE)
        out[k++] = (kvr_http_header){"x-kvroute-prefill-worker", 24, p->pf_w->url,
                                     strlen(p->pf_w->url)};
    out[k++] = (kvr_http_header){"x-request-id", 12, p->request_id, strlen(p->request_id)};
    _Static_assert(sizeof(p->attempts) >= KVR_FMT_U64_MAX, "attempts buffer");
    size_t an = kvr_fmt_u64(p->attempts, p->ntried + p->pf_attempts);
    out[k++] = (kvr_http_header){"x-kvroute-attempts", 18, p->attempts, an};
    k += ratelimit_headers(p, out + k);
    if (pk->match >= 0) {
        snprintf(p->match, sizeof(p->match), "%.2f", pk->match);
        out[k++] = (kvr_http_header){"x-kvroute-match", 15, p->match, strlen(p->match)};
    }
    if (pk->index)
        out[k++] = (kvr_http_header){"x-kvroute-index", 15, pk->index, strlen(pk->index)};
    count_decision(p);
    int ok = status / 100 == 2;
    /* A stored response read again is no new work: its usage is not counted twice. */
    int scan = ok && !p->fixed;
    kvr_usage_init(&p->usage, p->sse, scan ? p->app->cfg.max_usage_bytes : 0,
                   scan && p->ep == KVR_EP_RESPONSES);
    if (p->ep == KVR_EP_MESSAGES)
        kvr_usage_messages(&p->usage);
    /* Completion teaching: the keys wait for the reply, which joins them when it is complete. */
    p->teach_reply = scan && kvr_endpoint_generates(p->ep) && p->route->ops->teach &&
                     p->keys.k.text_len && p->app->cfg.teach_completion_max_bytes;
    if (p->teach_reply)
        kvr_usage_want_reply(&p->usage, p->app->cfg.teach_completion_max_bytes);
    kvr_http_resp_start(p->req, status, out, k, clen);
    p->headers_ns = kvr_now_ns();
    /* Teach when the 2xx headers arrive (DESIGN §10): a burst sharing a new prefix gains
     * affinity as soon as the first answer starts; failed attempts teach nothing. */
    if (ok && teaches(p)) {
        /* When the reply's teach will follow, this one records only what is new: the whole
         * prompt's recency is refreshed once, at the end (kvr_prefix_index_insert_new). */
        p->keys.k.refresh_later = p->refresh_owed = p->teach_reply && p->w == cache_worker(p);
        kvr_route_teach(p->route, p->w, &p->keys.k);
        p->keys.k.refresh_later = 0;
        kvr_app_cluster_taught(p->app, p->route, p->w, &p->keys.k);
        p->prefilling = 1;
        p->w->prefilling++;
    }
    /* A correction, once usage reports what the worker really held, teaches the prompt again:
     * the same buffer is kept (completion teaching usually keeps it anyway), not a copy. */
    int correctable = ok && teaches(p) && !p->unsettled && p->pick.use.runs &&
                      p->route->ops->correct && p->keys.k.text_len;
    /* A prefill call still in flight (SGLang's runs beside the decode) reads the keys. */
    if (!p->teach_reply && !correctable && !p->pd_call)
        kvr_request_keys_free(&p->keys);
    else
        kvr_request_keys_set_tokens(&p->keys, NULL, 0); /* teaching reads the text only */
    /* No further attempt can need the body now (DESIGN §11): free it as soon as it is sent. */
    p->body_pending = 1;
    release_body(p);
}

/* The byte `back` positions before data[i] in the stream held + data, or 0 before its start. */
static char before(const preq *p, const char *data, size_t i, size_t back)
{
    if (i >= back)
        return data[i - back];
    size_t h = back - i;
    return h <= p->held.len ? p->held.data[p->held.len - h] : 0;
}

/* SSE is relayed event by event: bytes after the last complete event (blank line, LF or CRLF)
 * are held until the event completes. So when the worker dies mid-event, kvroute's error
 * event never lands inside a half-written one, which clients could not parse. */
static void relay_sse(preq *p, const char *data, size_t len)
{
    size_t cut = 0; /* bytes of data up to and including the last event terminator */
    for (size_t i = len; i-- > 0;) {
        if (data[i] != '\n')
            continue;
        char a = before(p, data, i, 1), b = before(p, data, i, 2);
        if (a == '\n' || (a == '\r' && b == '\n')) {
            cut = i + 1;
            break;
        }
    }
    if (cut) {
        if (p->held.len) {
            kvr_http_resp_write(p->req, p->held.data, p->held.len);
            kvr_buf_reset(&p->held);
        }
        kvr_http_resp_write(p->req, data, cut);
    }
    if (cut < len && kvr_buf_append(&p->held, data + cut, len - cut) < 0) {
        /* An event larger than the hold cap: relay it as it comes. */
        kvr_http_resp_write(p->req, p->held.data, p->held.len);
        kvr_buf_reset(&p->held);
        kvr_http_resp_write(p->req, data + cut, len - cut);
    }
}

/* The worker holds the response it is creating from the moment its id is known (a stream
 * names it in its first event): a client may read or cancel it before it ends. */
static void pin_response(preq *p)
{
    if (p->pinned || !p->usage.response_id)
        return;
    p->pinned = 1;
    kvr_route_pin_response(p->route, p->usage.response_id, strlen(p->usage.response_id), p->w);
}

/* DELETE /v1/responses/{id} succeeded: the worker holds that response no more. */
static void unpin_deleted(preq *p)
{
    static const char prefix[] = "/v1/responses/";
    const char *path = kvr_http_req_path(p->req);
    if (!p->fixed || p->status / 100 != 2 || strcmp(kvr_http_req_method(p->req), "DELETE") ||
        strncmp(path, prefix, sizeof(prefix) - 1))
        return;
    const char *id = path + sizeof(prefix) - 1;
    if (*id && !strchr(id, '/'))
        kvr_route_unpin_response(p->route, id, strlen(id));
}

static int on_body(void *ud, const char *data, size_t len)
{
    preq *p = ud;
    if (p->body_pending)
        release_body(p);
    if (!p->got_body) {
        p->got_body = 1;
        p->first_byte_ns = kvr_now_ns();
        if (p->prefilling) {
            p->prefilling = 0;
            p->w->prefilling--;
        }
        prefill_close(p, 1);
        const char *lv[] = {p->model, kvr_http_req_endpoint(p->req)};
        kvr_metric_observe(p->app->m.ttft, lv, (double)(p->first_byte_ns - p->start_ns) / 1e9);
        kvr_status_stats_ttft(p->app->status, p->first_byte_ns / 1000000u,
                              (double)(p->first_byte_ns - p->start_ns) / 1e6);
    }
    /* Check the watermark before taking bytes: a refusal means libcurl redelivers them. */
    if (kvr_http_resp_pending(p->req) > p->app->cfg.http.write_high_water) {
        p->paused = 1;
        return 1;
    }
    kvr_usage_feed(&p->usage, data, len);
    pin_response(p);
    if (p->sse)
        relay_sse(p, data, len);
    else
        kvr_http_resp_write(p->req, data, len);
    return 0;
}

static void count_error(preq *p, kvr_upstream_err err)
{
    const char *lv[] = {p->w->url, kvr_upstream_err_name(err)};
    kvr_metric_inc(p->app->m.upstream_errors, lv, 1);
}

static void failure_text(const preq *p, kvr_upstream_err err, const char *msg, char *out,
                         size_t cap)
{
    snprintf(out, cap, "worker %s failed: %s (%s)", p->w->url, kvr_upstream_err_name(err),
             msg ? msg : "");
}

/* No response came: 502 for every failure before headers, timeouts included (the issue's
 * contract), with the routing headers so the client can tell which worker failed. */
static void fail_before_headers(preq *p, kvr_upstream_err err, const char *msg)
{
    char text[512];
    failure_text(p, err, msg, text, sizeof(text));
    snprintf(p->attempts, sizeof(p->attempts), "%zu", p->ntried + p->pf_attempts);
    kvr_http_header hs[] = {
        {"x-kvroute-worker", 16, p->w->url, strlen(p->w->url)},
        {"x-kvroute-decision", 18, shown(p)->decision, strlen(shown(p)->decision)},
        {"x-request-id", 12, p->request_id, strlen(p->request_id)},
        {"x-kvroute-attempts", 18, p->attempts, strlen(p->attempts)},
    };
    p->final_status = 502;
    kvr_reply_error(p->app, p->req, p->model, 502, text, NULL, "upstream_error", hs, 4);
    preq_free(p);
}

/* Ends a response whose status is already sent, saying why where the format allows: an SSE
 * stream gets a final `data: {"error":...}` event (Messages: Anthropic's `event: error`) and
 * a proper end, so clients (the openai and anthropic SDKs raise on an error event) see the
 * reason; any other body is cut without its terminator, so the client sees a truncated
 * response (docs/operations.md). Frees `p`. */
static void end_after_headers(preq *p, int status, const char *text, const char *code)
{
    refresh_prompt(p);
    p->final_status = p->status;
    kvr_reply_count(p->app, p->req, p->model, p->status);
    if (p->sse) {
        kvr_buf b;
        kvr_buf_init(&b, 0);
        kvr_buf_puts(&b, p->ep == KVR_EP_MESSAGES ? "event: error\ndata: " : "data: ");
        kvr_error_json_for(&b, kvr_http_req_path(p->req), status, NULL, text, NULL, code);
        kvr_buf_puts(&b, "\n\n");
        kvr_http_resp_write(p->req, b.data, b.len);
        kvr_buf_free(&b);
        kvr_http_resp_end(p->req);
    } else {
        kvr_http_resp_abort(p->req);
    }
    preq_free(p);
}

static int start_attempt(preq *p);

static void give_verdict(preq *p, int failure)
{
    if (p->verdict)
        return;
    p->verdict = 1;
    kvr_app_attempt_verdict(p->app, p->w, failure, p->trial);
}

static void release_body(preq *p)
{
    size_t len;
    kvr_http_req_body(p->req, &len);
    if (p->body_rw.len)
        len = p->body_rw.len; /* what this attempt sends */
    if (p->att && !kvr_upstream_body_sent(p->att, len))
        return;
    p->body_pending = 0;
    kvr_http_req_release_body(p->req);
    kvr_buf_free(&p->body_rw);
}

/* None eligible (or none this request may take), but a worker's half-open trial is running:
 * the request waits in the queue for its answer (the breaker closes when it starts well), not
 * a 503 while the fleet recovers. A failed trial opens it again; the waiters get their 503
 * then. With --max-queue 0 nothing waits. */
static int trial_pending(const preq *p, const kvr_route *r)
{
    return p->app->cfg.max_queue && kvr_route_on_trial(r);
}

/* Picks again among eligible workers not tried yet, within the attempt cap and the route's
 * retry budget. Returns 1 when a new attempt started or the request now waits in the queue
 * for a trial's verdict (trial_pending), 0 when there was none to try (nothing changed), -1
 * when starting one failed (the request is answered and freed). */
static int retry_elsewhere(preq *p, const char *reason)
{
    kvr_pick pick;
    const kvr_route_target *target;
    size_t ex[MAX_ATTEMPTS + 512], nfull;
    /* A retry replaces an attempt that is ending, so only the workers' own caps apply. */
    size_t nex = exclude_full(p, ex, sizeof(ex) / sizeof(ex[0]), &nfull);
    if (p->fixed || p->ntried >= (size_t)p->app->cfg.max_retries + 1 ||
        p->ntried >= MAX_ATTEMPTS)
        return 0;
    kvr_route *r = pick_route(p);
    int picked = kvr_route_pick(r, ex, nex, &p->keys.k, p->pin, p->pin_len, &pick, &target) == 0;
    /* No other worker now, but one whose half-open trial is running: the retry waits for its
     * verdict in the queue, as a new request would. */
    int wait = !picked && trial_pending(p, r);
    if (!(picked || wait) ||
        !kvr_route_retry_allowed(p->route, p->app->cfg.retry_budget, kvr_now_ms()))
        return 0;
    const char *lv[] = {p->model, reason};
    kvr_metric_inc(p->app->m.retries, lv, 1);
    if (wait) {
        p->status = 0;
        p->sse = 0;
        p->att = NULL; /* (the caller ends the failed one) */
        return enqueue(p) < 0 ? -1 : 1;
    }
    p->pick = pick;
    p->target = target;
    local_prefill_label(p);
    p->status = 0;
    p->sse = 0;
    return start_attempt(p) ? 1 : -1;
}

/* Failures before any response byte that another worker may safely take over. */
static int retryable_error(kvr_upstream_err err)
{
    return err == KVR_UP_CONNECT || err == KVR_UP_CONNECT_TIMEOUT ||
           err == KVR_UP_FIRST_BYTE_TIMEOUT || err == KVR_UP_RESET || err == KVR_UP_PROTOCOL;
}

static void on_done(void *ud, kvr_upstream_err err, const char *msg, int got_headers)
{
    preq *p = ud;
    kvr_app *app = p->app;
    give_verdict(p, err != KVR_UP_OK || p->status >= 500);
    p->span_code = got_headers ? p->status : 0;
    p->span_err = err != KVR_UP_OK ? kvr_upstream_err_name(err) : NULL;
    attempt_ended(p, got_headers ? p->status : 0);
    if (err != KVR_UP_OK && !got_headers && retryable_error(err)) {
        count_error(p, err);
        KVR_WARN("msg=\"worker failed before answering\" worker=%s kind=%s detail=\"%s\" "
                 "request_id=%s attempt=%zu",
                 p->w->url, kvr_upstream_err_name(err), msg ? msg : "", p->request_id,
                 p->ntried);
        if (err == KVR_UP_CONNECT)
            kvr_health_mark_down(&app->wctx, p->w, kvr_now_ms());
        int rc = retry_elsewhere(p, kvr_upstream_err_name(err));
        if (rc != 0)
            return;
        count_decision(p);
        fail_before_headers(p, err, msg);
        return;
    }
    count_decision(p);
    if (err == KVR_UP_OK) {
        if (p->held.len)
            kvr_http_resp_write(p->req, p->held.data, p->held.len);
        count_usage(p);
        size_t prompt_len = p->keys.k.text_len;
        if (p->teach_reply)
            teach_reply(p);
        refresh_prompt(p);
        if (p->correct)
            correct_index(p, prompt_len);
        /* count_tokens generates nothing and reports no usage: its estimate is refunded */
        if (p->rl.limited && (p->usage.found || p->ep == KVR_EP_COUNT_TOKENS))
            kvr_ratelimit_settle(app->ratelimits, p->key,
                                 (int64_t)(p->usage.prompt + p->usage.completion) -
                                     (int64_t)p->rl_tokens,
                                 kvr_now_ms());
        pin_response(p);
        unpin_deleted(p);
        p->final_status = p->status;
        kvr_reply_count(app, p->req, p->model, p->status);
        kvr_http_resp_end(p->req);
        preq_free(p);
        return;
    }
    count_error(p, err);
    KVR_WARN("msg=\"upstream failed\" worker=%s kind=%s detail=\"%s\" request_id=%s "
             "after_headers=%d",
             p->w->url, kvr_upstream_err_name(err), msg ? msg : "", p->request_id, got_headers);
    char text[512];
    failure_text(p, err, msg, text, sizeof(text));
    if (!got_headers) {
        fail_before_headers(p, err, msg);
        return;
    }
    end_after_headers(p, 502, text, "upstream_error");
}

static const kvr_upstream_cbs upstream_cbs = {on_headers, on_body, on_done};

static void build_forward_headers(preq *p)
{
    kvr_http_req *r = p->req;
    const char *conn = kvr_http_req_header(r, "connection");
    size_t n = kvr_http_req_header_count(r);
    for (size_t i = 0; i < n && p->nfwd < MAX_FWD_HEADERS - 1; i++) {
        const kvr_http_header *h = kvr_http_req_header_at(r, i);
        if (kvr_hop_by_hop(h->name, h->name_len, conn) ||
            kvr_header_is(h->name, h->name_len, "host") ||
            kvr_header_is(h->name, h->name_len, "content-length") ||
            kvr_header_is(h->name, h->name_len, "expect") ||
            kvr_header_is(h->name, h->name_len, "x-request-id") ||
            kvr_header_is(h->name, h->name_len, "authorization") ||
            kvr_header_is(h->name, h->name_len, "x-api-key") ||
            kvr_header_is(h->name, h->name_len, "x-kvroute-token-ids") ||
            kvr_header_is(h->name, h->name_len, "x-data-parallel-rank") ||
            (p->tr.on && kvr_header_is(h->name, h->name_len, "traceparent")) ||
            (p->tr.on && !p->tr.has_parent && kvr_header_is(h->name, h->name_len, "tracestate")))
            continue; /* client credentials are kvroute's to check, never the worker's; the
                       * token ids are kvroute's routing input and may be large; the
                       * data-parallel rank is the routing decision's, never the client's; each attempt
                       * gets its own traceparent, and a tracestate without a valid parent is
                       * dropped (W3C Trace Context §3.3) */
        p->fwd[p->nfwd++] = *h;
    }
    p->fwd[p->nfwd++] =
        (kvr_http_header){"x-request-id", 12, p->request_id, strlen(p->request_id)};
    p->nfixed = p->nfwd;
}

/* The worker's own key goes with every attempt to it (each attempt may be another worker). */
static size_t attempt_headers(preq *p)
{
    p->nfwd = p->nfixed;
    p->nfwd += kvr_worker_authorization(p->w, p->auth, sizeof(p->auth), &p->fwd[p->nfwd]);
    if (p->tr.on)
        p->fwd[p->nfwd++] = (kvr_http_header){"traceparent", 11, p->tr.traceparent,
                                              KVR_TRACEPARENT_LEN};
    p->nfwd += kvr_worker_rank_header(p->w, p->dp_rank, &p->fwd[p->nfwd]);
    return p->nfwd;
}

static void begin(preq *p);
static int pick_with_room(preq *p, int process);
static int pick_fixed(preq *p, int process);
static int over_rate_limit(preq *p, const kvr_proxy_body *body);
static void reply_rate_limited(preq *p);

static void route_now(preq *p);

static void on_tokens(void *ud, const uint32_t *ids, size_t n, kvr_tokenize_source src)
{
    preq *p = ud;
    p->tok = NULL;
    const char *lm[] = {p->model}, *ls[] = {p->model, kvr_tokenize_source_name(src)};
    kvr_metric_inc(p->app->m.tokenize, ls, 1);
    kvr_metric_observe(p->app->m.tokenize_seconds, lm,
                       (double)(kvr_now_ns() - p->tok_start_ns) / 1e9);
    if (ids && n)
        kvr_request_keys_set_tokens(&p->keys, ids, n); /* on failure: routed approximately */
    if (!p->tok_sync)
        route_now(p);
}

/* Starts fetching the prompt's token ids (precise routing). Returns 1 when the answer comes
 * later (on_tokens then routes), 0 when it is already in the keys (or cannot be had). */
static int fetch_tokens(preq *p)
{
    kvr_tokenize_op *op;
    p->tok_start_ns = kvr_now_ns();
    p->tok_sync = 1;
    kvr_request_keys_tokenize(p->app, p->route, p->ep, p->req, &p->keys, on_tokens, p, &op);
    p->tok_sync = 0;
    p->tok = op;
    return op != NULL;
}

static void no_eligible(preq *p)
{
    char ra[24];
    snprintf(ra, sizeof(ra), "%llu", (unsigned long long)p->app->cfg.retry_after_s);
    kvr_http_header h[] = {{"Retry-After", 11, ra, strlen(ra)},
                           {"x-request-id", 12, p->request_id, strlen(p->request_id)}};
    p->final_status = 503;
    kvr_reply_error(p->app, p->req, p->model, 503,
                    "no eligible worker can serve this request now", NULL,
                    "no_eligible_worker", h, 2);
    preq_free(p);
}

/* The client's traceparent, or NULL when it sent none or more than one (then invalid, as the
 * W3C Trace Context test suite has it: a new trace starts). */
static const char *client_traceparent(kvr_http_req *r)
{
    const char *v = NULL;
    size_t n = kvr_http_req_header_count(r);
    for (size_t i = 0; i < n; i++) {
        const kvr_http_header *h = kvr_http_req_header_at(r, i);
        if (kvr_header_is(h->name, h->name_len, "traceparent")) {
            if (v)
                return NULL;
            v = kvr_http_req_header(r, "traceparent");
        }
    }
    return v;
}

/* The body's string field `which` (tree: member `name`), decoded, as a new string in *out
 * (NULL when it is no string), length in *len. Returns 0, or -1 when memory ran out. */
static int body_strdup(const kvr_proxy_body *body, kvr_field which, const char *name,
                       char **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    if (body && body->tree) {
        const json_t *v = json_object_get(body->tree, name);
        if (!json_is_string(v))
            return 0;
        *len = json_string_length(v);
        return (*out = strndup(json_string_value(v), *len)) ? 0 : -1;
    }
    if (body && body->fields)
        return kvr_body_strdup(body->fields, which, out, len) < 0 ? -1 : 0;
    return 0;
}

/* A request's state, before anything is sent. NULL when memory ran out (then answered).
 * `body` is NULL for a stored-response request. */
static preq *preq_new(kvr_app *app, kvr_http_req *r, kvr_endpoint ep, kvr_route *route,
                      const kvr_proxy_body *body)
{
    preq *p = malloc(sizeof(*p));
    if (p) {
        memset(p, 0, offsetof(preq, url));
        p->url[0] = p->auth[0] = '\0';
        kvr_route_ref(route);
        p->route = route;
        kvr_buf_init(&p->body_rw, 0);
        kvr_buf_init(&p->held, SSE_HOLD_CAP);
    }
    size_t pin_len = 0, model_len;
    char *pin = NULL;
    int oom = !p;
    if (!oom && ep == KVR_EP_RESPONSES &&
        body_strdup(body, KVR_FIELD_PREVIOUS_RESPONSE_ID, "previous_response_id", &pin,
                    &pin_len) < 0)
        oom = 1;
    if (pin && !pin_len) { /* "" pins nothing (routing/keys.h) */
        free(pin);
        pin = NULL;
    }
    if (p)
        p->pin = pin;
    if (oom || !(p->model = strdup(route->name)) ||
        body_strdup(body, KVR_FIELD_MODEL, "model", &p->client_model, &model_len) < 0 ||
        (body && body->tree
             ? kvr_request_keys_build(app, route, body->tree, ep, r, &p->keys)
             : kvr_request_keys_build_fields(app, route, body ? body->fields : NULL, ep, r,
                                             &p->keys)) < 0) {
        if (p)
            preq_free(p);
        kvr_reply_error(app, r, NULL, 503, "out of memory", NULL, NULL, NULL, 0);
        return NULL;
    }
    p->pin_len = pin ? pin_len : 0;
    p->app = app;
    p->req = r;
    p->ep = ep;
    preq_link(p);
    set_request_id(p);
    p->key = kvr_http_req_tag(r) ? kvr_http_req_tag(r) : "-";
    const char *peer = kvr_http_req_peer(r);
    size_t pn = strnlen(peer, sizeof(p->client) - 1);
    memcpy(p->client, peer, pn);
    p->client[pn] = '\0';
    p->start_ns = kvr_http_req_start_ns(r);
    if (app->otlp) {
        snprintf(p->method, sizeof(p->method), "%s", kvr_http_req_method(r));
        snprintf(p->span_name, sizeof(p->span_name), "%s %s", p->method,
                 kvr_http_req_endpoint(r));
        kvr_trace_begin(app->otlp, &p->tr, client_traceparent(r), p->start_ns);
    }
    return p;
}

/* Rate limits, then routing (once the prompt's token ids are known, when the policy needs
 * them). */
static void preq_continue(preq *p);

/* The cross-replica count of the key's requests answered (cluster/cluster.h): 1 fits, 0
 * refused, -1 unknown (Redis slow or down): then this replica allows its share of the
 * limit, the limit divided by the live replicas, counted locally. */
static void rate_answer(void *ud, int allowed, uint64_t retry_ms)
{
    preq *p = ud;
    p->rate_op = NULL;
    if (allowed < 0) {
        size_t n = kvr_cluster_replicas(p->app->cluster);
        uint64_t rpm = p->rl.limit_requests, used = rpm - p->rl.remaining_requests;
        uint64_t share = (rpm + (n ? n : 1) - 1) / (n ? n : 1);
        allowed = used <= share;
        retry_ms = 60000 / (share ? share : 1);
    }
    if (!allowed) {
        p->rl.remaining_requests = 0;
        p->rl.retry_after_s = retry_ms ? (retry_ms + 999) / 1000 : 1;
        reply_rate_limited(p);
        return;
    }
    preq_continue(p);
}

static void preq_start(preq *p, const kvr_proxy_body *body)
{
    kvr_app *app = p->app;
    if (over_rate_limit(p, body))
        return;
    kvr_http_req_cbs cbs = {on_drain, on_client_gone};
    kvr_http_req_set_cbs(p->req, &cbs, p);
    /* requests_per_minute counts across replicas: one bounded Redis round trip. */
    if (app->cluster && p->rl.limited && p->rl.limit_requests) {
        p->rate_op = kvr_cluster_rate(app->cluster, p->key, p->rl.limit_requests, 1,
                                      rate_answer, p);
        if (p->rate_op)
            return;
    }
    preq_continue(p);
}

static void warm_over(void *ud)
{
    preq *p = ud;
    p->warm_wait = NULL;
    p->warm_waited = 1;
    preq_continue(p);
}

static void preq_continue(preq *p)
{
    kvr_app *app = p->app;
    /* A replica replaying the shared log routes once it knows what the others learned (a
     * brief, bounded wait: --redis-warm-hold-ms). */
    if (!p->warm_waited && kvr_cluster_holding(app->cluster) &&
        (p->warm_wait = kvr_cluster_wait_warm(app->cluster, warm_over, p)))
        return;
    kvr_route_count_request(p->route, kvr_now_ms());
    build_forward_headers(p);
    if (p->route->ops->uses_tokens && app->tokenizer && !p->fixed && fetch_tokens(p))
        return;
    route_now(p);
}

void kvr_proxy_forward(kvr_app *app, kvr_http_req *r, kvr_endpoint ep, kvr_route *route,
                       const kvr_proxy_body *body)
{
    preq *p = preq_new(app, r, ep, route, body);
    if (p)
        preq_start(p, body);
}

void kvr_proxy_forward_pinned(kvr_app *app, kvr_http_req *r, kvr_route *route, kvr_worker *w)
{
    preq *p = preq_new(app, r, KVR_EP_RESPONSES, route, NULL);
    if (!p)
        return;
    p->fixed = w;
    preq_start(p, NULL);
}

static const kvr_pd_hooks pd_hooks = {slot_take, slot_give, attempt_count};

/* No prefill worker can take the request (`reason`: none eligible, or the last failure): a
 * decode (or both) worker prefills it itself, an ordinary request there. */
static void pd_local(preq *p, const char *reason)
{
    p->pd = PD_LOCAL;
    const char *lv[] = {p->model, reason};
    kvr_metric_inc(p->app->m.pd_fallbacks, lv, 1);
    KVR_INFO("msg=\"prefilling on a decode worker\" route=%s reason=%s request_id=%s", p->model,
             reason, p->request_id);
}

static void route_now(preq *p);

static void pd_done(void *ud, kvr_pd_result *res)
{
    preq *p = ud;
    p->pd_call = NULL;
    if (p->route->pd->mode == KVR_PD_SGLANG) { /* (its attempt counted when it started) */
        /* The decode worker waits for this prefill's room: while nothing reached the client,
         * the pair starts again with another prefill worker (a new room), or, when none is
         * left, the decode worker prefills itself. */
        if (res->ok || p->status)
            return;
        p->has_bs = 0;
        p->pd_reason = res->reason;
        if (p->waiter.queued) { /* its decode has not started: it is picked again anyway */
            pd_local(p, res->reason);
            return;
        }
        if (!p->att)
            return;
        kvr_upstream_cancel(p->att);
        kvr_app_attempt_abandon(p->app, p->w, p->trial);
        p->span_err = "prefill_failed";
        attempt_ended(p, 0);
        p->ntried = 0;
        if (!res->client_error && p->npf_tried < MAX_ATTEMPTS &&
            kvr_route_retry_allowed(p->route, p->app->cfg.retry_budget, kvr_now_ms())) {
            p->pf_tried[p->npf_tried++] = res->worker->id;
            const char *lv[] = {p->model, res->reason};
            kvr_metric_inc(p->app->m.retries, lv, 1);
            p->pd = 0; /* route_now: the prefill stage again */
        } else {
            pd_local(p, res->reason);
        }
        route_now(p);
        return;
    }
    p->pf_attempts += res->attempts;
    if (!res->ok) {
        pd_local(p, res->reason);
    } else {
        p->kvtp = res->kvtp;
        p->pf_w = res->worker;
        p->pf_pick = res->pick;
        p->pd = PD_DECODE;
    }
    route_now(p);
}

/* The prefill stage of a request on a disaggregated route (proxy/pd.h). Returns 1 when the
 * request now waits for it (vLLM), 0 when routing goes on at once: to the decode side beside
 * the prefill (SGLang), or to a local prefill when no prefill worker could start. */
static int pd_begin(preq *p)
{
    size_t len;
    const char *body = kvr_http_req_body(p->req, &len);
    kvr_pd_request rq = {.app = p->app, .route = p->route, .ep = p->ep, .body = body,
                         .len = len, .client_model = p->client_model, .model = p->model,
                         .hdrs = p->fwd, .nhdrs = p->nfixed, .keys = &p->keys.k,
                         .hooks = &pd_hooks, .exclude = p->pf_tried,
                         .nexclude = p->npf_tried};
    kvr_pd_result now;
    p->pd_call = kvr_pd_call_start(&rq, pd_done, p, &now);
    if (!p->pd_call) {
        p->pf_attempts += now.attempts; /* after a failed SGLang pair, that failure is the reason */
        pd_local(p, p->pd_reason && !strcmp(now.reason, "no_prefill_worker") ? p->pd_reason
                                                                              : now.reason);
        return 0;
    }
    if (p->route->pd->mode == KVR_PD_VLLM)
        return 1;
    /* Its one attempt counts now: the decode's head, with x-kvroute-attempts, may go out
     * before the prefill answers (a stream; a decode faster than its prefill's answer). */
    p->pf_attempts++;
    p->pf_w = kvr_pd_call_worker(p->pd_call);
    p->pf_pick = *kvr_pd_call_pick(p->pd_call);
    p->bs = *kvr_pd_call_bootstrap(p->pd_call);
    p->has_bs = 1;
    p->pd = PD_DECODE;
    return 0;
}

/* Routes a request whose keys are complete: a pick now, or a place in the queue. A request of
 * a disaggregated route that generates goes through its prefill stage first. */
static void route_now(preq *p)
{
    kvr_app *app = p->app;
    /* No decode worker eligible: nothing could use a prefill, so none is made (the pick below
     * answers 503 at once, holding no KV on a prefill worker). */
    if (p->route->pd && !p->pd && !p->fixed &&
        (p->ep == KVR_EP_CHAT || p->ep == KVR_EP_COMPLETIONS) &&
        kvr_route_eligible(p->route->pd->decode, p->route->pd->decode->scratch) && pd_begin(p))
        return;
    int rc = pick_with_room(p, 1);
    if (rc < 0) {
        no_eligible(p);
        return;
    }
    /* While others wait, a newcomer queues behind them even if a slot happens to be free
     * (the dispatch runs on the next loop turn): arrival never jumps the fair order. */
    if (rc == 0 || kvr_admission_depth(app->admission)) {
        enqueue(p);
        return;
    }
    begin(p);
}

/* A slot is free for a request that has its pick: record the decision's match and start. */
static void begin(preq *p)
{
    if (shown(p)->match >= 0) {
        const char *lv[] = {p->model};
        kvr_metric_observe(p->app->m.match_ratio, lv, shown(p)->match);
    }
    start_attempt(p);
}

/* 1 when `w` runs in an engine an attempt of `p` already tried: another rank of a
 * data-parallel engine that failed is the same process behind the same port. */
static int engine_tried(const preq *p, const kvr_worker *w)
{
    for (size_t i = 0; i < p->ntried; i++)
        if (p->tried_engine[i] == w->engine)
            return 1;
    return 0;
}

/* The exclusion list of a pick: the tried workers, a disaggregated route's prefill workers
 * when the request is not prefilled elsewhere (it prefills where it decodes), then the
 * workers of the route at their max_inflight (`*nfull` of them) and the other ranks of the
 * engines already tried; returns its length. */
static size_t exclude_full(preq *p, size_t *ex, size_t cap, size_t *nfull)
{
    size_t n = p->ntried;
    memcpy(ex, p->tried, n * sizeof(*ex));
    if (p->pd != PD_DECODE)
        n = kvr_route_role_exclude(p->route, 0, ex, n, cap);
    size_t full = 0;
    const kvr_route *r = pick_route(p);
    for (size_t i = 0; i < r->ntargets && n < cap; i++) {
        const kvr_worker *w = r->targets[i].worker;
        if (r->pd && p->pd != PD_DECODE && w->role == KVR_ROLE_PREFILL)
            continue; /* already out */
        if (w->max_inflight && (uint64_t)kvr_worker_load(w) >= w->max_inflight) {
            ex[n++] = w->id;
            full++; /* room may come: the request waits for it */
        } else if (w->dp_rank >= 0 && engine_tried(p, w)) {
            ex[n++] = w->id; /* no room to wait for: the engine failed this request */
        }
    }
    *nfull = full;
    return n;
}

/* A disaggregated request prefilling on a decode worker says so, whatever picked it. */
static void local_prefill_label(preq *p)
{
    if (p->pd == PD_LOCAL)
        p->pick.decision = "pd_local_prefill";
}

/* The pick of a request only p->fixed can answer: it alone holds the stored response, so a
 * draining worker still takes it (nothing new starts there), an unhealthy one does not. */
static int pick_fixed(preq *p, int process)
{
    kvr_worker *w = p->fixed;
    const kvr_route_target *t = kvr_route_target_of(p->route, w);
    if (!t || w->removed || !kvr_worker_healthy(w) || !kvr_breaker_admits(kvr_worker_breaker(w)))
        return -1;
    if ((process && p->app->cfg.max_inflight && g_inflight >= p->app->cfg.max_inflight) ||
        (w->max_inflight && (uint64_t)kvr_worker_load(w) >= w->max_inflight))
        return 0;
    p->pick = (kvr_pick){.worker = w, .decision = "session_id_match", .match = -1,
                         .chosen_match = -1, .predicted_tokens = -1};
    p->target = t;
    return 1;
}

/* Picks among the eligible untried workers that have room (--max-inflight for the process
 * when `process` is set; each worker's max_inflight). 1: picked; 0: eligible workers exist
 * but none has room now (wait); -1: no eligible worker at all. */
static int pick_with_room(preq *p, int process)
{
    size_t ex[MAX_ATTEMPTS + 512], nfull;
    if (p->fixed)
        return pick_fixed(p, process);
    kvr_route *r = pick_route(p);
    if (kvr_route_eligible(r, r->scratch) == 0)
        return trial_pending(p, r) ? 0 : -1;
    if (process && p->app->cfg.max_inflight && g_inflight >= p->app->cfg.max_inflight)
        return 0;
    size_t n = exclude_full(p, ex, sizeof(ex) / sizeof(ex[0]), &nfull);
    int rc = kvr_route_pick(r, ex, n, &p->keys.k, p->pin, p->pin_len, &p->pick, &p->target);
    if (rc == 0)
        local_prefill_label(p);
    return rc == 0 ? 1 : nfull || trial_pending(p, r) ? 0 : -1;
}

static void overloaded(kvr_app *app, kvr_http_req *r, const char *model, const char *reason,
                       const char *msg)
{
    char ra[24];
    snprintf(ra, sizeof(ra), "%llu", (unsigned long long)app->cfg.retry_after_s);
    kvr_http_header h = {"Retry-After", 11, ra, strlen(ra)};
    const char *lv[] = {model, reason};
    kvr_metric_inc(app->m.rejected, lv, 1);
    kvr_reply_error_typed(app, r, model, 503, msg, "server_error", NULL, "overloaded", &h, 1);
}

/* 0, or -1 when the queue is full: then the request is answered 503 and freed. */
static int enqueue(preq *p)
{
    kvr_app *app = p->app;
    p->waiter.key = p->key;
    p->waiter.since_ms = kvr_now_ms();
    if (kvr_admission_push(app->admission, &p->waiter) < 0) {
        p->final_status = 503;
        overloaded(app, p->req, p->model, "queue_full",
                   "kvroute is at capacity and its queue is full; retry later");
        preq_free(p);
        return -1;
    }
    const char *lv[] = {p->model};
    kvr_metric_inc(app->m.queue_depth, lv, 1);
    schedule_dispatch(app); /* arms the timeout sweep */
    return 0;
}

/* Leaves the queue (started, timed out or client gone): depth and wait time. */
static void dequeued(preq *p)
{
    const char *lv[] = {p->model};
    kvr_metric_inc(p->app->m.queue_depth, lv, -1);
    kvr_metric_observe(p->app->m.queue_wait, lv,
                       (double)(kvr_now_ms() - p->waiter.since_ms) / 1000.0);
}

static void queue_left(preq *p)
{
    kvr_admission_remove(p->app->admission, &p->waiter);
    dequeued(p);
}

static int try_start_waiter(void *ud, kvr_waiter *w)
{
    (void)ud;
    preq *p = (preq *)((char *)w - offsetof(preq, waiter));
    int rc = pick_with_room(p, 1);
    if (rc == 0)
        return 0;
    dequeued(p);
    if (rc < 0)
        no_eligible(p);
    else
        begin(p);
    return 1;
}

static void admit_tick(uv_timer_t *t)
{
    kvr_app *app = t->data;
    uint64_t now = kvr_now_ms();
    kvr_waiter *w;
    while ((w = kvr_admission_oldest(app->admission)) &&
           now - w->since_ms >= app->cfg.queue_timeout_ms) {
        preq *p = (preq *)((char *)w - offsetof(preq, waiter));
        queue_left(p);
        p->final_status = 503;
        overloaded(app, p->req, p->model, "queue_timeout",
                   "no slot became free within the queue timeout; retry later");
        preq_free(p);
    }
    kvr_admission_dispatch(app->admission, try_start_waiter, app);
    if (!kvr_admission_depth(app->admission))
        uv_timer_stop(t);
}

static void schedule_dispatch(kvr_app *app)
{
    if (!g_admit_timer.loop) {
        uv_timer_init(app->loop, &g_admit_timer);
        g_admit_timer.data = app;
    }
    /* Now, then every 50 ms while anything waits (timeouts need no traffic to fire). */
    uv_timer_start(&g_admit_timer, admit_tick, 0, 50);
}

/* An attempt waiting for its head from an engine the health checks found down. */
static int stranded(const preq *p)
{
    return p->att && !p->status && p->w && !kvr_worker_healthy(p->w);
}

static void down_cb(uv_timer_t *t)
{
    (void)t;
    /* Each failure may free its request or start another attempt: look again from the start
     * after each one (a request retried on a healthy worker is no longer stranded). */
    for (preq *p = g_live; p;) {
        if (!stranded(p)) {
            p = p->next;
            continue;
        }
        kvr_upstream_cancel(p->att);
        on_done(p, KVR_UP_FIRST_BYTE_TIMEOUT,
                "its worker turned unhealthy (failed health checks) before answering", 0);
        p = g_live;
    }
}

void kvr_proxy_engine_down(void *ud, kvr_worker *engine)
{
    kvr_app *app = ud;
    (void)engine;
    if (!g_down_timer.loop)
        uv_timer_init(app->loop, &g_down_timer);
    uv_timer_start(&g_down_timer, down_cb, 0, 0);
}

void kvr_proxy_stop(kvr_app *app)
{
    (void)app;
    kvr_pd_detached_cancel_all();
    if (g_admit_timer.loop) {
        uv_timer_stop(&g_admit_timer);
        uv_close((uv_handle_t *)&g_admit_timer, NULL);
    }
    if (g_down_timer.loop) {
        uv_timer_stop(&g_down_timer);
        uv_close((uv_handle_t *)&g_down_timer, NULL);
    }
}

/* What a request may cost before it runs: ~4 bytes of body per prompt token, plus the
 * completion it asks for at most. Settled against its usage when it ends. */
static long long body_integer(const kvr_proxy_body *body, kvr_field which, const char *name)
{
    if (body && body->tree)
        return json_integer_value(json_object_get(body->tree, name));
    return body && body->fields ? kvr_body_integer(body->fields, which) : 0;
}

static uint64_t token_estimate(const preq *p, const kvr_proxy_body *body)
{
    size_t len;
    kvr_http_req_body(p->req, &len);
    long long mt = body_integer(body, KVR_FIELD_MAX_COMPLETION_TOKENS, "max_completion_tokens");
    if (mt <= 0)
        mt = body_integer(body, KVR_FIELD_MAX_TOKENS, "max_tokens");
    return len / 4 + (mt > 0 ? (uint64_t)mt : 0);
}

/* Per-key limits: a refused request gets 429 with Retry-After and the x-ratelimit-* headers.
 * Returns 1 when it was answered. */
static int over_rate_limit(preq *p, const kvr_proxy_body *body)
{
    kvr_app *app = p->app;
    p->rl_tokens = token_estimate(p, body);
    if (!kvr_ratelimit_take(app->ratelimits, p->key, p->rl_tokens, kvr_now_ms(), &p->rl))
        return 0;
    reply_rate_limited(p);
    return 1;
}

static void reply_rate_limited(preq *p)
{
    kvr_app *app = p->app;
    kvr_http_header h[8];
    char ra[24];
    snprintf(ra, sizeof(ra), "%llu", (unsigned long long)p->rl.retry_after_s);
    h[0] = (kvr_http_header){"Retry-After", 11, ra, strlen(ra)};
    size_t n = 1 + ratelimit_headers(p, h + 1);
    const char *lv[] = {p->model, "rate_limited"};
    kvr_metric_inc(app->m.rejected, lv, 1);
    p->final_status = 429;
    kvr_reply_error_typed(app, p->req, p->model, 429,
                          "Rate limit reached for this API key; retry after the Retry-After "
                          "delay",
                          "requests", NULL, "rate_limit_exceeded", h, n);
    p->rl.limited = 0;
    preq_free(p);
}

/* The body for the current target: the client's bytes, or a copy whose `model` value names
 * the target's upstream model (everything else byte-identical). */
static const char *attempt_body(preq *p, size_t *len)
{
    const char *body = kvr_http_req_body(p->req, len);
    kvr_body_edit e[KVR_PD_MAX_EDITS + 1];
    size_t n = 0;
    char *enc;
    if (p->kvtp) /* vLLM's decode: the prefill's blocks to fetch */
        n += kvr_pd_vllm_decode_edits(p->kvtp, strlen(p->kvtp), e + n);
    if (p->has_bs) /* SGLang's decode: the prefill's bootstrap room */
        n += kvr_pd_sglang_edits(&p->bs, e + n);
    int m = kvr_body_edit_model(p->target->model, p->client_model, &enc, &e[n]);
    if (m < 0)
        return NULL;
    n += (size_t)m;
    if (!n)
        return body;
    int rc = kvr_body_edit_apply(body, *len, e, n, &p->body_rw);
    free(enc);
    if (rc < 0)
        return NULL;
    *len = p->body_rw.len;
    return p->body_rw.data;
}

/* Starts an attempt on p->pick.worker. Returns 1 when started; otherwise the request has been
 * answered (502) and freed, and 0 is returned. */
static int start_attempt(preq *p)
{
    size_t blen;
    attempt_span_close(p); /* the attempt this one replaces */
    p->w = p->pick.worker;
    p->tried_engine[p->ntried] = p->w->engine;
    p->tried[p->ntried++] = p->w->id;
    const char *body = attempt_body(p, &blen);
    /* A stored response's path carries its id and query: forwarded as the client sent it. */
    const char *path = p->fixed ? kvr_http_req_target(p->req) : kvr_endpoint_path(p->ep);
    if (!body || kvr_worker_url(p->w, path, p->url, sizeof(p->url)) < 0) {
        count_decision(p);
        p->final_status = 500;
        kvr_reply_error(p->app, p->req, p->model, 500,
                        body ? "worker URL too long" : "out of memory", NULL, NULL, NULL, 0);
        preq_free(p);
        return 0;
    }
    slot_take(p->w);
    p->unsettled = p->w->prefilling > 0;
    p->trial = kvr_app_attempt_start(p->app, p->w);
    p->verdict = 0;
    const char *method = p->fixed ? kvr_http_req_method(p->req) : "POST";
    p->span_open = p->tr.on;
    if (p->tr.on)
        kvr_trace_attempt(&p->tr);
    p->att_start_ns = kvr_now_ns();
    p->att_end_ns = 0;
    p->span_code = 0;
    p->span_err = NULL;
    p->span_decision = p->pick.decision;
    p->span_match = p->pick.match;
    p->att = kvr_upstream_start(p->app->up, method, p->url, p->fwd, attempt_headers(p), body,
                                blen, &upstream_cbs, p);
    if (p->att) {
        if (teaches(p)) {
            kvr_route_sent(p->route, p->w, &p->keys.k);
            prefill_open(p);
        }
        kvr_kv_events_served(p->app->kv, p->w);
    } else {
        kvr_app_attempt_abandon(p->app, p->w, p->trial);
        slot_give(p->app, p->w);
        p->span_err = "not_started";
        p->att_end_ns = kvr_now_ns();
        count_error(p, KVR_UP_OTHER);
        count_decision(p);
        p->final_status = 502;
        kvr_reply_error(p->app, p->req, p->model, 502, "could not start the upstream request",
                      NULL, "upstream_error", NULL, 0);
        preq_free(p);
        return 0;
    }
    return 1;
}

size_t kvr_proxy_shutdown(kvr_app *app)
{
    size_t n = 0;
    const char *why = "kvroute is shutting down: the drain timeout passed before the worker "
                      "finished";
    while (g_live) {
        preq *p = g_live;
        n++;
        if (p->waiter.queued)
            queue_left(p);
        if (p->att) {
            kvr_upstream_cancel(p->att);
            kvr_app_attempt_abandon(app, p->w, p->trial);
            p->span_code = p->status;
            p->span_err = "shutting_down";
            attempt_ended(p, p->status);
        }
        count_decision(p);
        if (!p->status) {
            p->final_status = 503;
            kvr_reply_error(app, p->req, p->model, 503, why, NULL, "shutting_down", NULL, 0);
            preq_free(p);
        } else {
            end_after_headers(p, 503, why, "shutting_down");
        }
    }
    return n;
}
