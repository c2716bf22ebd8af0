/* KV events on the loop thread: endpoint resolution under the egress policy, applying the
 * ingest thread's ops to the KV block index, trust states, metrics. See kvevents.h. */
#include "events/kvevents.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"
#include "util/time.h"

#define RESOLVE_RETRY_MS 5000
#define SWEEP_PER_TICK 100000

typedef struct wrec {
    int configured;
    char *url;                  /* the worker label */
    char *ep, *rep, *topic;     /* as configured */
    int rank, ranks;            /* a data-parallel rank on its engine's shared endpoint
                                   (ranks > 1): only its batches apply */
    char *lit[2];               /* resolved endpoints (sub, replay) */
    uint64_t gen;               /* ingest subscription, 0 = none */
    uint64_t epoch;             /* resolutions of an older spec are ignored */
    kvr_kv_trust trust;
    int partial;                /* its history before its replay buffer is unknown */
    uint64_t last_event_ms;
    uint64_t served;            /* requests sent since the last event */
    uint64_t first_served_ms;   /* when the first of them was sent */
    uint64_t retry_at;          /* resolution failed: try again then (0 = not waiting) */
    kvr_kv_stream_stats base;   /* counters of earlier subscriptions, so totals only grow */
    const kvr_worker *w;        /* borrowed while configured (for the block size cross-check) */
    uint32_t warned_bs;         /* event block size already reported as disagreeing */
} wrec;

struct kvr_kv_events {
    uv_loop_t *loop;
    kvr_kv_events_cfg cfg;
    kvr_kv_ingest *ing;
    kvr_kv_index *index;
    kvr_kv_allow_fn allow;
    void *allow_ud;
    wrec *w;                    /* by worker id */
    size_t nw;
    size_t resolving;           /* resolutions in flight (they hold `ev`) */
    int closing;
    kvr_metric *m_state, *m_events, *m_gaps, *m_replays, *m_malformed, *m_skipped, *m_dropped;
};

typedef struct resolve {
    uv_getaddrinfo_t req;
    kvr_kv_events *ev;
    size_t worker;
    uint64_t epoch;
    int which;                  /* 0 sub, 1 replay */
    char *url;
} resolve;

void kvr_kv_events_cfg_default(kvr_kv_events_cfg *c)
{
    kvr_kv_ingest_cfg_default(&c->ingest);
    c->max_blocks = 4000000;
    c->stale_ms = 10000;
    c->speculative_ms = 2000;
}

static wrec *rec(kvr_kv_events *ev, size_t id, int create)
{
    if (id < ev->nw)
        return &ev->w[id];
    if (!create || id >= KVR_KV_INDEX_MAX_WORKER_ID)
        return NULL;
    size_t n = ev->nw ? ev->nw : 16;
    while (n <= id)
        n *= 2;
    wrec *p = realloc(ev->w, n * sizeof(*p));
    if (!p)
        return NULL;
    memset(p + ev->nw, 0, (n - ev->nw) * sizeof(*p));
    for (size_t i = ev->nw; i < n; i++)
        p[i].trust = KVR_KV_FALLBACK;
    ev->w = p;
    ev->nw = n;
    return &ev->w[id];
}

static void free_spec(wrec *r)
{
    free(r->ep);
    free(r->rep);
    free(r->topic);
    free(r->lit[0]);
    free(r->lit[1]);
    r->ep = r->rep = r->topic = r->lit[0] = r->lit[1] = NULL;
}

static void add_stats(kvr_kv_stream_stats *a, const kvr_kv_stream_stats *b)
{
    a->gaps += b->gaps;
    a->malformed += b->malformed;
    a->overflows += b->overflows;
    for (int i = 0; i < KVR_KV_REPLAY_NRESULTS; i++)
        a->replays[i] += b->replays[i];
}

