/* Prefill/decode emulation: holds, the transfer endpoint, and the decode's fetch. */
#include "pd.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"
#include "upstream/upstream.h"
#include "util/log.h"
#include "util/oai_error.h"
#include "util/time.h"
#include "workers/fetch.h"
#include "kvhold.h"

/* A transfer request waiting for its KV (SGLang's decode asks before the prefill is done). */
typedef struct waiter {
    kvr_sim_pd *pd;
    kvr_http_req *req;
    char *key;
    uint64_t deadline_ms;
    struct waiter *next;
} waiter;

struct kvr_sim_pd {
    uv_loop_t *loop;
    kvr_sim_pd_cfg cfg;
    char host[64];
    int port;
    kvr_sim_faults *faults;
    kvr_sim_hold *holds;
    kvr_upstream *up; /* created at the first fetch */
    uv_timer_t tick;  /* next hold expiry or waiter deadline */
    int closed;
    waiter *waiters;
    kvr_metric *xfer_blocks, *xfers, *recomputed, *held_blocks, *held_reqs, *holds_total,
        *dropped;
};

static const char *const roles[] = {"both", "prefill", "decode"};

const char *kvr_sim_role_name(kvr_sim_role r)
{
    return r <= KVR_SIM_ROLE_DECODE ? roles[r] : "?";
}

static void count(kvr_metric *m, const char *label, double v)
{
    const char *lv[1] = {label};
    kvr_metric_inc(m, label ? lv : NULL, v);
}

static void on_render(void *ud)
{
    kvr_sim_pd *pd = ud;
    kvr_metric_set(pd->held_blocks, NULL, (double)kvr_sim_hold_blocks(pd->holds));
    kvr_metric_set(pd->held_reqs, NULL, (double)kvr_sim_hold_count(pd->holds));
}

kvr_sim_pd *kvr_sim_pd_new(uv_loop_t *loop, const kvr_sim_pd_cfg *cfg, kvr_metrics *reg,
                           kvr_sim_faults *faults)
{
    kvr_sim_pd *pd = calloc(1, sizeof(*pd));
    if (!pd)
        return NULL;
    pd->holds = kvr_sim_hold_new(cfg->hold_max);
    if (!pd->holds) {
        free(pd);
        return NULL;
    }
    pd->loop = loop;
    pd->cfg = *cfg;
    pd->faults = faults;
    const char *h = cfg->host && *cfg->host ? cfg->host : "127.0.0.1";
    if (strcmp(h, "0.0.0.0") == 0 || strcmp(h, "::") == 0 || strlen(h) >= sizeof(pd->host))
        h = "127.0.0.1";
    snprintf(pd->host, sizeof(pd->host), "%s", h);
    pd->cfg.host = pd->host;
    uv_timer_init(loop, &pd->tick);
    pd->tick.data = pd;
    static const char *const result[] = {"result"}, *const outcome[] = {"outcome"};
    pd->xfer_blocks = kvr_metrics_counter(
        reg, "kvroute_sim:kv_transfer_blocks_total",
        "KV blocks a decode fetched from its prefill (fetched) or was told of but did not get "
        "(failed).", 1, result);
    pd->xfers = kvr_metrics_counter(reg, "kvroute_sim:kv_transfers_total",
                                    "Decode requests whose KV transfer succeeded or failed.", 1,
                                    result);
    pd->recomputed = kvr_metrics_counter(
        reg, "kvroute_sim:kv_recomputed_requests_total",
        "Decode requests that recomputed their prompt after a failed KV transfer (vLLM's "
        "recompute policy).", 0, NULL);
    pd->held_blocks = kvr_metrics_gauge(reg, "kvroute_sim:kv_held_blocks",
                                        "KV blocks a prefill holds for decodes to fetch.", 0,
                                        NULL);
    pd->held_reqs = kvr_metrics_gauge(reg, "kvroute_sim:kv_held_requests",
                                      "Requests whose KV a prefill holds for a decode.", 0, NULL);
    pd->holds_total = kvr_metrics_counter(
        reg, "kvroute_sim:kv_holds_total",
        "Prefill holds ended: fetched, expired (--kv-hold-ms), evicted (--kv-hold-max-requests) "
        "or failed (fault).", 1, outcome);
    pd->dropped = kvr_metrics_counter(
        reg, "kvroute_sim:kv_params_dropped_total",
        "Prefill answers sent without kv_transfer_params (fault kv_params_drop_rate).", 0, NULL);
    static const char *const names[] = {"fetched", "failed"};
    for (size_t i = 0; i < 2; i++) {
        count(pd->xfer_blocks, names[i], 0);
        count(pd->xfers, names[i], 0);
    }
    static const char *const outs[] = {"fetched", "expired", "evicted", "failed"};
    for (size_t i = 0; i < 4; i++)
        count(pd->holds_total, outs[i], 0);
    kvr_metrics_on_render(reg, on_render, pd);
    return pd;
}

