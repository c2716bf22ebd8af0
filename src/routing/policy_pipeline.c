/* pipeline policy (seed 004): filter (the route's eligible set) → weighted scorers → argmax,
 * ties at random. The scorers are in routing/scorers.h; their weights are the route's
 * `scorers` (kvr_policy_cfg.scorers). What it learns (sessions, prefixes, KV residency) lives in
 * its embedded precise instance (routing/scored.h). Label "pipeline". */
#include <stdlib.h>

#include "routing/policies.h"
#include "routing/scored.h"
#include "routing/scorers.h"
#include "util/rand.h"
#include "util/time.h"

typedef struct pl_state {
    kvr_scored b;                  /* first: the delegating ops take the state as a kvr_scored */
    double *ratio;                 /* per-pick scratch, cap entries */
    double (*vals)[KVR_NSCORERS];
    size_t cap;
} pl_state;

static void pl_destroy(void *self)
{
    pl_state *s = self;
    if (!s)
        return;
    kvr_scored_fini(&s->b);
    free(s->ratio);
    free(s->vals);
    free(s);
}

static void *pl_create(const kvr_policy_cfg *cfg, const char *model)
{
    pl_state *s = calloc(1, sizeof(*s));
    if (s && kvr_scored_init(&s->b, cfg, model) < 0) {
        pl_destroy(s);
        return NULL;
    }
    return s;
}

static int grow(pl_state *s, size_t n)
{
    if (n <= s->cap)
        return 0;
    double *r = realloc(s->ratio, n * sizeof(*r));
    if (r)
        s->ratio = r;
    double(*v)[KVR_NSCORERS] = realloc(s->vals, n * sizeof(*v));
    if (v)
        s->vals = v;
    if (!r || !v)
        return -1;
    s->cap = n;
    return 0;
}

static int decide(pl_state *s, kvr_worker *const *el, size_t n, const kvr_route_keys *k,
                  kvr_pick *out, kvr_explain_row *rows)
{
    int sess;
    if (!n || grow(s, n) < 0 || kvr_scored_score(&s->b, el, n, k, &sess) < 0)
        return -1;
    for (size_t i = 0; i < n; i++)
        s->ratio[i] = s->b.sc[i].ratio;
    kvr_scorers_eval(el, n, k ? k->weights : NULL, s->ratio, sess, kvr_now_ms(), s->vals);
    /* Reservoir sampling over the best sum, so ties are uniform, never by list order. */
    size_t best = 0;
    double top = 0;
    uint64_t ties = 0;
    for (size_t i = 0; i < n; i++) {
        double sum = kvr_scorers_sum(s->vals[i], s->b.cfg.scorers);
        if (rows) {
            kvr_scored_row(&s->b, el, i, sess, k, &rows[i]);
            rows[i].scored = 1;
            for (int j = 0; j < KVR_NSCORERS; j++)
                rows[i].scorers[j] = s->vals[i][j];
            rows[i].score = sum;
        }
        if (!ties || sum > top) {
            best = i;
            top = sum;
            ties = 1;
        } else if (sum == top && kvr_rand_below(++ties) == 0) {
            best = i;
        }
    }
    out->decision = "pipeline";
    kvr_scored_chose(&s->b, el, n, best, k, out);
    return 0;
}

static int pl_pick(void *self, kvr_worker *const *el, size_t n, const kvr_route_keys *k,
                   kvr_pick *out)
{
    return decide(self, el, n, k, out, NULL);
}

static int pl_explain(void *self, kvr_worker *const *el, size_t n, const kvr_route_keys *k,
                      kvr_explain_row *rows, kvr_pick *out)
{
    return decide(self, el, n, k, out, rows);
}

const kvr_policy_ops kvr_policy_pipeline = {
    .name = "pipeline",
    .create = pl_create,
    .pick = pl_pick,
    .teach = kvr_scored_teach,
    .learn = kvr_scored_learn,
    .forget_worker = kvr_scored_forget,
    .destroy = pl_destroy,
    .uses_keys = 1,
    .explain = pl_explain,
    .stats = kvr_scored_stats,
    .worker_stats = kvr_scored_worker_stats,
    .sweep = kvr_scored_sweep,
    .retune = kvr_scored_retune,
    .sent = kvr_scored_sent,
    .uses_tokens = 2,
};
