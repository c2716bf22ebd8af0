/* cache_aware policy: session map + prefix index per model. See policy_cache_aware.h. */
#include "routing/policy_cache_aware.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "events/kvevents.h"
#include "index/prefix_index.h"
#include "routing/keys.h"
#include "routing/policies.h"
#include "util/rand.h"
#include "util/time.h"

#define TEACH_SWEEP 4          /* expired sessions dropped per teach: O(1) amortized expiry */
/* Block size assumed for an exact worker that has not stored a block yet (vLLM's CUDA
 * default, --block-size 16): it then holds nothing, so only speculative entries use it. */
#define DEFAULT_KV_BLOCK 16
/* Block sizes kept hashed at once while scoring one request (fleets use one, rarely two). */
#define MAX_BLOCK_SIZES 4
/* New conversations are spread by how many each worker started lately: a worker may take one
 * while its count is within this factor (+1) of the least busy's, as bounded-load hashing does
 * with in-flight requests; the counts fade with the half-life below, following traffic. */
#define START_SPREAD 1.25
#define START_HALF_LIFE_MS 600000.0
/* A worker reporting less than this share of the cached tokens the prefix index predicted has
 * evidently lost blocks. A smaller shortfall is not evidence: the prediction is the matched
 * share of routing-text bytes applied to prompt tokens, and tokens are not spread evenly over
 * bytes (JSON, numbers and code are denser than prose). On the tau-bench and SWE-agent traces,
 * where nothing was evicted, workers reported 0.74-1.0 of the prediction; correcting on those
 * shortfalls cut the workers' caps to a few hundred blocks and cost 4-6 points of hit rate
 * (docs/performance.md). */
#define EVICTED_SHARE 0.5

typedef struct ca_state {
    kvr_policy_cfg cfg;
    kvr_session_map *sessions;
    kvr_prefix_index *index;
    size_t *ids;               /* per-pick scratch, n entries */
    size_t *matched;
    size_t nscratch;
    int64_t *kv_seen;          /* by worker id: kv_tokens last turned into an index cap */
    size_t nkv;
    int precise;               /* the precise policy: exact workers scored by the KV index */
    double *starts;            /* by worker id: new conversations started there (decaying) */
    uint64_t *starts_ms;       /* ... when that count was last brought up to date */
    size_t nstarts;
    double *ratio;             /* per-pick scratch: each worker's match ratio */
    size_t *kv_run;            /* ... its resident leading blocks (exact workers) */
    unsigned char *exact;      /* ... 1 when scored by the KV block index */
    kvr_worker **spare;        /* ... a subset of the eligible workers */
    struct {                   /* the prompt's block keys, per block size */
        uint32_t bs;
        uint64_t *keys;
        size_t n, cap;
    } kk[MAX_BLOCK_SIZES];
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
    free(s->ratio);
    free(s->starts);
    free(s->starts_ms);
    free(s->kv_run);
    free(s->exact);
    free(s->spare);
    for (int i = 0; i < MAX_BLOCK_SIZES; i++)
        free(s->kk[i].keys);
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
    double *c = realloc(s->ratio, n * sizeof(*c));
    if (c)
        s->ratio = c;
    size_t *d = realloc(s->kv_run, n * sizeof(*d));
    if (d)
        s->kv_run = d;
    unsigned char *e = realloc(s->exact, n);
    if (e)
        s->exact = e;
    kvr_worker **f = realloc(s->spare, n * sizeof(*f));
    if (f)
        s->spare = f;
    if (!a || !b || !c || !d || !e || !f)
        return -1;
    s->nscratch = n;
    return 0;
}

/* The prompt's block keys in block size `bs`, hashed once per pick and size (NULL when
 * memory ran out or too many sizes are in play). */