kvr_sim_role kvr_sim_pd_role(const kvr_sim_pd *pd)
{
    return pd->cfg.role;
}

void kvr_sim_pd_set_port(kvr_sim_pd *pd, int port)
{
    pd->port = port;
}

kvr_sim_pd_part kvr_sim_pd_part_of(const kvr_sim_pd *pd, const kvr_sim_xfer_params *p)
{
    kvr_sim_role role = pd->cfg.role;
    if (p->do_remote_decode && role != KVR_SIM_ROLE_DECODE)
        return KVR_SIM_PD_PREFILL;
    if (p->do_remote_prefill && role != KVR_SIM_ROLE_PREFILL)
        return KVR_SIM_PD_DECODE;
    if (!p->has_room)
        return KVR_SIM_PD_NONE;
    /* SGLang sends both workers the same fields; a `both` sim is the prefill when the
     * handshake address is its own bootstrap port, the decode otherwise */
    if (role == KVR_SIM_ROLE_BOTH)
        return pd->cfg.bootstrap_port && p->bootstrap_port == pd->cfg.bootstrap_port
                   ? KVR_SIM_PD_PREFILL
                   : KVR_SIM_PD_DECODE;
    return role == KVR_SIM_ROLE_PREFILL ? KVR_SIM_PD_PREFILL : KVR_SIM_PD_DECODE;
}

/* ---- holds and their expiry ---- */

static void on_tick(uv_timer_t *t);

/* Sets the timer for the next hold expiry or waiter deadline. */
static void arm(kvr_sim_pd *pd)
{
    if (pd->closed)
        return;
    uint64_t next = kvr_sim_hold_next_expiry(pd->holds);
    for (waiter *w = pd->waiters; w; w = w->next)
        if (w->deadline_ms < next)
            next = w->deadline_ms;
    if (next == UINT64_MAX) {
        uv_timer_stop(&pd->tick);
        return;
    }
    uint64_t now = kvr_now_ms();
    uv_timer_start(&pd->tick, on_tick, next > now ? next - now : 0, 0);
}

static void room_key(char *out, size_t cap, uint64_t room)
{
    snprintf(out, cap, "room:%llu", (unsigned long long)room);
}

static void engine_id(char *out, size_t cap, const kvr_sim_pd *pd, int rank)
{
    snprintf(out, cap, "kvroute-sim-%s-%d-dp%d", pd->host, pd->port, rank);
}

static void reply_error(kvr_http_req *req, int status, const char *msg)
{
    kvr_buf b;
    kvr_buf_init(&b, 0);
    if (kvr_error_json_for(&b, kvr_http_req_path(req), status, NULL, msg, NULL, NULL) < 0)
        kvr_buf_reset(&b);
    kvr_http_resp_simple(req, status, "application/json", NULL, 0, b.data ? b.data : "", b.len);
    kvr_buf_free(&b);
}

