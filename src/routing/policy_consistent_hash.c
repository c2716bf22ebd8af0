/* consistent_hash policy: ring of round(160 × target weight) points per worker keyed by its URL
 * (routing/hashring.h). Workers join the ring the first time they are eligible (and again when
 * their weight changed) and leave it on forget_worker; an ineligible worker stays on the ring
 * and is skipped, so its keys go to the next distinct worker clockwise and come back when it
 * returns.
 *
 * Bounded loads (hash_load_factor > 0, kvr_load_bound): an owner at its bound is passed over the
 * same way, for the next distinct worker clockwise under its bound, so a hot key spills to the
 * workers that follow it on the ring instead of piling up on one; the key comes back once the
 * owner drains. Were all at their bound (factor < 1), the least loaded takes it. Each such
 * pick counts in hash_overflows. */
#include <stdlib.h>

#include "routing/hashring.h"
#include "routing/policies.h"
#include "util/rand.h"

typedef struct ch_state {
    kvr_hashring *ring;
    size_t block_bytes;
    double load_factor;
    uint64_t overflows;
    const char **seen_url;     /* by worker id: the url pointer added, to skip re-adding */
    unsigned *seen_vnodes;     /* by worker id: its points when added */
    size_t nseen;
} ch_state;

static void ch_destroy(void *self)
{
    ch_state *s = self;
    if (!s)
        return;
    kvr_hashring_destroy(s->ring);
    free(s->seen_url);
    free(s->seen_vnodes);
    free(s);
}

static int ch_retune(void *self, const kvr_policy_cfg *cfg)
{
    ch_state *s = self;
    s->block_bytes = cfg && cfg->block_bytes ? cfg->block_bytes : 64;
    s->load_factor = cfg ? cfg->hash_load_factor : 0;
    return 0;
}

static void *ch_create(const kvr_policy_cfg *cfg, const char *model)
{
    (void)model;
    ch_state *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    ch_retune(s, cfg);
    s->ring = kvr_hashring_create(KVR_HASHRING_VNODES);
    if (!s->ring) {
        ch_destroy(s);
        return NULL;
    }
    return s;
}

static int grow_seen(ch_state *s, size_t id)
{
    size_t n = s->nseen ? s->nseen : 16;
    while (n <= id)
        n *= 2;
    const char **p = realloc(s->seen_url, n * sizeof(*p));
    if (!p)
        return -1;
    s->seen_url = p;
    unsigned *v = realloc(s->seen_vnodes, n * sizeof(*v));
    if (!v)
        return -1;
    s->seen_vnodes = v;
    for (size_t i = s->nseen; i < n; i++) {
        p[i] = NULL;
        v[i] = 0;
    }
    s->nseen = n;
    return 0;
}

/* Puts `w` on the ring unless it is there with the same URL and weight. */
static int ensure_member(ch_state *s, const kvr_worker *w, double weight)
{
    unsigned vn = kvr_hashring_vnodes_for(weight);
    if (w->id < s->nseen && s->seen_url[w->id] == w->url && s->seen_vnodes[w->id] == vn)
        return 0;
    if (w->id >= s->nseen && grow_seen(s, w->id) < 0)
        return -1;
    if (kvr_hashring_add_vnodes(s->ring, w->id, w->url, vn) < 0)
        return -1;
    s->seen_url[w->id] = w->url;
    s->seen_vnodes[w->id] = vn;
    return 0;
}

typedef struct el_ctx {
    kvr_worker *const *el;
    size_t n;
    const kvr_route_keys *k;
    kvr_load_bound bound;
    kvr_worker *owner;         /* first eligible worker clockwise: the key's owner */
    kvr_worker *found;
} el_ctx;

static int may_take(void *ctx, size_t id)
{
    el_ctx *c = ctx;
    for (size_t i = 0; i < c->n; i++)
        if (c->el[i]->id == id) {
            if (!c->owner)
                c->owner = c->el[i];
            if (kvr_load_bound_over(&c->bound, c->el[i], kvr_policy_weight(c->k, i)))
                return 0;
            c->found = c->el[i];
            return 1;
        }
    return 0;
}

/* The decision; returns 1 when it passed over the key's owner (an overflow). */
static int decide(ch_state *s, kvr_worker *const *el, size_t n, const kvr_route_keys *k,
                  kvr_pick *out)
{
    out->decision = "consistent_hash";
    out->match = -1;
    const double *wts = kvr_policy_weights(k, n);
    uint64_t h;
    if (!kvr_hash_route_key(k ? k->session : NULL, k ? k->session_len : 0, k ? k->text : NULL,
                            k ? k->text_len : 0, s->block_bytes, &h)) {
        out->worker = el[kvr_policy_weighted_index(wts, n)];
        return 0;
    }
    for (size_t i = 0; i < n; i++)
        if (ensure_member(s, el[i], kvr_policy_weight(k, i)) < 0) {
            /* Out of memory: still answer, from the workers we know. */
            break;
        }
    el_ctx c = {el, n, k, kvr_load_bound_make(el, n, k, s->load_factor), NULL, NULL};
    size_t id;
    if (kvr_hashring_lookup(s->ring, h, may_take, &c, &id) == 0 && c.found) {
        out->worker = c.found;
        return c.found != c.owner;
    }
    if (!c.owner) { /* no eligible worker on the ring (out of memory) */
        out->worker = el[kvr_policy_weighted_index(wts, n)];
        return 0;
    }
    out->worker = kvr_policy_least_loaded_w(el, wts, n);
    return out->worker != c.owner;
}

static int ch_pick(void *self, kvr_worker *const *el, size_t n, const kvr_route_keys *k,
                   kvr_pick *out)
{
    ch_state *s = self;
    if (!n)
        return -1;
    if (decide(s, el, n, k, out))
        s->overflows++;
    return 0;
}

/* As pick without counting; a worker at its load bound shows as overloaded. */
static int ch_explain(void *self, kvr_worker *const *el, size_t n, const kvr_route_keys *k,
                      kvr_explain_row *rows, kvr_pick *out)
{
    ch_state *s = self;
    if (!n)
        return -1;
    decide(s, el, n, k, out);
    kvr_load_bound_rows(el, n, k, s->load_factor, rows);
    return 0;
}

static void ch_stats(void *self, kvr_policy_stats *out)
{
    out->hash_overflows = ((ch_state *)self)->overflows;
}

static void ch_forget(void *self, kvr_worker *w)
{
    ch_state *s = self;
    kvr_hashring_remove(s->ring, w->id);
    if (w->id < s->nseen)
        s->seen_url[w->id] = NULL;
}

const kvr_policy_ops kvr_policy_consistent_hash = {
    .name = "consistent_hash",
    .create = ch_create,
    .pick = ch_pick,
    .teach = NULL,
    .forget_worker = ch_forget,
    .destroy = ch_destroy,
    .uses_keys = 1,
    .text_without_session = 1,
    .explain = ch_explain,
    .stats = ch_stats,
    .retune = ch_retune,
};
