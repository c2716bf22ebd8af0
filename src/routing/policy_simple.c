/* The load-only policies: round_robin, random, least_load, power_of_two. They ignore the
 * routing keys but read the target weights that travel with them (kvr_route_keys.weights);
 * their decision label is their own name (DESIGN §10).
 *
 * round_robin is nginx's smooth weighted round robin: on each pick every eligible worker's
 * `current` grows by its weight, the largest `current` wins (first in target order on ties) and
 * loses the sum of the weights. Weights 5, 1, 1 give a a b a c a a: each worker's share
 * is exact over every cycle and the heavy one's turns are spread, not bunched. Equal weights
 * rotate in target order. State is per worker id, so a worker leaving the eligible set for a
 * while keeps its place and the others go on rotating among themselves. */
#include <stdlib.h>

#include "routing/policies.h"
#include "util/rand.h"

typedef struct rr_state {
    double *current;          /* by worker id */
    size_t ncurrent;
} rr_state;

static void *rr_create(const kvr_policy_cfg *cfg, const char *model)
{
    (void)cfg;
    (void)model;
    return calloc(1, sizeof(rr_state));
}

static void rr_destroy(void *self)
{
    rr_state *s = self;
    free(s->current);
    free(s);
}

static void *stateless_create(const kvr_policy_cfg *cfg, const char *model)
{
    (void)cfg;
    (void)model;
    static char token;
    return &token;
}

static void stateless_destroy(void *self)
{
    (void)self;
}

/* Room for every eligible worker's id in s->current; -1 out of memory. */
static int rr_reserve(rr_state *s, kvr_worker *const *el, size_t n)
{
    size_t need = 0;
    for (size_t i = 0; i < n; i++)
        if (el[i]->id + 1 > need)
            need = el[i]->id + 1;
    if (need <= s->ncurrent)
        return 0;
    size_t cap = s->ncurrent ? s->ncurrent : 16;
    while (cap < need)
        cap *= 2;
    double *c = realloc(s->current, cap * sizeof(*c));
    if (!c)
        return -1;
    for (size_t i = s->ncurrent; i < cap; i++)
        c[i] = 0;
    s->current = c;
    s->ncurrent = cap;
    return 0;
}

/* The smooth WRR choice; `commit` applies the step (explain only looks). */
static size_t rr_choose(rr_state *s, kvr_worker *const *el, size_t n, const kvr_route_keys *k,
                        int commit)
{
    double total = 0, best_cur = 0;
    size_t best = 0;
    for (size_t i = 0; i < n; i++) {
        double w = kvr_policy_weight(k, i), cur = s->current[el[i]->id] + w;
        total += w;
        if (i == 0 || cur > best_cur) {
            best = i;
            best_cur = cur;
        }
        if (commit)
            s->current[el[i]->id] = cur;
    }
    if (commit)
        s->current[el[best]->id] -= total;
    return best;
}

static int rr_pick(void *self, kvr_worker *const *el, size_t n, const kvr_route_keys *k,
                   kvr_pick *out)
{
    rr_state *s = self;
    if (!n)
        return -1;
    out->decision = "round_robin";
    out->match = -1;
    /* Out of memory: still answer, unweighted and at random. */
    out->worker = rr_reserve(s, el, n) < 0 ? el[kvr_rand_below(n)] : el[rr_choose(s, el, n, k, 1)];
    return 0;
}

static int rr_explain(void *self, kvr_worker *const *el, size_t n, const kvr_route_keys *k,
                      kvr_explain_row *rows, kvr_pick *out)
{
    rr_state *s = self;
    if (!n || rr_reserve(s, el, n) < 0)
        return -1;
    for (size_t i = 0; i < n; i++)
        rows[i] = (kvr_explain_row){.worker = el[i], .match = -1, .inflight = kvr_worker_load(el[i])};
    out->worker = el[rr_choose(s, el, n, k, 0)];
    out->decision = "round_robin";
    out->match = -1;
    return 0;
}

static void rr_forget(void *self, kvr_worker *w)
{
    rr_state *s = self;
    if (w->id < s->ncurrent)
        s->current[w->id] = 0;
}

static int random_pick(void *self, kvr_worker *const *el, size_t n, const kvr_route_keys *k,
                       kvr_pick *out)
{
    (void)self;
    out->worker = el[kvr_policy_weighted_index(kvr_policy_weights(k, n), n)];
    out->decision = "random";
    out->match = -1;
    return 0;
}

static int least_pick(void *self, kvr_worker *const *el, size_t n, const kvr_route_keys *k,
                      kvr_pick *out)
{
    (void)self;
    out->worker = kvr_policy_least_loaded_w(el, kvr_policy_weights(k, n), n);
    out->decision = "least_load";
    out->match = -1;
    return 0;
}

static int p2_pick(void *self, kvr_worker *const *el, size_t n, const kvr_route_keys *k,
                   kvr_pick *out)
{
    (void)self;
    out->decision = "power_of_two";
    out->match = -1;
    if (n == 1) {
        out->worker = el[0];
        return 0;
    }
    size_t a = kvr_rand_below(n), b = kvr_rand_below(n - 1);
    if (b >= a)
        b++;
    kvr_worker *wa = el[a], *wb = el[b];
    /* in-flight / weight compared as cross products: exact for equal weights */
    double la = (double)kvr_worker_load(wa) * kvr_policy_weight(k, b);
    double lb = (double)kvr_worker_load(wb) * kvr_policy_weight(k, a);
    if (la != lb)
        out->worker = la < lb ? wa : wb;
    else
        out->worker = kvr_rand_below(2) ? wa : wb;
    return 0;
}

const kvr_policy_ops kvr_policy_round_robin = {
    .name = "round_robin", .create = rr_create, .pick = rr_pick, .destroy = rr_destroy,
    .forget_worker = rr_forget, .explain = rr_explain};
const kvr_policy_ops kvr_policy_random = {
    .name = "random", .create = stateless_create, .pick = random_pick,
    .destroy = stateless_destroy};
const kvr_policy_ops kvr_policy_least_load = {
    .name = "least_load", .create = stateless_create, .pick = least_pick,
    .destroy = stateless_destroy};
const kvr_policy_ops kvr_policy_power_of_two = {
    .name = "power_of_two", .create = stateless_create, .pick = p2_pick,
    .destroy = stateless_destroy};