/* Answers a transfer request from the hold under `key` (which then ends). */
static void answer(kvr_sim_pd *pd, kvr_http_req *req, const char *key)
{
    const kvr_sim_hold_entry *e = kvr_sim_hold_get(pd->holds, key);
    if (kvr_sim_faults_draw(pd->faults->kv_transfer_fail_rate)) {
        KVR_WARN("msg=\"kv transfer refused (fault kv_transfer_fail_rate)\" key=\"%s\" "
                 "blocks=%zu", key, e->n);
        kvr_sim_hold_release(pd->holds, key);
        count(pd->holds_total, "failed", 1);
        reply_error(req, 500, "injected KV transfer failure (kvroute-sim --kv-transfer-fail-rate)");
        return;
    }
    kvr_buf b;
    kvr_buf_init(&b, 0);
    char eid[128];
    engine_id(eid, sizeof(eid), pd, e->rank);
    int rc = kvr_sim_xfer_write(&b, key, eid, kvr_sim_kv_block_size(e->kv), e->blocks, e->n,
                                e->tokens);
    KVR_INFO("msg=\"kv transfer served\" key=\"%s\" blocks=%zu rank=%d", key, e->n, e->rank);
    kvr_sim_hold_release(pd->holds, key);
    count(pd->holds_total, "fetched", 1);
    if (rc == 0)
        kvr_http_resp_simple(req, 200, "application/json", NULL, 0, b.data, b.len);
    else
        reply_error(req, 503, "out of memory");
    kvr_buf_free(&b);
}

static void unlink_waiter(kvr_sim_pd *pd, waiter *w)
{
    for (waiter **pp = &pd->waiters; *pp; pp = &(*pp)->next)
        if (*pp == w) {
            *pp = w->next;
            break;
        }
    free(w->key);
    free(w);
}

static void waiter_gone(void *ud)
{
    waiter *w = ud;
    kvr_http_resp_abort(w->req);
    unlink_waiter(w->pd, w);
}

/* Answers the waiters of `key` now that its hold exists. */
static void wake(kvr_sim_pd *pd, const char *key)
{
    for (waiter *w = pd->waiters, *next; w; w = next) {
        next = w->next;
        if (strcmp(w->key, key) != 0)
            continue;
        if (kvr_sim_hold_get(pd->holds, key))
            answer(pd, w->req, key);
        else
            reply_error(w->req, 404, "the KV was already fetched");
        unlink_waiter(pd, w);
    }
}

static void on_tick(uv_timer_t *t)
{
    kvr_sim_pd *pd = t->data;
    uint64_t now = kvr_now_ms();
    size_t n = kvr_sim_hold_expire(pd->holds, now);
    if (n) {
        count(pd->holds_total, "expired", (double)n);
        KVR_INFO("msg=\"kv holds expired\" count=%zu hold_ms=%llu", n,
                 (unsigned long long)pd->cfg.hold_ms);
    }
    for (waiter *w = pd->waiters, *next; w; w = next) {
        next = w->next;
        if (w->deadline_ms > now)
            continue;
        reply_error(w->req, 404, "no KV held under this id within wait_ms");
        unlink_waiter(pd, w);
    }
    arm(pd);
}

