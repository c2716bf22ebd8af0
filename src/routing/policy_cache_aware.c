/* cache_aware policy: session map + prefix index per model. See policy_cache_aware.h. */
#include "routing/policy_cache_aware.h"

#include <stdlib.h>
#include <string.h>

#include "index/prefix_index.h"
#include "routing/policies.h"
#include "util/rand.h"
#include "util/time.h"

#define TEACH_SWEEP 4          /* expired sessions dropped per teach: O(1) amortized expiry */

typedef struct ca_state {
    kvr_policy_cfg cfg;
    kvr_session_map *sessions;
    kvr_prefix_index *index;
    size_t *ids;               /* per-pick scratch, n entries */
    size_t *matched;
    size_t nscratch;
    int64_t *kv_seen;          /* by worker id: kv_tokens last turned into an index cap */
    size_t nkv;
} ca_state;

static void ca_destroy(void *self)
{
    ca_state *s = self;
    if (!s)
        return;
    kvr_session_map_destroy(s->sessions);
    kvr_prefix_index_destroy(s->index);
    free(s->ids);
    free(s->matched);
    free(s->kv_seen);
    free(s);
}

static void *ca_create(const kvr_policy_cfg *cfg, const char *model)
{
    (void)model;
    ca_state *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    if (cfg)
        s->cfg = *cfg;
    else
        kvr_policy_cfg_default(&s->cfg);
    kvr_prefix_index_cfg icfg = {
        .block_bytes = s->cfg.block_bytes ? s->cfg.block_bytes : 64,
        .max_blocks = s->cfg.max_index_blocks ? s->cfg.max_index_blocks : 4000000,
        .worker_blocks = s->cfg.worker_index_blocks,
    };
    s->cfg.block_bytes = icfg.block_bytes;
    s->index = kvr_prefix_index_create(&icfg);
    s->sessions = kvr_session_map_create(s->cfg.session_ttl_s * 1000,
                                         s->cfg.max_sessions ? s->cfg.max_sessions : 1000000);
    if (!s->index || !s->sessions) {
        ca_destroy(s);
        return NULL;
    }
    return s;
}

static int scratch(ca_state *s, size_t n)
{
    if (n <= s->nscratch)
        return 0;
    size_t *a = realloc(s->ids, n * sizeof(*a));
    if (a)
        s->ids = a;
    size_t *b = realloc(s->matched, n * sizeof(*b));
    if (b)
        s->matched = b;
    if (!a || !b)
        return -1;
    s->nscratch = n;
    return 0;
}

static int overloaded(const ca_state *s, const kvr_worker *w, int64_t min_load)
{
    double load = (double)w->inflight, min = (double)min_load;
    return load - min > s->cfg.balance_abs_threshold &&
           load > min * s->cfg.balance_rel_threshold;
}

/* The whole decision; `rows` (may be NULL) receives the per-worker view. Learns nothing. */
static int decide(ca_state *s, kvr_worker *const *el, size_t n, const kvr_route_keys *k,
                  kvr_pick *out, kvr_cache_aware_explain_row *rows)
{
    if (!n || scratch(s, n) < 0)
        return -1;
    const char *text = k ? k->text : NULL, *sess = k ? k->session : NULL;
    size_t tlen = text ? k->text_len : 0, slen = sess ? k->session_len : 0;

    int64_t min_load = el[0]->inflight;
    for (size_t i = 1; i < n; i++)
        if (el[i]->inflight < min_load)
            min_load = el[i]->inflight;

    size_t best = 0;
    if (tlen) {
        for (size_t i = 0; i < n; i++)
            s->ids[i] = el[i]->id;
        kvr_prefix_index_match(s->index, text, tlen, s->ids, n, s->matched);
        for (size_t i = 0; i < n; i++)
            if (s->matched[i] > best)
                best = s->matched[i];
    } else {
        memset(s->matched, 0, n * sizeof(*s->matched));
    }
    out->match = tlen ? (double)best / (double)tlen : -1;

    size_t owner_id = 0;
    int has_owner = slen && kvr_session_map_get(s->sessions, sess, slen, kvr_now_ms(), &owner_id);
    if (rows)
        for (size_t i = 0; i < n; i++)
            rows[i] = (kvr_cache_aware_explain_row){
                .worker = el[i],
                .matched_bytes = s->matched[i],
                .match = tlen ? (double)s->matched[i] / (double)tlen : -1,
                .inflight = el[i]->inflight,
                .overloaded = overloaded(s, el[i], min_load),
                .session_owner = has_owner && el[i]->id == owner_id,
            };

    int refused = 0;
    /* 1. Exact session affinity. */
    if (has_owner) {
        for (size_t i = 0; i < n; i++) {
            if (el[i]->id != owner_id)
                continue;
            if (!overloaded(s, el[i], min_load)) {
                out->worker = el[i];
                out->decision = "session_id_match";
                return 0;
            }
            refused = 1;
            break;
        }
    }
    /* 2. Prefix affinity: the best match, ties at random among those not overloaded. */
    if (best && out->match >= s->cfg.cache_threshold) {
        kvr_worker *pick = NULL;
        uint64_t ties = 0;
        for (size_t i = 0; i < n; i++) {
            if (s->matched[i] != best)
                continue;
            if (overloaded(s, el[i], min_load)) {
                refused = 1;
                continue;
            }
            if (kvr_rand_below(++ties) == 0)
                pick = el[i];
        }
        if (pick) {
            out->worker = pick;
            out->decision = "prefix_match";
            return 0;
        }
    }
    /* 3. Least load. */
    out->worker = kvr_policy_least_loaded(el, n);
    out->decision = refused ? "load_balance" : !tlen ? "empty_key_min_load" : "low_match_min_load";
    return 0;
}