/* Ends the current subscription, keeping its counters. */
static void unsubscribe(kvr_kv_events *ev, size_t id, wrec *r)
{
    if (!r->gen)
        return;
    kvr_kv_stream_stats st;
    if (kvr_kv_ingest_stats(ev->ing, id, &st) == 0)
        add_stats(&r->base, &st);
    kvr_kv_ingest_remove(ev->ing, id);
    r->gen = 0;
}

/* ---- ops from the thread ---- */

static void apply_batch(kvr_kv_events *ev, size_t id, wrec *r, const kvr_kv_batch *b)
{
    for (size_t i = 0; i < b->nevents; i++) {
        const kvr_kv_event *e = &b->events[i];
        switch (e->type) {
        case KVR_KV_EV_STORED:
            kvr_kv_index_stored(ev->index, id, e->hashes, e->nhashes, e->has_parent, e->parent,
                                e->tokens, e->ntokens, e->block_size, e->medium);
            break;
        case KVR_KV_EV_REMOVED:
            kvr_kv_index_removed(ev->index, id, e->hashes, e->nhashes, e->medium);
            break;
        default:
            kvr_kv_index_clear_worker(ev->index, id);
            r->partial = 0; /* an empty cache: everything from here on is known */
            break;
        }
        const char *lv[] = {r->url, kvr_kv_ev_type_name(e->type)};
        kvr_metric_inc(ev->m_events, lv, 1);
    }
}

/* Whether `b` is for the worker `r` is: on an endpoint its engine's ranks share, a batch
 * carries its rank (vLLM's data_parallel_rank; absent or nil = rank 0). A batch naming a rank
 * the engine does not have is counted once, by rank 0. */
static int for_rank(kvr_kv_events *ev, const wrec *r, const kvr_kv_batch *b)
{
    if (r->ranks <= 1 || !b)
        return 1;
    int64_t br = b->dp_rank == -1 ? 0 : b->dp_rank;
    if (br == r->rank)
        return 1;
    if (r->rank == 0 && (br < 0 || br >= r->ranks)) {
        const char *lv[] = {r->url, "rank"};
        kvr_metric_inc(ev->m_dropped, lv, 1);
        KVR_DEBUG("kv-events: worker %s: batch for data_parallel_rank %lld of %d dropped",
                  r->url, (long long)b->dp_rank, r->ranks);
    }
    return 0;
}

static void on_ops(void *ud)
{
    kvr_kv_events *ev = ud;
    kvr_kv_op *op = kvr_kv_ingest_take(ev->ing);
    uint64_t now = kvr_now_ms();
    while (op) {
        kvr_kv_op *next = op->next;
        wrec *r = rec(ev, op->worker, 0);
        if (r && r->gen && r->gen == op->gen) {
            if (op->kind == KVR_KV_OP_BATCH) {
                if (!for_rank(ev, r, op->batch)) {
                    kvr_kv_op_free(op);
                    op = next;
                    continue;
                }
                apply_batch(ev, op->worker, r, op->batch);
                r->last_event_ms = now;
                r->served = 0;
            } else if (op->kind == KVR_KV_OP_CLEAR) {
                kvr_kv_index_clear_worker(ev->index, op->worker);
            } else {
                r->trust = op->state;
                r->partial = op->partial;
                r->last_event_ms = now;
                r->served = 0;
            }
        }
        kvr_kv_op_free(op);
        op = next;
    }
}

/* ---- resolution ---- */

int kvr_kv_events_split(const char *url, char *host, size_t hcap, char *port, size_t pcap)
{
    if (strncmp(url, "tcp://", 6) != 0)
        return -1;
    const char *h = url + 6, *end;
    if (*h == '[') {
        end = strchr(h, ']');
        if (!end || end[1] != ':')
            return -1;
        h++;
    } else {
        end = strrchr(h, ':');
        if (!end || memchr(h, '/', (size_t)(end - h)))
            return -1;
    }
    size_t hl = (size_t)(end - h);
    const char *p = end + (*end == ']' ? 2 : 1);
    size_t pl = strlen(p);
    if (!hl || hl >= hcap || !pl || pl > 5 || pl >= pcap || strspn(p, "0123456789") != pl ||
        atoi(p) < 1 || atoi(p) > 65535)
        return -1;
    /* A host name or address literal: letters, digits, '.', '-', ':' (v6) — no '*' (vLLM's
     * bind form names no host to dial), no separators a resolver might read otherwise. */
    for (size_t i = 0; i < hl; i++)
        if (!isalnum((unsigned char)h[i]) && !strchr(".-:_", h[i]))
            return -1;
    memcpy(host, h, hl);
    host[hl] = 0;
    memcpy(port, p, pl + 1);
    return 0;
}