static const uint64_t *block_keys(ca_state *s, const kvr_route_keys *k, uint32_t bs, size_t *n)
{
    int slot = -1;
    for (int i = 0; i < MAX_BLOCK_SIZES && slot < 0; i++)
        if (s->kk[i].bs == bs || s->kk[i].bs == 0)
            slot = i;
    if (slot < 0)
        return NULL;
    if (s->kk[slot].bs != bs) {
        size_t need = k->ntokens / bs;
        if (need > s->kk[slot].cap) {
            uint64_t *p = realloc(s->kk[slot].keys, (need ? need : 1) * sizeof(*p));
            if (!p)
                return NULL;
            s->kk[slot].keys = p;
            s->kk[slot].cap = need;
        }
        s->kk[slot].n = kvr_kv_index_keys(k->tokens, k->ntokens, bs, s->kk[slot].keys, need);
        s->kk[slot].bs = bs;
    }
    *n = s->kk[slot].n;
    return s->kk[slot].keys;
}

static void block_keys_reset(ca_state *s)
{
    for (int i = 0; i < MAX_BLOCK_SIZES; i++)
        s->kk[i].bs = 0;
}

static uint32_t worker_block_size(const ca_state *s, size_t id)
{
    uint32_t bs = kvr_kv_index_block_size(kvr_kv_events_index(s->cfg.kv), id);
    return bs ? bs : DEFAULT_KV_BLOCK;
}

/* precise: workers whose events are exact are scored by the KV block index (resident tokens /
 * prompt tokens); `exact[i]` says which. Returns 1 when any worker was. */
static int score_exact(ca_state *s, kvr_worker *const *el, size_t n, const kvr_route_keys *k)
{
    memset(s->exact, 0, n);
    memset(s->kv_run, 0, n * sizeof(*s->kv_run));
    if (!s->precise || !s->cfg.kv || !k || !k->tokens || !k->ntokens)
        return 0;
    kvr_kv_index *ix = kvr_kv_events_index(s->cfg.kv);
    uint64_t now = kvr_now_ms();
    int any = 0;
    block_keys_reset(s);
    for (size_t i = 0; i < n; i++) {
        if (kvr_kv_events_trust(s->cfg.kv, el[i]->id) != KVR_KV_EXACT)
            continue;
        uint32_t bs = worker_block_size(s, el[i]->id);
        size_t nk;
        const uint64_t *keys = block_keys(s, k, bs, &nk);
        if (!keys)
            continue;
        s->kv_run[i] = kvr_kv_index_match(ix, el[i]->id, keys, nk, now, NULL);
        s->ratio[i] = (double)(s->kv_run[i] * bs) / (double)k->ntokens;
        /* A worker whose early history is unknown may hold prefixes its events never named:
         * the approximate index's view counts too when it says more. */
        if (kvr_kv_events_partial(s->cfg.kv, el[i]->id) && k->text_len &&
            (double)s->matched[i] / (double)k->text_len > s->ratio[i])
            continue;
        s->exact[i] = 1;
        any = 1;
    }
    return any;
}

static int overloaded(const ca_state *s, const kvr_worker *w, int64_t min_load)
{
    double load = (double)kvr_worker_load(w), min = (double)min_load;
    return load - min > s->cfg.balance_abs_threshold &&
           load > min * s->cfg.balance_rel_threshold;
}

/* New conversations started on worker `id`, decayed to `now` (0 when unknown). */
static double starts_of(const ca_state *s, size_t id, uint64_t now)
{
    if (id >= s->nstarts || !s->starts[id])
        return 0;
    return s->starts[id] * exp2(-(double)(now - s->starts_ms[id]) / START_HALF_LIFE_MS);
}

static void count_start(ca_state *s, size_t id, uint64_t now)
{
    if (id >= s->nstarts) {
        size_t n = s->nstarts ? s->nstarts : 16;
        while (n <= id)
            n *= 2;
        double *a = realloc(s->starts, n * sizeof(*a));
        if (a)
            s->starts = a;
        uint64_t *b = realloc(s->starts_ms, n * sizeof(*b));
        if (b)
            s->starts_ms = b;
        if (!a || !b)
            return;
        memset(a + s->nstarts, 0, (n - s->nstarts) * sizeof(*a));
        memset(b + s->nstarts, 0, (n - s->nstarts) * sizeof(*b));
        s->nstarts = n;
    }
    s->starts[id] = starts_of(s, id, now) + 1;
    s->starts_ms[id] = now;
}

