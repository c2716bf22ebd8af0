/* cost policy: the eligible worker that would deliver this request's first token soonest by
 * its predicted prefill (routing/policy_cost.h), random ties; label "min_cost". No thresholds:
 * pending work and speeds are measured, the match is predicted by the embedded precise
 * instance (routing/scored.h). A request whose session is bound to a worker still goes there
 * while that worker's cost is within 2× of the least ("session_id_match"): a conversation's
 * next turn usually finds its whole history cached there, and a follow-up elsewhere would
 * compute it again. */
#include "routing/policy_cost.h"

#include <stdlib.h>
#include <string.h>

#include "routing/policies.h"
#include "routing/scored.h"
#include "util/rand.h"

/* Each new sample weighs older ones down by this much (a window of ~20 samples): the rate
 * follows a worker whose speed changes (load, other tenants) without jumping on one outlier. */
#define RATE_DECAY 0.95
/* The session's worker keeps it while its cost is at most this times the least. */
#define SESSION_SLACK 2.0

typedef struct cost_worker {
    double pending;            /* prompt tokens sent, first byte not seen */
    kvr_prefill_rate rate;
} cost_worker;

typedef struct cost_state {
    kvr_scored b;              /* first: the delegating ops take the state as a kvr_scored */
    cost_worker *w;            /* by worker id */
    size_t nw;
    double *unc, *spt, *cost;  /* per-pick scratch, cap entries */
    size_t cap;
} cost_state;

void kvr_prefill_rate_observe(kvr_prefill_rate *r, double tokens, double ms)
{
    if (!(r->n > 0) || ms < r->base_ms)
        r->base_ms = ms;
    r->ms = r->ms * RATE_DECAY + ms;
    r->tokens = r->tokens * RATE_DECAY + tokens;
    r->n = r->n * RATE_DECAY + 1;
}

double kvr_prefill_rate_spt(const kvr_prefill_rate *r)
{
    double prefill_ms = r->ms - r->n * r->base_ms;
    return r->tokens > 0 && prefill_ms > 0 ? prefill_ms / 1000.0 / r->tokens : 0;
}

double kvr_cost_uncached(double prompt_tokens, double matched_tokens)
{
    double u = prompt_tokens - matched_tokens;
    return u > 1 ? u : 1;
}

double kvr_cost_predict(double pending_tokens, double uncached_tokens, double spt)
{
    return (pending_tokens + uncached_tokens) * spt;
}

static void cost_destroy(void *self)
{
    cost_state *s = self;
    if (!s)
        return;
    kvr_scored_fini(&s->b);
    free(s->w);
    free(s->unc);
    free(s->spt);
    free(s->cost);
    free(s);
}

static void *cost_create(const kvr_policy_cfg *cfg, const char *model)
{
    cost_state *s = calloc(1, sizeof(*s));
    if (s && kvr_scored_init(&s->b, cfg, model) < 0) {
        cost_destroy(s);
        return NULL;
    }
    return s;
}

/* The worker's entry, NULL when it cannot be made (reads then see an idle, unmeasured one). */
static cost_worker *entry(cost_state *s, size_t id, int make)
{
    if (id < s->nw)
        return &s->w[id];
    if (!make)
        return NULL;
    size_t n = s->nw ? s->nw : 16;
    while (n <= id)
        n *= 2;
    cost_worker *p = realloc(s->w, n * sizeof(*p));
    if (!p)
        return NULL;
    memset(p + s->nw, 0, (n - s->nw) * sizeof(*p));
    s->w = p;
    s->nw = n;
    return &p[id];
}

static int grow(cost_state *s, size_t n)
{
    if (n <= s->cap)
        return 0;
    double *a = realloc(s->unc, n * sizeof(*a));
    if (a)
        s->unc = a;
    double *b = realloc(s->spt, n * sizeof(*b));
    if (b)
        s->spt = b;
    double *c = realloc(s->cost, n * sizeof(*c));
    if (c)
        s->cost = c;
    if (!a || !b || !c)
        return -1;
    s->cap = n;
    return 0;
}

/* Each eligible worker's seconds per token: its own once measured, else the mean of the
 * measured ones (equal until measured), else the default. */
