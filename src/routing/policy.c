/* Policy registry and helpers shared by the policies. */
#include "routing/policy.h"

#include <math.h>
#include <string.h>

#include "routing/policies.h"
#include "routing/scorers.h"
#include "util/rand.h"

void kvr_policy_cfg_default(kvr_policy_cfg *c)
{
    memset(c, 0, sizeof(*c)); /* no KV events, and padding that compares equal */
    c->cache_threshold = 0.5;
    c->balance_abs_threshold = 32;
    c->balance_rel_threshold = 1.5;
    c->session_ttl_s = 3600;
    c->max_sessions = 1000000;
    c->block_bytes = 64;
    c->max_index_blocks = 4000000;
    c->worker_index_blocks = 0;
    c->hash_load_factor = 1.25;
    kvr_scorers_default(c->scorers);
}

static const kvr_policy_ops *const all[] = {
    &kvr_policy_round_robin, &kvr_policy_random,          &kvr_policy_least_load,
    &kvr_policy_power_of_two, KVR_POLICIES_EXTRA
};

const kvr_policy_ops *kvr_policy_find(const char *name)
{
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        if (all[i] && strcmp(all[i]->name, name) == 0)
            return all[i];
    return NULL;
}

const char *kvr_policy_names(void)
{
    static char names[256];
    if (!names[0]) {
        for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
            if (!all[i])
                continue;
            if (names[0])
                strncat(names, ",", sizeof(names) - strlen(names) - 1);
            strncat(names, all[i]->name, sizeof(names) - strlen(names) - 1);
        }
    }
    return names;
}

kvr_worker *kvr_policy_least_loaded(kvr_worker *const *eligible, size_t n)
{
    return kvr_policy_least_loaded_w(eligible, NULL, n);
}

kvr_worker *kvr_policy_least_loaded_w(kvr_worker *const *eligible, const double *weights,
                                      size_t n)
{
    /* Reservoir sampling over the minimum so ties are uniform, never by list order. Loads are
     * compared as cross products (a / wa < b / wb ⇔ a·wb < b·wa): exact for equal weights. */
    kvr_worker *best = NULL;
    double bw = 1;
    uint64_t ties = 0;
    for (size_t i = 0; i < n; i++) {
        kvr_worker *w = eligible[i];
        double ww = weights ? weights[i] : 1;
        double a = (double)kvr_worker_load(w) * bw, b = best ? (double)kvr_worker_load(best) * ww : 0;
        if (!best || a < b) {
            best = w;
            bw = ww;
            ties = 1;
        } else if (a == b && kvr_rand_below(++ties) == 0) {
            best = w;
            bw = ww;
        }
    }
    return best;
}

double kvr_policy_weight(const kvr_route_keys *k, size_t i)
{
    return k && k->weights ? k->weights[i] : 1;
}

const double *kvr_policy_weights(const kvr_route_keys *k, size_t n)
{
    if (!k || !k->weights)
        return NULL;
    for (size_t i = 1; i < n; i++)
        if (k->weights[i] != k->weights[0])
            return k->weights;
    return NULL;
}

size_t kvr_policy_weighted_index(const double *weights, size_t n)
{
    if (!weights)
        return (size_t)kvr_rand_below(n);
    double total = 0;
    for (size_t i = 0; i < n; i++)
        total += weights[i];
    double u = kvr_rand_double() * total;
    for (size_t i = 0; i < n; i++) {
        if (u < weights[i])
            return i;
        u -= weights[i];
    }
    return n - 1; /* rounding left u at the very end */
}

kvr_load_bound kvr_load_bound_make(kvr_worker *const *eligible, size_t n, const kvr_route_keys *k,
                                   double factor)
{
    kvr_load_bound b = {0};
    if (!(factor > 0) || !n)
        return b;
    double total = 0, wsum = 0;
    for (size_t i = 0; i < n; i++) {
        total += (double)(kvr_worker_load(eligible[i]) > 0 ? kvr_worker_load(eligible[i]) : 0);
        wsum += kvr_policy_weight(k, i);
    }
    b.scale = factor * (total + 1) / wsum;
    return b;
}

int kvr_load_bound_over(const kvr_load_bound *b, const kvr_worker *w, double weight)
{
    if (!(b->scale > 0))
        return 0;
    /* The epsilon keeps an exact integer bound (1.25 × 16 / 4 = 5) from rounding up to 6 when
     * the weight share is not exactly representable. */
    double cap = ceil(b->scale * weight - 1e-9);
    return (double)kvr_worker_load(w) + 1 > cap;
}

void kvr_load_bound_rows(kvr_worker *const *eligible, size_t n, const kvr_route_keys *k,
                         double factor, kvr_explain_row *rows)
{
    kvr_load_bound b = kvr_load_bound_make(eligible, n, k, factor);
    for (size_t i = 0; i < n; i++)
        rows[i] = (kvr_explain_row){
            .worker = eligible[i], .match = -1, .inflight = kvr_worker_load(eligible[i]),
            .overloaded = kvr_load_bound_over(&b, eligible[i], kvr_policy_weight(k, i))};
}