int kvr_kv_events_offset(const char *url, unsigned add, char *out, size_t cap)
{
    char host[256], port[16];
    if (kvr_kv_events_split(url, host, sizeof(host), port, sizeof(port)) < 0 ||
        atol(port) + (long)add > 65535)
        return -1;
    int n = snprintf(out, cap, strchr(host, ':') ? "tcp://[%s]:%ld" : "tcp://%s:%ld", host,
                     atol(port) + (long)add);
    return n > 0 && (size_t)n < cap ? 0 : -1;
}

static void start_resolve(kvr_kv_events *ev, size_t id, wrec *r, int which);

static void subscribe(kvr_kv_events *ev, size_t id, wrec *r)
{
    r->gen = kvr_kv_ingest_add(ev->ing, id, r->lit[0], r->lit[1], r->topic);
    r->trust = KVR_KV_DEGRADED;
    r->last_event_ms = kvr_now_ms();
    r->served = 0;
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
    resolve *q = req->data;
    kvr_kv_events *ev = q->ev;
    ev->resolving--;
    wrec *r = ev->closing ? NULL : rec(ev, q->worker, 0);
    if (r && r->configured && r->epoch == q->epoch) {
        char lit[128] = "", ip[INET6_ADDRSTRLEN];
        const char *why = status ? uv_strerror(status) : "denied by the egress policy";
        for (struct addrinfo *a = status ? NULL : res; a && !lit[0]; a = a->ai_next) {
            if (ev->allow && !ev->allow(ev->allow_ud, q->url, a->ai_addr))
                continue;
            if (a->ai_family == AF_INET) {
                struct sockaddr_in *s4 = (struct sockaddr_in *)a->ai_addr;
                inet_ntop(AF_INET, &s4->sin_addr, ip, sizeof(ip));
                snprintf(lit, sizeof(lit), "tcp://%s:%u", ip, ntohs(s4->sin_port));
            } else if (a->ai_family == AF_INET6) {
                struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)a->ai_addr;
                inet_ntop(AF_INET6, &s6->sin6_addr, ip, sizeof(ip));
                snprintf(lit, sizeof(lit), "tcp://[%s]:%u", ip, ntohs(s6->sin6_port));
            }
        }
        if (!lit[0]) {
            KVR_WARN("kv-events: worker %s: %s: %s; routing it approximately", r->url, q->url,
                     why);
            r->trust = KVR_KV_FALLBACK;
            r->retry_at = kvr_now_ms() + RESOLVE_RETRY_MS;
        } else {
            free(r->lit[q->which]);
            r->lit[q->which] = strdup(lit);
            if (q->which == 0 && r->rep)
                start_resolve(ev, q->worker, r, 1);
            else if (r->lit[0] && (!r->rep || r->lit[1]))
                subscribe(ev, q->worker, r);
        }
    }
    uv_freeaddrinfo(res);
    free(q->url);
    free(q);
    if (ev->closing && !ev->resolving)
        free(ev);
}