long kvr_sim_pd_hold(kvr_sim_pd *pd, const kvr_sim_xfer_params *p, const char *request_id,
                     const kvr_sim_engine *e, const uint32_t *prompt, size_t ntok,
                     kvr_buf *params_out)
{
    int bootstrap = !p->do_remote_decode;
    char key[KVR_SIM_XFER_STR + 32];
    if (bootstrap)
        room_key(key, sizeof(key), p->room);
    else
        snprintf(key, sizeof(key), "%s", request_id);
    if (kvr_sim_faults_draw(pd->faults->kv_params_drop_rate)) {
        count(pd->dropped, NULL, 1);
        KVR_WARN("msg=\"kv_transfer_params dropped (fault kv_params_drop_rate)\" key=\"%s\"",
                 key);
        return -2;
    }
    uint32_t bs = kvr_sim_kv_block_size(e->kv);
    size_t nfull = ntok / bs;
    uint64_t *hashes = malloc((nfull ? nfull : 1) * sizeof(*hashes));
    uint32_t *blocks = malloc((nfull ? nfull : 1) * sizeof(*blocks));
    long rc = -1;
    if (!hashes || !blocks)
        goto out;
    uint64_t parent = kvr_sim_kv_root_hash(e->kv);
    for (size_t i = 0; i < nfull; i++)
        parent = hashes[i] = kvr_sim_kv_hash_block(e->kv, parent, prompt + i * bs);
    /* the running sequence holds every full prompt block, cached since its prefill step */
    size_t k = kvr_sim_kv_longest_hit(e->kv, hashes, nfull, blocks);
    if (kvr_sim_hold_put(pd->holds, key, e->kv, e->rank, blocks, k, prompt,
                         kvr_now_ms() + pd->cfg.hold_ms) < 0)
        goto out;
    KVR_INFO("msg=\"kv held for decode\" key=\"%s\" blocks=%zu rank=%d hold_ms=%llu", key, k,
             e->rank, (unsigned long long)pd->cfg.hold_ms);
    rc = (long)k;
    if (!bootstrap && params_out) {
        char eid[128], port[16], tmp[16];
        engine_id(eid, sizeof(eid), pd, e->rank);
        snprintf(port, sizeof(port), "%d", pd->port);
        json_t *rid = json_string(key);
        char *rids = rid ? json_dumps(rid, JSON_ENCODE_ANY) : NULL;
        json_decref(rid);
        int w = kvr_buf_puts(params_out, "{\"do_remote_prefill\":true,\"do_remote_decode\":false,"
                                         "\"remote_engine_id\":\"");
        w |= kvr_buf_puts(params_out, eid);
        w |= kvr_buf_puts(params_out, "\",\"remote_block_ids\":[");
        for (size_t i = 0; i < k; i++) {
            int n = snprintf(tmp, sizeof(tmp), i ? ",%u" : "%u", blocks[i]);
            w |= kvr_buf_append(params_out, tmp, (size_t)n);
        }
        w |= kvr_buf_puts(params_out, "],\"remote_host\":\"");
        w |= kvr_buf_puts(params_out, pd->host);
        w |= kvr_buf_puts(params_out, "\",\"remote_port\":");
        w |= kvr_buf_puts(params_out, port);
        w |= kvr_buf_puts(params_out, ",\"remote_request_id\":");
        w |= rids ? kvr_buf_puts(params_out, rids) : -1;
        w |= kvr_buf_puts(params_out, ",\"tp_size\":1}");
        free(rids);
        if (w)
            kvr_buf_reset(params_out);
    }
    wake(pd, key);
    arm(pd);
out:
    free(hashes);
    free(blocks);
    return rc;
}

/* ?wait_ms=N from the request target, capped; 0 when absent or malformed. */
static uint64_t wait_ms_of(const kvr_sim_pd *pd, kvr_http_req *req)
{
    const char *q = strchr(kvr_http_req_target(req), '?');
    const char *w = q ? strstr(q, "wait_ms=") : NULL;
    if (!w || (w[-1] != '?' && w[-1] != '&'))
        return 0;
    char *end;
    unsigned long long v = strtoull(w + 8, &end, 10);
    if (end == w + 8)
        return 0;
    return v < pd->cfg.transfer_timeout_ms ? v : pd->cfg.transfer_timeout_ms;
}

void kvr_sim_pd_serve(kvr_sim_pd *pd, kvr_http_req *req, const char *segment, int bootstrap)
{
    char raw[KVR_SIM_XFER_STR], key[KVR_SIM_XFER_STR + 32];
    if (kvr_sim_xfer_unescape(segment, raw, sizeof(raw)) < 0 || !*raw) {
        reply_error(req, 400, "bad transfer id");
        return;
    }
    if (bootstrap) {
        char *end;
        unsigned long long room = strtoull(raw, &end, 10);
        if (*end || raw[0] == '-' || raw[0] == '+') {
            reply_error(req, 400, "the bootstrap room must be a non-negative integer");
            return;
        }
        room_key(key, sizeof(key), room);
    } else {
        snprintf(key, sizeof(key), "%s", raw);
    }
    if (kvr_sim_hold_get(pd->holds, key)) {
        answer(pd, req, key);
        return;
    }
    uint64_t wait = wait_ms_of(pd, req);
    waiter *w = wait && !pd->closed ? calloc(1, sizeof(*w)) : NULL;
    if (w)
        w->key = strdup(key);
    if (!w || !w->key) {
        if (w)
            free(w);
        reply_error(req, 404, "no KV held under this id (never held, fetched, or expired)");
        return;
    }
    w->pd = pd;
    w->req = req;
    w->deadline_ms = kvr_now_ms() + wait;
    w->next = pd->waiters;
    pd->waiters = w;
    kvr_http_req_cbs cbs = {NULL, waiter_gone};
    kvr_http_req_set_cbs(req, &cbs, w);
    arm(pd);
}