/* Whether a request starts a new conversation: its best match stops before its first user
 * message's own bytes, within what every conversation opening the same way shares (tools,
 * system prompt). Such requests must not all pile onto the first worker that cached that
 * preamble (issue 14: 169 of 431 requests on one of 4 workers). */
static int new_conversation(const kvr_route_keys *k, double best_ratio, const ca_state *s,
                            kvr_worker *const *el, size_t n)
{
    if (!k || !k->text_len)
        return 0;
    /* A worker holding every full block of the prompt has seen this very request: a repeat
     * (token ratios never reach 1: the partial last block is not cached). */
    for (size_t i = 0; i < n && k->ntokens; i++)
        if (s->exact[i] && (s->kv_run[i] + 1) * worker_block_size(s, el[i]->id) > k->ntokens)
            return 0;
    size_t pre = kvr_route_text_preamble(k->text, k->text_len);
    return pre && best_ratio * (double)k->text_len <= (double)pre;
}

/* Fills the pick for eligible worker `i`: what was predicted about its cache, for the
 * x-kvroute-index header and the prediction-error metrics. */
static int chose(ca_state *s, kvr_worker *const *el, size_t i, const kvr_route_keys *k,
                 kvr_pick *out)
{
    out->worker = el[i];
    out->index = s->exact[i] ? "exact" : "approximate";
    out->chosen_match = s->ratio[i];
    if (s->exact[i]) {
        out->block_size = worker_block_size(s, el[i]->id);
        out->predicted_tokens = (int64_t)(s->kv_run[i] * out->block_size);
    } else {
        out->block_size = 0;
        out->predicted_tokens = -1;
        /* Last-use times as they are now, before this request's own teaching moves them: what
         * a correction compares with once the worker says what it really held. */
        if (s->matched[i])
            kvr_prefix_index_match_use(s->index, el[i]->id, s->matched[i], &out->use);
        (void)k;
    }
    return 0;
}