static void speeds(cost_state *s, kvr_worker *const *el, size_t n)
{
    double sum = 0;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        cost_worker *e = entry(s, el[i]->id, 0);
        s->spt[i] = e ? kvr_prefill_rate_spt(&e->rate) : 0;
        if (s->spt[i] > 0) {
            sum += s->spt[i];
            k++;
        }
    }
    for (size_t i = 0; i < n; i++)
        if (!(s->spt[i] > 0))
            s->spt[i] = k ? sum / (double)k : KVR_COST_DEFAULT_SPT;
}

static int decide(cost_state *s, kvr_worker *const *el, size_t n, const kvr_route_keys *k,
                  kvr_pick *out, kvr_explain_row *rows)
{
    int sess;
    if (!n || grow(s, n) < 0 || kvr_scored_score(&s->b, el, n, k, &sess) < 0)
        return -1;
    speeds(s, el, n);
    double prompt = kvr_scored_prompt_tokens(k);
    size_t best = 0;
    uint64_t ties = 0;
    for (size_t i = 0; i < n; i++) {
        cost_worker *e = entry(s, el[i]->id, 0);
        double pending = e ? e->pending : 0;
        s->unc[i] = kvr_cost_uncached(prompt, kvr_scored_matched_tokens(&s->b, i, k));
        s->cost[i] = kvr_cost_predict(pending, s->unc[i], s->spt[i]);
        if (rows) {
            kvr_scored_row(&s->b, el, i, sess, k, &rows[i]);
            rows[i].scored = 2;
            rows[i].score = s->cost[i];
            rows[i].prefill_pending = pending;
            rows[i].prefill_uncached = s->unc[i];
            rows[i].seconds_per_token = s->spt[i];
        }
        /* Reservoir sampling over the least, so ties are uniform, never by list order. */
        if (!ties || s->cost[i] < s->cost[best]) {
            best = i;
            ties = 1;
        } else if (s->cost[i] == s->cost[best] && kvr_rand_below(++ties) == 0) {
            best = i;
        }
    }
    out->decision = "min_cost";
    if (sess >= 0 && s->cost[sess] <= SESSION_SLACK * s->cost[best]) {
        best = (size_t)sess;
        out->decision = "session_id_match";
    }
    kvr_scored_chose(&s->b, el, n, best, k, out);
    out->prefill_tokens = s->unc[best];
    return 0;
}

static int cost_pick(void *self, kvr_worker *const *el, size_t n, const kvr_route_keys *k,
                     kvr_pick *out)
{
    return decide(self, el, n, k, out, NULL);
}

static int cost_explain(void *self, kvr_worker *const *el, size_t n, const kvr_route_keys *k,
                        kvr_explain_row *rows, kvr_pick *out)
{
    return decide(self, el, n, k, out, rows);
}

static double cost_prefill_start(void *self, kvr_worker *w, double tokens)
{
    cost_worker *e = entry(self, w->id, 1);
    if (!e)
        return 0;
    double ahead = e->pending;
    e->pending += tokens;
    return ahead;
}

static void cost_prefill_end(void *self, kvr_worker *w, double tokens, double ahead, double ms)
{
    cost_worker *e = entry(self, w->id, 1);
    if (!e)
        return;
    e->pending -= tokens;
    if (e->pending < 1e-6) /* what rounding leaves once nothing is pending */
        e->pending = 0;
    /* The first token waited for the prefill pending ahead of it as well as its own. */
    if (ms >= 0 && ahead + tokens > 0)
        kvr_prefill_rate_observe(&e->rate, ahead + tokens, ms);
}

/* A worker that restarted or was replaced may run at another speed: measure it afresh. Its
 * pending prefill stays: those attempts are still in flight and will end. */
static void cost_forget(void *self, kvr_worker *w)
{
    cost_worker *e = entry(self, w->id, 0);
    if (e)
        e->rate = (kvr_prefill_rate){0};
    kvr_scored_forget(self, w);
}

const kvr_policy_ops kvr_policy_cost = {
    .name = "cost",
    .create = cost_create,
    .pick = cost_pick,
    .teach = kvr_scored_teach,
    .learn = kvr_scored_learn,
    .forget_worker = cost_forget,
    .destroy = cost_destroy,
    .uses_keys = 1,
    .explain = cost_explain,
    .stats = kvr_scored_stats,
    .worker_stats = kvr_scored_worker_stats,
    .sweep = kvr_scored_sweep,
    .retune = kvr_scored_retune,
    .sent = kvr_scored_sent,
    .uses_tokens = 2,
    .prefill_start = cost_prefill_start,
    .prefill_end = cost_prefill_end,
};
