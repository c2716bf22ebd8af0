/* rendezvous_hash policy (highest random weight): the eligible worker with the highest
 * XXH3(URL, seed = key hash). Stateless apart from the block size. */
#include <stdlib.h>
#include <string.h>

#include "routing/hashring.h"
#include "routing/policies.h"
#include "util/rand.h"

typedef struct rv_state {
    size_t block_bytes;
} rv_state;

static void *rv_create(const kvr_policy_cfg *cfg, const char *model)
{
    (void)model;
    rv_state *s = calloc(1, sizeof(*s));
    if (s)
        s->block_bytes = cfg && cfg->block_bytes ? cfg->block_bytes : 64;
    return s;
}

static void rv_destroy(void *self)
{
    free(self);
}

static int rv_pick(void *self, kvr_worker *const *el, size_t n, const kvr_route_keys *k,
                   kvr_pick *out)
{
    rv_state *s = self;
    if (!n)
        return -1;
    out->decision = "rendezvous_hash";
    out->match = -1;
    uint64_t h;
    if (!kvr_hash_route_key(k ? k->session : NULL, k ? k->session_len : 0, k ? k->text : NULL,
                            k ? k->text_len : 0, s->block_bytes, &h)) {
        out->worker = el[kvr_rand_below(n)];
        return 0;
    }
    kvr_worker *best = NULL;
    uint64_t bs = 0, ties = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t sc = kvr_rendezvous_score(h, el[i]->url, strlen(el[i]->url));
        if (!best || sc > bs) {
            best = el[i];
            bs = sc;
            ties = 1;
        } else if (sc == bs && kvr_rand_below(++ties) == 0) {
            best = el[i];
        }
    }
    out->worker = best;
    return 0;
}

const kvr_policy_ops kvr_policy_rendezvous_hash = {
    .name = "rendezvous_hash",
    .create = rv_create,
    .pick = rv_pick,
    .teach = NULL,
    .forget_worker = NULL,
    .destroy = rv_destroy,
    .uses_keys = 1,
};