/* The whole decision; `rows` (may be NULL) receives the per-worker view. Learns nothing. */
static int decide(ca_state *s, kvr_worker *const *el, size_t n, const kvr_route_keys *k,
                  kvr_pick *out, kvr_cache_aware_explain_row *rows)
{
    if (!n || scratch(s, n) < 0)
        return -1;
    const char *text = k ? k->text : NULL, *sess = k ? k->session : NULL;
    size_t tlen = text ? k->text_len : 0, slen = sess ? k->session_len : 0;

    int64_t min_load = kvr_worker_load(el[0]);
    for (size_t i = 1; i < n; i++)
        if (kvr_worker_load(el[i]) < min_load)
            min_load = kvr_worker_load(el[i]);

    if (tlen) {
        for (size_t i = 0; i < n; i++)
            s->ids[i] = el[i]->id;
        kvr_prefix_index_match_kept(s->index, text, tlen, k->kept, s->ids, n, s->matched);
    } else {
        memset(s->matched, 0, n * sizeof(*s->matched));
    }
    /* Each worker's ratio from the index that can vouch for it (DESIGN §6: per worker). */
    int any_exact = score_exact(s, el, n, k);
    double best = 0;
    for (size_t i = 0; i < n; i++) {
        if (!s->exact[i])
            s->ratio[i] = tlen ? (double)s->matched[i] / (double)tlen : 0;
        if (s->ratio[i] > best)
            best = s->ratio[i];
    }
    out->match = tlen || any_exact ? best : -1;

    size_t owner_id = 0;
    int has_owner = slen && kvr_session_map_get(s->sessions, sess, slen, kvr_now_ms(), &owner_id);
    if (rows)
        for (size_t i = 0; i < n; i++)
            rows[i] = (kvr_cache_aware_explain_row){
                .worker = el[i],
                .matched_bytes = s->matched[i],
                .match = tlen || s->exact[i] ? s->ratio[i] : -1,
                .inflight = kvr_worker_load(el[i]),
                .overloaded = overloaded(s, el[i], min_load),
                .session_owner = has_owner && el[i]->id == owner_id,
                .kv_blocks = s->kv_run[i],
                .trust = s->precise ? kvr_kv_trust_name(kvr_kv_events_trust(s->cfg.kv, el[i]->id))
                                    : NULL,
                .index = s->exact[i] ? "exact" : "approximate",
            };

    int refused = 0, spread = 0;
    /* 1. Exact session affinity. */
    if (has_owner) {
        for (size_t i = 0; i < n; i++) {
            if (el[i]->id != owner_id)
                continue;
            if (!overloaded(s, el[i], min_load)) {
                out->decision = "session_id_match";
                return chose(s, el, i, k, out);
            }
            refused = 1;
            break;
        }
    }
    /* 2. A new conversation (its best match stops within the preamble every conversation
     *    shares) may not go to a worker that started many more conversations lately than the
     *    least busy one: a shared system prompt is worth one prefill per worker, not a pile-up
     *    on the first worker that cached it. Such workers leave the prefix step below. */
    if (!has_owner && new_conversation(k, best, s, el, n)) {
        uint64_t now = kvr_now_ms();
        double least = HUGE_VAL;
        for (size_t i = 0; i < n; i++)
            if (starts_of(s, el[i]->id, now) < least)
                least = starts_of(s, el[i]->id, now);
        for (size_t i = 0; i < n; i++)
            if (starts_of(s, el[i]->id, now) > least * START_SPREAD + 1) {
                s->ratio[i] = -1;
                spread = 1;
            }
    }
    /* 3. Prefix affinity: the best match among workers not overloaded, ties to the least
     *    loaded (then at random); an exact worker's match is resident blocks (kv_match),
     *    another's the prefix index's. */
    double top = 0;
    for (size_t i = 0; i < n; i++)
        if (s->ratio[i] > top && !overloaded(s, el[i], min_load))
            top = s->ratio[i];
    if (top < best && !spread)
        refused = 1;
    if (top > 0 && top >= s->cfg.cache_threshold) {
        size_t pick = n;
        uint64_t ties = 0;
        for (size_t i = 0; i < n; i++) {
            if (s->ratio[i] != top || overloaded(s, el[i], min_load))
                continue;
            if (pick == n || kvr_worker_load(el[i]) < kvr_worker_load(el[pick])) {
                pick = i;
                ties = 1;
            } else if (kvr_worker_load(el[i]) == kvr_worker_load(el[pick]) && kvr_rand_below(++ties) == 0) {
                pick = i;
            }
        }
        out->decision = s->exact[pick] ? "kv_match" : "prefix_match";
        return chose(s, el, pick, k, out);
    }
    /* 4. Least load (a new conversation: among workers that may start one). */
    kvr_worker *least = NULL;
    if (spread) {
        size_t k2 = 0;
        for (size_t i = 0; i < n; i++)
            if (s->ratio[i] >= 0)
                s->spare[k2++] = el[i];
        least = k2 ? kvr_policy_least_loaded(s->spare, k2) : NULL;
    }
    if (!least)
        least = kvr_policy_least_loaded(el, n);
    out->decision = refused ? "load_balance"
                    : !tlen && !any_exact ? "empty_key_min_load"
                                          : "low_match_min_load";
    for (size_t i = 0; i < n; i++)
        if (el[i] == least)
            return chose(s, el, i, k, out);
    return -1;
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
    if (k && k->text && k->text_len) {
        if (k->refresh_later)
            kvr_prefix_index_insert_new(s->index, w->id, k->text, k->text_len, k->kept);
        else
            kvr_prefix_index_insert_kept(s->index, w->id, k->text, k->text_len, k->kept);
    }
    kvr_session_map_sweep(s->sessions, now, TEACH_SWEEP);
}