/* ---- the decode's fetch ---- */

struct kvr_sim_pd_fetch {
    kvr_sim_pd *pd;
    kvr_sim_engine *e;
    uint32_t *prompt;
    size_t ntok;
    char request_id[KVR_SIM_XFER_STR];
    uint32_t *expect; /* remote_block_ids, or NULL */
    size_t nexpect;
    uv_timer_t timer; /* the transfer time, and the deferral of every result */
    kvr_sim_pd_done done;
    void *ud;
    int in_flight;    /* the HTTP fetch has not called back */
    int ended;        /* kvr_sim_pd_fetch_end() was called */
    int reported;     /* `done` ran */
    uint32_t *held;   /* blocks held in e->kv for the request */
    size_t nheld;
    kvr_sim_pd_result res;
    char reason[200];
    uint64_t start_ns;
};

static void fetch_closed(uv_handle_t *h)
{
    kvr_sim_pd_fetch *f = h->data;
    free(f->prompt);
    free(f->expect);
    free(f->held);
    free(f);
}

static void fetch_free(kvr_sim_pd_fetch *f)
{
    if (f->held)
        kvr_sim_kv_release(f->e->kv, f->held, f->nheld);
    f->nheld = 0;
    uv_timer_stop(&f->timer);
    uv_close((uv_handle_t *)&f->timer, fetch_closed);
}

static void on_report(uv_timer_t *t)
{
    kvr_sim_pd_fetch *f = t->data;
    f->reported = 1;
    f->done(f->ud, &f->res);
}

/* Records the outcome and reports it after `delay_ms`. */
static void settle(kvr_sim_pd_fetch *f, uint64_t delay_ms)
{
    kvr_sim_pd *pd = f->pd;
    const char *res = f->res.fetched ? "fetched" : "failed";
    count(pd->xfer_blocks, res, (double)f->res.blocks);
    count(pd->xfers, res, 1);
    if (f->res.fetched) {
        KVR_INFO("msg=\"kv transfer\" request_id=\"%s\" result=fetched blocks=%zu rank=%d "
                 "transfer_ms=%llu", f->request_id, f->res.blocks, f->e->rank,
                 (unsigned long long)delay_ms);
    } else {
        count(pd->recomputed, NULL, 1);
        KVR_WARN("msg=\"kv transfer failed, recomputing the prompt\" request_id=\"%s\" "
                 "result=failed blocks=%zu reason=\"%s\" recompute=true",
                 f->request_id, f->res.blocks, f->reason);
    }
    uv_timer_start(&f->timer, on_report, delay_ms, 0);
}

/* The fetch failed for the reason already written to f->reason. */
static void failed(kvr_sim_pd_fetch *f)
{
    f->res = (kvr_sim_pd_result){.fetched = 0, .blocks = f->nexpect, .reason = f->reason};
    settle(f, 0);
}

/* Caches the fetched blocks in the rank's pool as computed ones and holds them (with any the
 * pool already had) for the request. Returns 0, or -1 when the pool has no room. */
static int install(kvr_sim_pd_fetch *f, const kvr_sim_xfer_blocks *b)
{
    kvr_sim_kv *kv = f->e->kv;
    uint32_t bs = b->block_size;
    size_t n = b->n;
    uint64_t *h = malloc((n ? n : 1) * sizeof(*h));
    f->held = malloc((n ? n : 1) * sizeof(uint32_t));
    if (!h || !f->held) {
        free(h);
        return -1;
    }
    uint64_t parent = kvr_sim_kv_root_hash(kv);
    for (size_t i = 0; i < n; i++)
        parent = h[i] = kvr_sim_kv_hash_block(kv, parent, b->tokens + i * bs);
    size_t k = kvr_sim_kv_longest_hit(kv, h, n, f->held);
    kvr_sim_kv_touch(kv, f->held, k);
    if (kvr_sim_kv_alloc(kv, n - k, f->held + k) < 0) {
        kvr_sim_kv_release(kv, f->held, k);
        free(h);
        return -1;
    }
    if (n > k)
        kvr_sim_kv_cache(kv, f->held + k, h + k, n - k, k > 0, k ? h[k - 1] : 0,
                         b->tokens + k * bs);
    f->nheld = n;
    free(h);
    return 0;
}