static void start_resolve(kvr_kv_events *ev, size_t id, wrec *r, int which)
{
    const char *url = which ? r->rep : r->ep;
    char host[256], port[16];
    resolve *q = calloc(1, sizeof(*q));
    if (!q || kvr_kv_events_split(url, host, sizeof(host), port, sizeof(port)) < 0 ||
        !(q->url = strdup(url))) {
        free(q);
        r->retry_at = kvr_now_ms() + RESOLVE_RETRY_MS;
        return;
    }
    q->ev = ev;
    q->worker = id;
    q->epoch = r->epoch;
    q->which = which;
    q->req.data = q;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    int rc = uv_getaddrinfo(ev->loop, &q->req, on_resolved, host, port, &hints);
    if (rc) {
        KVR_WARN("kv-events: worker %s: cannot resolve %s: %s", r->url, url, uv_strerror(rc));
        free(q->url);
        free(q);
        r->retry_at = kvr_now_ms() + RESOLVE_RETRY_MS;
        return;
    }
    ev->resolving++;
}

/* ---- public ---- */

static void render(void *ud)
{
    kvr_kv_events *ev = ud;
    kvr_kv_index_stats is;
    kvr_kv_index_stats_get(ev->index, &is);
    const char *lu[] = {"unknown_parent"}, *lc[] = {"cap"}, *lb[] = {"bad_tokens"};
    kvr_metric_set(ev->m_skipped, lu, (double)is.skipped_unknown_parent);
    kvr_metric_set(ev->m_skipped, lc, (double)is.skipped_cap);
    kvr_metric_set(ev->m_skipped, lb, (double)is.skipped_bad_tokens);
    for (size_t id = 0; id < ev->nw; id++) {
        wrec *r = &ev->w[id];
        if (!r->configured)
            continue;
        kvr_kv_stream_stats st = r->base, cur;
        if (r->gen && kvr_kv_ingest_stats(ev->ing, id, &cur) == 0)
            add_stats(&st, &cur);
        const char *lv[] = {r->url};
        kvr_metric_set(ev->m_state, lv, r->trust);
        kvr_metric_set(ev->m_gaps, lv, (double)st.gaps);
        kvr_metric_set(ev->m_malformed, lv, (double)st.malformed);
        for (int i = 0; i < KVR_KV_REPLAY_NRESULTS; i++) {
            const char *lr[] = {r->url, kvr_kv_replay_result_name((kvr_kv_replay_result)i)};
            kvr_metric_set(ev->m_replays, lr, (double)st.replays[i]);
        }
    }
}

kvr_kv_events *kvr_kv_events_new(uv_loop_t *loop, const kvr_kv_events_cfg *cfg,
                                 kvr_metrics *metrics, kvr_kv_allow_fn allow, void *allow_ud,
                                 char *err, size_t errlen)
{
    kvr_kv_events *ev = calloc(1, sizeof(*ev));
    if (!ev) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    ev->loop = loop;
    ev->cfg = *cfg;
    ev->allow = allow;
    ev->allow_ud = allow_ud;
    ev->index = kvr_kv_index_create(cfg->max_blocks ? cfg->max_blocks : 1);
    if (!ev->index) {
        snprintf(err, errlen, "out of memory");
        free(ev);
        return NULL;
    }
    ev->ing = kvr_kv_ingest_new(loop, &cfg->ingest, on_ops, ev, err, errlen);
    if (!ev->ing) {
        kvr_kv_index_destroy(ev->index);
        free(ev);
        return NULL;
    }
    const char *w[] = {"worker"}, *wt[] = {"worker", "type"}, *wr[] = {"worker", "result"};
    const char *re[] = {"reason"};
    ev->m_state = kvr_metrics_gauge(metrics, "kvroute_kv_events_state",
                                    "Trust in the worker's KV events: 0 exact, 1 degraded, "
                                    "2 fallback",
                                    1, w);
    ev->m_events = kvr_metrics_counter(metrics, "kvroute_kv_events_total",
                                       "KV events applied to the KV block index", 2, wt);
    ev->m_gaps = kvr_metrics_counter(metrics, "kvroute_kv_events_gaps_total",
                                     "Sequence gaps seen in a worker's KV-event stream", 1, w);
    ev->m_replays = kvr_metrics_counter(metrics, "kvroute_kv_events_replays_total",
                                        "KV-event replays by result", 2, wr);
    ev->m_malformed = kvr_metrics_counter(metrics, "kvroute_kv_events_malformed_total",
                                          "KV-event messages that could not be decoded", 1, w);
    const char *wre[] = {"worker", "reason"};
    ev->m_dropped = kvr_metrics_counter(metrics, "kvroute_kv_events_dropped_total",
                                        "KV-event batches not applied: reason=rank, a batch on "
                                        "a data-parallel engine's shared endpoint naming a rank "
                                        "it does not have",
                                        2, wre);
    ev->m_skipped = kvr_metrics_counter(metrics, "kvroute_kv_skipped_blocks_total",
                                        "Stored blocks the KV block index could not record",
                                        1, re);
    kvr_metrics_on_render(metrics, render, ev);
    return ev;
}