/* What another replica taught: the same bindings as ca_teach, from block keys and a session
 * digest. A session older than the TTL is not bound (it would have expired here too). */
static void ca_learn(void *self, kvr_worker *w, const kvr_learned *l)
{
    ca_state *s = self;
    uint64_t now = kvr_now_ms();
    sync_capacity(s, w);
    if (l->correct) {
        if (l->nkeys && l->block_bytes == s->cfg.block_bytes)
            kvr_prefix_index_correct_key(s->index, w->id, l->keys[0], l->keep_blocks);
        return;
    }
    uint64_t ttl_ms = s->cfg.session_ttl_s * 1000;
    if (l->ttl_ms && (!ttl_ms || l->ttl_ms < ttl_ms))
        ttl_ms = l->ttl_ms;
    if (l->session && l->session_len && (!ttl_ms || l->age_ms < ttl_ms))
        kvr_session_map_bind(s->sessions, l->session, l->session_len, w->id,
                             now > l->age_ms ? now - l->age_ms : 0);
    if (l->nkeys && l->block_bytes == s->cfg.block_bytes)
        kvr_prefix_index_insert_keys(s->index, w->id, l->keys, l->nkeys);
}

/* Self-correcting index (optimistic with fallback): the index predicted chosen_match of the
 * prompt cached on `w`, the worker reported `cached` of `prompt` tokens. */
