/* lmcache_aware policy (seed 004): prefers the worker whose LMCache reports the most free
 * capacity (1 − occupancy), then the lower in-flight load, then chance. What a worker's
 * endpoint answered is read from the worker (src/workers/lmcache.h polls it); a worker without
 * a fresh, well-formed answer is neutral: it ranks as if its free capacity were the median of
 * the workers that answered (0.5 when none did), so a broken endpoint never excludes a worker
 * nor makes it a favourite. One that answered cache_available=false ranks below every other. */
#include <stdlib.h>

#include "routing/policies.h"
#include "util/rand.h"
#include "util/time.h"

typedef struct lm_state {
    double *frees; /* scratch for the median, grown to the largest eligible set seen */
    size_t cap;
} lm_state;

typedef struct rank {
    int tier;     /* 1: available or neutral; 0: its cache said unavailable */
    double free;  /* free capacity, or the neutral stand-in */
} rank;

static void *lm_create(const kvr_policy_cfg *cfg, const char *model)
{
    (void)cfg;
    (void)model;
    return calloc(1, sizeof(lm_state));
}

static void lm_destroy(void *self)
{
    lm_state *s = self;
    free(s->frees);
    free(s);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median free capacity of the workers with a fresh available answer; 0.5 when none. */
static int neutral_free(lm_state *s, kvr_worker *const *el, size_t n, uint64_t now, double *out)
{
    if (n > s->cap) {
        double *f = realloc(s->frees, n * sizeof(*f));
        if (!f)
            return -1;
        s->frees = f;
        s->cap = n;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (kvr_worker_lmcache(el[i], now) == KVR_LMCACHE_AVAILABLE)
            s->frees[k++] = 1 - el[i]->lmcache_occupancy;
    if (!k) {
        *out = 0.5;
        return 0;
    }
    qsort(s->frees, k, sizeof(*s->frees), cmp_double);
    *out = k % 2 ? s->frees[k / 2] : (s->frees[k / 2 - 1] + s->frees[k / 2]) / 2;
    return 0;
}

static rank rank_of(const kvr_worker *w, uint64_t now, double neutral)
{
    switch (kvr_worker_lmcache(w, now)) {
    case KVR_LMCACHE_AVAILABLE: return (rank){1, 1 - w->lmcache_occupancy};
    case KVR_LMCACHE_UNAVAILABLE: return (rank){0, 1 - w->lmcache_occupancy};
    default: return (rank){1, neutral};
    }
}

/* <0 when (ra, a) is better than (rb, b), 0 when they tie. */
static int compare(rank ra, const kvr_worker *a, rank rb, const kvr_worker *b)
{
    if (ra.tier != rb.tier)
        return ra.tier > rb.tier ? -1 : 1;
    if (ra.free != rb.free)
        return ra.free > rb.free ? -1 : 1;
    if (kvr_worker_load(a) != kvr_worker_load(b))
        return kvr_worker_load(a) < kvr_worker_load(b) ? -1 : 1;
    return 0;
}

static int lm_pick(void *self, kvr_worker *const *el, size_t n, const kvr_route_keys *k,
                   kvr_pick *out)
{
    (void)k;
    if (!n)
        return -1;
    uint64_t now = kvr_now_ms();
    double neutral;
    if (neutral_free(self, el, n, now, &neutral) < 0)
        return -1;
    out->decision = "lmcache_aware";
    out->match = -1;
    /* Reservoir sampling over the best, so ties are uniform, never by list order. */
    kvr_worker *best = NULL;
    rank rb = {0, 0};
    uint64_t ties = 0;
    for (size_t i = 0; i < n; i++) {
        rank r = rank_of(el[i], now, neutral);
        int c = best ? compare(r, el[i], rb, best) : -1;
        if (c < 0) {
            best = el[i];
            rb = r;
            ties = 1;
        } else if (c == 0 && kvr_rand_below(++ties) == 0) {
            best = el[i];
        }
    }
    out->worker = best;
    return 0;
}

const kvr_policy_ops kvr_policy_lmcache_aware = {
    .name = "lmcache_aware",
    .create = lm_create,
    .pick = lm_pick,
    .destroy = lm_destroy,
};
