/* Policy registry and helpers shared by the policies. */
#include "routing/policy.h"

#include <string.h>

#include "routing/policies.h"
#include "util/rand.h"

void kvr_policy_cfg_default(kvr_policy_cfg *c)
{
    c->cache_threshold = 0.5;
    c->balance_abs_threshold = 32;
    c->balance_rel_threshold = 1.5;
    c->session_ttl_s = 3600;
    c->max_sessions = 1000000;
    c->block_bytes = 64;
    c->max_index_blocks = 4000000;
    c->worker_index_blocks = 0;
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
    /* Reservoir sampling over the minimum so ties are uniform, never by list order. */
    kvr_worker *best = NULL;
    uint64_t ties = 0;
    for (size_t i = 0; i < n; i++) {
        kvr_worker *w = eligible[i];
        if (!best || w->inflight < best->inflight) {
            best = w;
            ties = 1;
        } else if (w->inflight == best->inflight && kvr_rand_below(++ties) == 0) {
            best = w;
        }
    }
    return best;
}