void kvr_kv_events_close(kvr_kv_events *ev)
{
    if (!ev)
        return;
    kvr_kv_ingest_close(ev->ing);
    for (size_t i = 0; i < ev->nw; i++) {
        free_spec(&ev->w[i]);
        free(ev->w[i].url);
    }
    free(ev->w);
    ev->w = NULL;
    ev->nw = 0;
    kvr_kv_index_destroy(ev->index);
    ev->index = NULL;
    ev->closing = 1;
    if (!ev->resolving)
        free(ev);
}

void kvr_kv_events_set_cfg(kvr_kv_events *ev, const kvr_kv_events_cfg *cfg)
{
    ev->cfg.stale_ms = cfg->stale_ms;
    ev->cfg.speculative_ms = cfg->speculative_ms;
    ev->cfg.max_blocks = cfg->max_blocks;
    kvr_kv_index_set_max_blocks(ev->index, cfg->max_blocks ? cfg->max_blocks : 1);
}

static int same(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

int kvr_kv_events_configure(kvr_kv_events *ev, kvr_worker *w, const kvr_kv_events_spec *spec)
{
    char host[256], port[16];
    if (spec && (!spec->endpoint ||
                 kvr_kv_events_split(spec->endpoint, host, sizeof(host), port, sizeof(port)) < 0 ||
                 (spec->replay_endpoint &&
                  kvr_kv_events_split(spec->replay_endpoint, host, sizeof(host), port, sizeof(port)) < 0)))
        return -1;
    wrec *r = rec(ev, w->id, spec != NULL);
    if (!r)
        return 0;
    const char *topic = spec && spec->topic ? spec->topic : "";
    int ranks = spec && spec->ranks > 1 ? spec->ranks : 0, rank = ranks ? spec->rank : 0;
    if (spec && r->configured && same(r->ep, spec->endpoint) &&
        same(r->rep, spec->replay_endpoint) && same(r->topic, topic) && r->rank == rank &&
        r->ranks == ranks)
        return 0;
    unsubscribe(ev, w->id, r);
    kvr_kv_index_clear_worker(ev->index, w->id);
    free_spec(r);
    r->w = NULL;
    r->epoch++;
    r->retry_at = 0;
    r->trust = KVR_KV_FALLBACK;
    r->configured = spec != NULL;
    if (!spec)
        return 0;
    free(r->url);
    r->url = strdup(w->url);
    r->ep = strdup(spec->endpoint);
    r->rep = spec->replay_endpoint ? strdup(spec->replay_endpoint) : NULL;
    r->topic = strdup(topic);
    if (!r->url || !r->ep || !r->topic || (spec->replay_endpoint && !r->rep)) {
        free_spec(r);
        r->configured = 0;
        return 0;
    }
    r->trust = KVR_KV_DEGRADED;
    r->w = w;
    r->rank = rank;
    r->ranks = ranks;
    start_resolve(ev, w->id, r, 0);
    return 0;
}

void kvr_kv_events_drop(kvr_kv_events *ev, const kvr_worker *w)
{
    kvr_metric *per_worker[] = {ev->m_state, ev->m_events, ev->m_gaps, ev->m_replays,
                                ev->m_malformed, ev->m_dropped};
    for (size_t i = 0; i < sizeof(per_worker) / sizeof(per_worker[0]); i++)
        kvr_metric_remove_matching(per_worker[i], "worker", w->url);
    wrec *r = rec(ev, w->id, 0);
    if (!r)
        return;
    unsubscribe(ev, w->id, r);
    kvr_kv_index_clear_worker(ev->index, w->id);
    free_spec(r);
    r->epoch++;
    r->configured = 0;
    r->w = NULL;
    r->trust = KVR_KV_FALLBACK;
}

/* The events' block size must be the engine's (vllm:cache_config_info): a disagreement means
 * the endpoint belongs to another engine, or a hybrid model's group. Said once per value. */
static void check_block_size(kvr_kv_events *ev, size_t id, wrec *r)
{
    uint32_t bs = kvr_kv_index_block_size(ev->index, id);
    if (!r->w || !bs || !r->w->kv_block_size || bs == r->w->kv_block_size || bs == r->warned_bs)
        return;
    r->warned_bs = bs;
    KVR_WARN("kv-events: worker %s: events carry block_size %u but vllm:cache_config_info says "
             "%u; check that %s is this worker's endpoint",
             r->url, bs, r->w->kv_block_size, r->ep);
}

void kvr_kv_events_forget(kvr_kv_events *ev, const kvr_worker *w)
{
    wrec *r = rec(ev, w->id, 0);
    kvr_kv_index_clear_worker(ev->index, w->id);
    if (r && r->gen) {
        kvr_kv_ingest_resync(ev->ing, w->id, 1);
        if (r->trust == KVR_KV_EXACT)
            r->trust = KVR_KV_DEGRADED;
    }
}

void kvr_kv_events_served(kvr_kv_events *ev, const kvr_worker *w)
{
    wrec *r = ev ? rec(ev, w->id, 0) : NULL;
    if (r && r->configured && !r->served++)
        r->first_served_ms = kvr_now_ms();
}

void kvr_kv_events_tick(kvr_kv_events *ev)
{
    if (!ev)
        return;
    uint64_t now = kvr_now_ms();
    kvr_kv_index_sweep(ev->index, now, SWEEP_PER_TICK);
    for (size_t id = 0; id < ev->nw; id++) {
        wrec *r = &ev->w[id];
        if (!r->configured)
            continue;
        check_block_size(ev, id, r);
        if (!r->gen && r->retry_at && now >= r->retry_at) {
            r->retry_at = 0;
            r->epoch++;
            start_resolve(ev, id, r, 0);
        }
        /* Silence counts from the first request left unconfirmed, not from an idle spell. */
        uint64_t since = r->first_served_ms > r->last_event_ms ? r->first_served_ms
                                                                : r->last_event_ms;
        if (r->gen && r->trust == KVR_KV_EXACT && r->served && now - since >= ev->cfg.stale_ms) {
            KVR_INFO("kv-events: worker %s served %llu requests without an event for %llu ms; "
                     "checking for lost batches",
                     r->url, (unsigned long long)r->served,
                     (unsigned long long)(now - r->last_event_ms));
            r->trust = KVR_KV_DEGRADED;
            r->served = 0;
            r->last_event_ms = now;
            kvr_kv_ingest_resync(ev->ing, id, 0);
        }
    }
}

kvr_kv_trust kvr_kv_events_trust(const kvr_kv_events *ev, size_t worker)
{
    return ev && worker < ev->nw ? ev->w[worker].trust : KVR_KV_FALLBACK;
}

int kvr_kv_events_partial(const kvr_kv_events *ev, size_t worker)
{
    return ev && worker < ev->nw && ev->w[worker].partial;
}

int kvr_kv_events_configured(const kvr_kv_events *ev, size_t worker)
{
    return ev && worker < ev->nw && ev->w[worker].configured;
}

kvr_kv_index *kvr_kv_events_index(kvr_kv_events *ev)
{
    return ev ? ev->index : NULL;
}

uint64_t kvr_kv_events_speculative_ms(const kvr_kv_events *ev)
{
    return ev ? ev->cfg.speculative_ms : 0;
}
