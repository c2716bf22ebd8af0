/* rendezvous_hash policy (highest random weight): the eligible worker with the highest
 * XXH3(URL, seed = key hash); with unequal target weights, the highest weighted score
 * -weight / ln(u) (kvr_rendezvous_weighted), so each worker owns its weight's share of the keys.
 *
 * Bounded loads (hash_load_factor > 0, kvr_load_bound): an owner at its bound is passed over
 * for the next worker in score order under its bound, i.e. the best-scoring worker under its
 * bound; were all at their bound (factor < 1), the least loaded. Each such pick counts in
 * hash_overflows. Stateless apart from the tunables and that counter. */
#include <stdlib.h>
#include <string.h>

#include "routing/hashring.h"
#include "routing/policies.h"
#include "util/rand.h"

typedef struct rv_state {
    size_t block_bytes;
    double load_factor;
    uint64_t overflows;
} rv_state;

static int rv_retune(void *self, const kvr_policy_cfg *cfg)
{
    rv_state *s = self;
    s->block_bytes = cfg && cfg->block_bytes ? cfg->block_bytes : 64;
    s->load_factor = cfg ? cfg->hash_load_factor : 0;
    return 0;
}

static void *rv_create(const kvr_policy_cfg *cfg, const char *model)
{
    (void)model;
    rv_state *s = calloc(1, sizeof(*s));
    if (s)
        rv_retune(s, cfg);
    return s;
}

static void rv_destroy(void *self)
{
    free(self);
}

/* One worker's score: the raw hash with equal weights (the unweighted order exactly), else
 * the weighted score; both compare as doubles only among themselves. */
typedef struct score {
    uint64_t raw;
    double weighted;
} score;

static int cmp_score(score a, score b, int weighted)
{
    if (weighted)
        return a.weighted < b.weighted ? -1 : a.weighted > b.weighted;
    return a.raw < b.raw ? -1 : a.raw > b.raw;
}

/* Highest score among the workers `ok` admits (reservoir ties); -1 when none. */
typedef struct best {
    long i;
    score s;
    uint64_t ties;
} best;

static void consider(best *b, long i, score s, int weighted)
{
    int c = b->i < 0 ? 1 : cmp_score(s, b->s, weighted);
    if (c > 0) {
        b->i = i;
        b->s = s;
        b->ties = 1;
    } else if (c == 0 && kvr_rand_below(++b->ties) == 0) {
        b->i = i;
    }
}

/* The decision; returns 1 when it passed over the key's owner (an overflow). */
static int decide(rv_state *s, kvr_worker *const *el, size_t n, const kvr_route_keys *k,
                  kvr_pick *out)
{
    out->decision = "rendezvous_hash";
    out->match = -1;
    const double *wts = kvr_policy_weights(k, n);
    uint64_t h;
    if (!kvr_hash_route_key(k ? k->session : NULL, k ? k->session_len : 0, k ? k->text : NULL,
                            k ? k->text_len : 0, s->block_bytes, &h)) {
        out->worker = el[kvr_policy_weighted_index(wts, n)];
        return 0;
    }
    kvr_load_bound bound = kvr_load_bound_make(el, n, k, s->load_factor);
    best owner = {.i = -1}, under = {.i = -1};
    for (size_t i = 0; i < n; i++) {
        score sc = {kvr_rendezvous_score(h, el[i]->url, strlen(el[i]->url)), 0};
        if (wts)
            sc.weighted = kvr_rendezvous_weighted(sc.raw, wts[i]);
        consider(&owner, (long)i, sc, wts != NULL);
        if (!kvr_load_bound_over(&bound, el[i], kvr_policy_weight(k, i)))
            consider(&under, (long)i, sc, wts != NULL);
    }
    if (under.i >= 0 && under.i == owner.i) {
        out->worker = el[owner.i];
        return 0;
    }
    out->worker = under.i >= 0 ? el[under.i] : kvr_policy_least_loaded_w(el, wts, n);
    return out->worker != el[owner.i];
}

static int rv_pick(void *self, kvr_worker *const *el, size_t n, const kvr_route_keys *k,
                   kvr_pick *out)
{
    rv_state *s = self;
    if (!n)
        return -1;
    if (decide(s, el, n, k, out))
        s->overflows++;
    return 0;
}

/* As pick without counting; a worker at its load bound shows as overloaded. */
static int rv_explain(void *self, kvr_worker *const *el, size_t n, const kvr_route_keys *k,
                      kvr_explain_row *rows, kvr_pick *out)
{
    rv_state *s = self;
    if (!n)
        return -1;
    decide(s, el, n, k, out);
    kvr_load_bound_rows(el, n, k, s->load_factor, rows);
    return 0;
}

static void rv_stats(void *self, kvr_policy_stats *out)
{
    out->hash_overflows = ((rv_state *)self)->overflows;
}

const kvr_policy_ops kvr_policy_rendezvous_hash = {
    .name = "rendezvous_hash",
    .create = rv_create,
    .pick = rv_pick,
    .teach = NULL,
    .forget_worker = NULL,
    .destroy = rv_destroy,
    .uses_keys = 1,
    .text_without_session = 1,
    .explain = rv_explain,
    .stats = rv_stats,
    .retune = rv_retune,
};