static int ca_pick(void *self, kvr_worker *const *el, size_t n, const kvr_route_keys *k,
                   kvr_pick *out)
{
    return decide(self, el, n, k, out, NULL);
}

int kvr_cache_aware_explain(void *self, kvr_worker *const *eligible, size_t n,
                            const kvr_route_keys *k, kvr_cache_aware_explain_row *rows,
                            kvr_pick *out)
{
    return decide(self, eligible, n, k, out, rows);
}

/* Keeps the worker's index cap in step with the KV capacity it publishes (when no
 * --worker-index-blocks was given). */
static void sync_capacity(ca_state *s, const kvr_worker *w)
{
    if (s->cfg.worker_index_blocks || w->kv_tokens <= 0)
        return;
    if (w->id >= s->nkv) {
        size_t n = s->nkv ? s->nkv : 16;
        while (n <= w->id)
            n *= 2;
        int64_t *p = realloc(s->kv_seen, n * sizeof(*p));
        if (!p)
            return;
        for (size_t i = s->nkv; i < n; i++)
            p[i] = -1;
        s->kv_seen = p;
        s->nkv = n;
    }
    if (s->kv_seen[w->id] == w->kv_tokens)
        return;
    size_t cap = kvr_prefix_index_blocks_for_kv_tokens(w->kv_tokens, s->cfg.block_bytes);
    if (kvr_prefix_index_set_worker_capacity(s->index, w->id, cap) == 0)
        s->kv_seen[w->id] = w->kv_tokens;
}

static void ca_teach(void *self, kvr_worker *w, const kvr_route_keys *k)
{
    ca_state *s = self;
    uint64_t now = kvr_now_ms();
    sync_capacity(s, w);
    if (k && k->session && k->session_len)
        kvr_session_map_bind(s->sessions, k->session, k->session_len, w->id, now);
    if (k && k->text && k->text_len)
        kvr_prefix_index_insert(s->index, w->id, k->text, k->text_len);
    kvr_session_map_sweep(s->sessions, now, TEACH_SWEEP);
}

static void ca_forget(void *self, kvr_worker *w)
{
    ca_state *s = self;
    kvr_session_map_forget_worker(s->sessions, w->id);
    kvr_prefix_index_forget_worker(s->index, w->id);
    if (w->id < s->nkv)
        s->kv_seen[w->id] = -1;
}

size_t kvr_cache_aware_sweep(void *self, size_t max)
{
    ca_state *s = self;
    return kvr_session_map_sweep(s->sessions, kvr_now_ms(), max);
}

void kvr_cache_aware_stats_get(void *self, kvr_cache_aware_stats *out)
{
    ca_state *s = self;
    kvr_prefix_index_stats is;
    kvr_session_map_stats ss;
    kvr_prefix_index_stats_get(s->index, &is);
    kvr_session_map_stats_get(s->sessions, &ss);
    memset(out, 0, sizeof(*out));
    out->index_blocks = is.blocks;
    out->index_evictions = is.evictions;
    out->sessions = ss.sessions;
    memcpy(out->session_evictions, ss.evictions, sizeof(out->session_evictions));
    out->memory_bytes = is.memory_bytes + ss.memory_bytes;
}

void kvr_cache_aware_worker_stats_get(void *self, size_t worker_id,
                                      kvr_cache_aware_worker_stats *out)
{
    ca_state *s = self;
    out->index_blocks = kvr_prefix_index_worker_blocks(s->index, worker_id);
    out->index_capacity = kvr_prefix_index_worker_capacity(s->index, worker_id);
    out->sessions = kvr_session_map_worker_count(s->sessions, worker_id);
}

/* Thresholds and the session TTL change in place; the index's block size and caps shape its
 * tables, so a change there starts the route afresh. */
static int ca_retune(void *self, const kvr_policy_cfg *cfg)
{
    ca_state *s = self;
    if ((cfg->block_bytes ? cfg->block_bytes : 64) != s->cfg.block_bytes ||
        cfg->max_index_blocks != s->cfg.max_index_blocks ||
        cfg->worker_index_blocks != s->cfg.worker_index_blocks ||
        cfg->session_ttl_s != s->cfg.session_ttl_s || cfg->max_sessions != s->cfg.max_sessions)
        return -1;
    s->cfg.cache_threshold = cfg->cache_threshold;
    s->cfg.balance_abs_threshold = cfg->balance_abs_threshold;
    s->cfg.balance_rel_threshold = cfg->balance_rel_threshold;
    return 0;
}

const kvr_policy_ops kvr_policy_cache_aware = {
    .name = "cache_aware",
    .create = ca_create,
    .pick = ca_pick,
    .teach = ca_teach,
    .forget_worker = ca_forget,
    .destroy = ca_destroy,
    .uses_keys = 1,
    .explain = kvr_cache_aware_explain,
    .stats = kvr_cache_aware_stats_get,
    .worker_stats = kvr_cache_aware_worker_stats_get,
    .sweep = kvr_cache_aware_sweep,
    .retune = ca_retune,
};