static void on_fetched(void *ud, int status, const char *body, size_t len, int truncated,
                       kvr_upstream_err err)
{
    kvr_sim_pd_fetch *f = ud;
    f->in_flight = 0;
    if (f->ended) {
        fetch_free(f);
        return;
    }
    if (status == 0) {
        snprintf(f->reason, sizeof(f->reason), "no answer from the prefill (%s)",
                 kvr_upstream_err_name(err));
        failed(f);
        return;
    }
    if (status != 200) {
        json_t *j = json_loadb(body, len, 0, NULL);
        const char *m = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
        char msg[120];
        snprintf(msg, sizeof(msg), "%s", m ? m : "");
        json_decref(j);
        snprintf(f->reason, sizeof(f->reason), "the prefill answered %d: %s", status, msg);
        failed(f);
        return;
    }
    kvr_sim_xfer_blocks b;
    char why[160];
    uint32_t bs = kvr_sim_kv_block_size(f->e->kv);
    if (truncated) {
        snprintf(f->reason, sizeof(f->reason), "transfer answer too large");
        failed(f);
        return;
    }
    if (kvr_sim_xfer_parse(body, len, bs, f->pd->cfg.max_blocks, KVR_SIM_VOCAB, &b, why,
                           sizeof(why)) < 0) {
        snprintf(f->reason, sizeof(f->reason), "bad transfer answer: %s", why);
        failed(f);
        return;
    }
    if (f->expect && (b.n != f->nexpect ||
                      memcmp(b.block_ids, f->expect, b.n * sizeof(uint32_t)) != 0)) {
        snprintf(f->reason, sizeof(f->reason), "the %zu blocks sent are not remote_block_ids",
                 b.n);
        kvr_sim_xfer_blocks_free(&b);
        failed(f);
        return;
    }
    if (b.n * bs > f->ntok || memcmp(b.tokens, f->prompt, b.n * bs * sizeof(uint32_t)) != 0) {
        snprintf(f->reason, sizeof(f->reason), "the %zu blocks sent are not this prompt's KV",
                 b.n);
        kvr_sim_xfer_blocks_free(&b);
        failed(f);
        return;
    }
    if (install(f, &b) < 0) {
        snprintf(f->reason, sizeof(f->reason), "no free KV blocks for the %zu blocks sent",
                 b.n);
        kvr_sim_xfer_blocks_free(&b);
        failed(f);
        return;
    }
    f->res = (kvr_sim_pd_result){.fetched = 1, .blocks = b.n};
    kvr_sim_xfer_blocks_free(&b);
    /* the transfer takes blocks × µs per block (model time, scaled); the HTTP round trip
     * already spent counts towards it */
    double want_us = (double)f->res.blocks * f->pd->cfg.transfer_us_per_block *
                     f->pd->cfg.time_scale;
    double spent_us = (double)(kvr_now_ns() - f->start_ns) / 1e3;
    settle(f, want_us > spent_us ? (uint64_t)ceil((want_us - spent_us) / 1e3) : 0);
}

