/* The load-only policies: round_robin, random, least_load, power_of_two. They ignore the
 * routing keys; their decision label is their own name (DESIGN §10). */
#include <stdlib.h>

#include "routing/policies.h"
#include "util/rand.h"

typedef struct rr_state {
    uint64_t next;
} rr_state;

static void *rr_create(const kvr_policy_cfg *cfg, const char *model)
{
    (void)cfg;
    (void)model;
    return calloc(1, sizeof(rr_state));
}

static void simple_destroy(void *self)
{
    free(self);
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

static int rr_pick(void *self, kvr_worker *const *el, size_t n, const kvr_route_keys *k,
                   kvr_pick *out)
{
    (void)k;
    rr_state *s = self;
    out->worker = el[s->next++ % n];
    out->decision = "round_robin";
    out->match = -1;
    return 0;
}

static int random_pick(void *self, kvr_worker *const *el, size_t n, const kvr_route_keys *k,
                       kvr_pick *out)
{
    (void)self;
    (void)k;
    out->worker = el[kvr_rand_below(n)];
    out->decision = "random";
    out->match = -1;
    return 0;
}

static int least_pick(void *self, kvr_worker *const *el, size_t n, const kvr_route_keys *k,
                      kvr_pick *out)
{
    (void)self;
    (void)k;
    out->worker = kvr_policy_least_loaded(el, n);
    out->decision = "least_load";
    out->match = -1;
    return 0;
}

static int p2_pick(void *self, kvr_worker *const *el, size_t n, const kvr_route_keys *k,
                   kvr_pick *out)
{
    (void)self;
    (void)k;
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
    if (wa->inflight != wb->inflight)
        out->worker = wa->inflight < wb->inflight ? wa : wb;
    else
        out->worker = kvr_rand_below(2) ? wa : wb;
    return 0;
}

const kvr_policy_ops kvr_policy_round_robin = {
    .name = "round_robin", .create = rr_create, .pick = rr_pick, .destroy = simple_destroy};
const kvr_policy_ops kvr_policy_random = {
    .name = "random", .create = stateless_create, .pick = random_pick,
    .destroy = stateless_destroy};
const kvr_policy_ops kvr_policy_least_load = {
    .name = "least_load", .create = stateless_create, .pick = least_pick,
    .destroy = stateless_destroy};
const kvr_policy_ops kvr_policy_power_of_two = {
    .name = "power_of_two", .create = stateless_create, .pick = p2_pick,
    .destroy = stateless_destroy};