static int ca_correct(void *self, kvr_worker *w, const kvr_route_keys *k, const kvr_pick *pick,
                      int64_t cached, int64_t prompt)
{
    ca_state *s = self;
    if (prompt <= 0 || cached < 0)
        return 0;
    double ratio = cached < prompt ? (double)cached / (double)prompt : 1.0;
    double predicted = pick->chosen_match > 0 ? pick->chosen_match : 0;
    size_t B = s->cfg.block_bytes;
    if (ratio > predicted) {
        /* It held more than the index knew: a cap lowered by corrections was too low. */
        double extra = (ratio - predicted) * (double)prompt * KVR_PREFIX_INDEX_BYTES_PER_TOKEN;
        kvr_prefix_index_raise_capacity(s->index, w->id, (size_t)(extra / (double)B));
        return 0;
    }
    if (!pick->use.runs || !k || !k->text || !k->text_len || ratio >= predicted * EVICTED_SHARE)
        return 0;
    /* The reported tokens cover that share of the routing text; the block after them is the
     * first the worker no longer had. */
    size_t first_missing = (size_t)(ratio * (double)k->text_len) / B;
    /* The cap never falls below twice the request's own blocks: the index records its prompt
     * and (completion teaching) its prompt followed by the reply, and the conversation's next
     * turn, this text and more, must fit too, or each turn would evict its predecessor's tail
     * and no match on this worker would reach 1.00 again. */
    size_t own = (k->text_len + B - 1) / B;
    return kvr_prefix_index_correct(s->index, w->id, &pick->use, first_missing, 2 * own) >= 0;
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

/* precise: the prompt's blocks count as resident on the worker it was just sent to, until an
 * event settles them or --kv-speculative-ms passes (llm-d's speculative indexing), so a burst
 * sharing a new prefix is not scattered while the worker's events are in flight. */
static void precise_sent(void *self, kvr_worker *w, const kvr_route_keys *k);

/* An attempt left for `w`: a request that starts a conversation counts for the spread of new
 * conversations (precise also records its blocks as speculative there). */
static void ca_sent(void *self, kvr_worker *w, const kvr_route_keys *k)
{
    ca_state *s = self;
    uint64_t now = kvr_now_ms();
    size_t owner, matched = 0, id = w->id;
    if (!k || !k->text_len ||
        (k->session_len && kvr_session_map_get(s->sessions, k->session, k->session_len, now,
                                               &owner) == 1))
        return;
    kvr_prefix_index_match_kept(s->index, k->text, k->text_len, k->kept, &id, 1,
                                &matched);
    if (new_conversation(k, (double)matched / (double)k->text_len, s, NULL, 0))
        count_start(s, w->id, now);
}

static void precise_sent(void *self, kvr_worker *w, const kvr_route_keys *k)
{
    ca_state *s = self;
    ca_sent(self, w, k);
    if (!s->cfg.kv || !k || !k->tokens || !k->ntokens ||
        kvr_kv_events_trust(s->cfg.kv, w->id) == KVR_KV_FALLBACK)
        return;
    uint64_t ttl = kvr_kv_events_speculative_ms(s->cfg.kv);
    size_t n;
    block_keys_reset(s);
    const uint64_t *keys = ttl ? block_keys(s, k, worker_block_size(s, w->id), &n) : NULL;
    if (keys && n)
        kvr_kv_index_speculate(kvr_kv_events_index(s->cfg.kv), w->id, keys, n,
                               kvr_now_ms() + ttl);
}

static void *precise_create(const kvr_policy_cfg *cfg, const char *model)
{
    ca_state *s = ca_create(cfg, model);
    if (s)
        s->precise = 1;
    return s;
}

/* What cache_aware and precise share: one state, one decision procedure. */
#define CA_OPS_COMMON                                                                         \
    .pick = ca_pick, .teach = ca_teach, .forget_worker = ca_forget, .destroy = ca_destroy,     \
    .uses_keys = 1, .explain = kvr_cache_aware_explain, .stats = kvr_cache_aware_stats_get,    \
    .worker_stats = kvr_cache_aware_worker_stats_get, .sweep = kvr_cache_aware_sweep,          \
    .retune = ca_retune, .correct = ca_correct, .learn = ca_learn

const kvr_policy_ops kvr_policy_precise = {
    .name = "precise",
    .create = precise_create,
    .sent = precise_sent,
    .uses_tokens = 1,
    CA_OPS_COMMON,
};

const kvr_policy_ops kvr_policy_cache_aware = {
    .name = "cache_aware",
    .create = ca_create,
    .sent = ca_sent,
    CA_OPS_COMMON,
};

/* pipeline and cost score workers with this instance's indexes and session map. */
int kvr_cache_aware_scores(void *self, kvr_worker *const *el, size_t n, const kvr_route_keys *k,
                           kvr_cache_aware_score *out, int *session_idx)
{
    ca_state *s = self;
    *session_idx = -1;
    if (!n || scratch(s, n) < 0)
        return -1;
    size_t tlen = k && k->text ? k->text_len : 0;
    if (tlen) {
        for (size_t i = 0; i < n; i++)
            s->ids[i] = el[i]->id;
        kvr_prefix_index_match_kept(s->index, k->text, tlen, k->kept, s->ids, n, s->matched);
    } else {
        memset(s->matched, 0, n * sizeof(*s->matched));
    }
    score_exact(s, el, n, k);
    for (size_t i = 0; i < n; i++)
        out[i] = (kvr_cache_aware_score){
            .ratio = s->exact[i] ? s->ratio[i] : tlen ? (double)s->matched[i] / (double)tlen : 0,
            .matched_bytes = s->matched[i],
            .exact = s->exact[i],
            .kv_blocks = s->kv_run[i],
            .block_size = s->exact[i] ? worker_block_size(s, el[i]->id) : 0,
        };
    size_t owner;
    if (k && k->session && k->session_len &&
        kvr_session_map_get(s->sessions, k->session, k->session_len, kvr_now_ms(), &owner) == 1)
        for (size_t i = 0; i < n; i++)
            if (el[i]->id == owner)
                *session_idx = (int)i;
    return 0;
}