kvr_sim_pd_fetch *kvr_sim_pd_fetch_start(kvr_sim_pd *pd, const kvr_sim_xfer_params *p,
                                         const char *request_id, kvr_sim_engine *e,
                                         const uint32_t *prompt, size_t ntok,
                                         kvr_sim_pd_done done, void *ud)
{
    kvr_sim_pd_fetch *f = calloc(1, sizeof(*f));
    if (!f)
        return NULL;
    f->prompt = malloc((ntok ? ntok : 1) * sizeof(uint32_t));
    if (p->remote_block_ids)
        f->expect = malloc((p->nremote_block_ids ? p->nremote_block_ids : 1) * sizeof(uint32_t));
    if (!f->prompt || (p->remote_block_ids && !f->expect)) {
        free(f->prompt);
        free(f->expect);
        free(f);
        return NULL;
    }
    memcpy(f->prompt, prompt, ntok * sizeof(uint32_t));
    f->ntok = ntok;
    if (f->expect) {
        memcpy(f->expect, p->remote_block_ids, p->nremote_block_ids * sizeof(uint32_t));
        f->nexpect = p->nremote_block_ids;
    }
    f->pd = pd;
    f->e = e;
    f->done = done;
    f->ud = ud;
    f->start_ns = kvr_now_ns();
    snprintf(f->request_id, sizeof(f->request_id), "%s", request_id ? request_id : "");
    uv_timer_init(pd->loop, &f->timer);
    f->timer.data = f;

    char url[8 * KVR_SIM_XFER_STR], seg[3 * KVR_SIM_XFER_STR];
    uint64_t timeout = pd->cfg.transfer_timeout_ms;
    if (p->do_remote_prefill) {
        if (!*p->remote_host || !p->remote_port || !*p->remote_request_id) {
            snprintf(f->reason, sizeof(f->reason),
                     "kv_transfer_params lack remote_host, remote_port or remote_request_id");
            failed(f);
            return f;
        }
        if (kvr_sim_xfer_escape(p->remote_request_id, seg, sizeof(seg)) < 0) {
            snprintf(f->reason, sizeof(f->reason), "remote_request_id too long");
            failed(f);
            return f;
        }
        snprintf(url, sizeof(url), "http://%s%s%s:%d/sim/kv_transfer/%s",
                 strchr(p->remote_host, ':') ? "[" : "", p->remote_host,
                 strchr(p->remote_host, ':') ? "]" : "", p->remote_port, seg);
    } else {
        if (!*p->bootstrap_host || !p->bootstrap_port || !p->has_room) {
            snprintf(f->reason, sizeof(f->reason),
                     "bootstrap_host, bootstrap_port and bootstrap_room are needed");
            failed(f);
            return f;
        }
        /* the prefill may not have computed the room yet: it answers once it has, within
         * the wait; the fetch's own deadline leaves room for the answer itself */
        snprintf(url, sizeof(url), "http://%s%s%s:%d/sim/bootstrap/%llu?wait_ms=%llu",
                 strchr(p->bootstrap_host, ':') ? "[" : "", p->bootstrap_host,
                 strchr(p->bootstrap_host, ':') ? "]" : "", p->bootstrap_port,
                 (unsigned long long)p->room, (unsigned long long)timeout);
        timeout += 1000;
    }
    if (kvr_sim_faults_draw(pd->faults->kv_transfer_fail_rate)) {
        snprintf(f->reason, sizeof(f->reason), "injected transfer failure (--kv-transfer-fail-rate)");
        failed(f);
        return f;
    }
    if (!pd->up) {
        kvr_upstream_opts o;
        kvr_upstream_opts_default(&o);
        pd->up = kvr_upstream_new(pd->loop, &o);
    }
    /* a prompt of max_blocks blocks: ~8 bytes per token id */
    size_t cap = (size_t)pd->cfg.max_blocks * kvr_sim_kv_block_size(e->kv) * 12 + 65536;
    if (pd->closed || kvr_fetch(pd->loop, pd->up, url, NULL, cap, timeout, on_fetched, f) < 0) {
        snprintf(f->reason, sizeof(f->reason), "cannot start the fetch of %.150s", url);
        failed(f);
        return f;
    }
    f->in_flight = 1;
    return f;
}

void kvr_sim_pd_fetch_end(kvr_sim_pd_fetch *f)
{
    if (!f)
        return;
    f->ended = 1;
    if (!f->in_flight)
        fetch_free(f); /* on_fetched frees it otherwise */
}

void kvr_sim_pd_close(kvr_sim_pd *pd)
{
    if (pd->closed)
        return;
    pd->closed = 1;
    kvr_fetch_cancel_all();
    while (pd->waiters) {
        waiter *w = pd->waiters;
        reply_error(w->req, 503, "kvroute-sim is stopping");
        unlink_waiter(pd, w);
    }
    uv_timer_stop(&pd->tick);
    uv_close((uv_handle_t *)&pd->tick, NULL);
    if (pd->up)
        kvr_upstream_close(pd->up);
    pd->up = NULL;
}

void kvr_sim_pd_free(kvr_sim_pd *pd)
{
    if (!pd)
        return;
    kvr_sim_hold_free(pd->holds);
    free(pd);
}
