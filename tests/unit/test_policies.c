/* Target weights in the load-only policies (smooth weighted round robin, weighted random,
 * least_load and power_of_two on in-flight / weight) and the bounded-load rule of the hash
 * policies; equal weights behave as unweighted. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "routing/policies.h"
#include "util/rand.h"

typedef struct fleet {
    kvr_worker w[8];
    char url[8][64];
    kvr_worker *el[8];
} fleet;

static void fleet_init(fleet *f, size_t n)
{
    memset(f, 0, sizeof(*f));
    for (size_t i = 0; i < n; i++) {
        snprintf(f->url[i], sizeof(f->url[i]), "http://10.1.0.%zu:8000", i + 1);
        f->w[i] = (kvr_worker){.url = f->url[i], .id = i, .healthy = 1, .queue = -1,
                               .running = -1, .kv_usage = -1, .kv_tokens = -1};
        f->el[i] = &f->w[i];
    }
}

static kvr_worker *pick(const kvr_policy_ops *ops, void *p, fleet *f, size_t n,
                        const double *weights)
{
    kvr_route_keys k = {.weights = weights};
    kvr_pick out = {0};
    assert_int_equal(ops->pick(p, f->el, n, &k, &out), 0);
    assert_string_equal(out.decision, ops->name);
    return out.worker;
}

static void test_smooth_wrr_sequence(void **state)
{
    (void)state;
    const kvr_policy_ops *ops = &kvr_policy_round_robin;
    void *p = ops->create(NULL, "m");
    fleet f;
    fleet_init(&f, 3);
    /* nginx's example: weights 5, 1, 1 → a a b a c a a, cycle after cycle. */
    const double w[] = {5, 1, 1};
    const char *want = "aabacaa";
    for (int cycle = 0; cycle < 3; cycle++)
        for (int i = 0; i < 7; i++)
            assert_int_equal(pick(ops, p, &f, 3, w)->id, (size_t)(want[i] - 'a'));
    /* /debug/route looks without taking the turn. */
    kvr_explain_row rows[3];
    kvr_pick out = {0};
    kvr_route_keys k = {.weights = w};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(ops->explain(p, f.el, 3, &k, rows, &out), 0);
        assert_int_equal(out.worker->id, 0);
    }
    assert_int_equal(pick(ops, p, &f, 3, w)->id, 0);
    ops->destroy(p);

    /* Equal weights (none given, or all 2) rotate in target order. */
    const double two[] = {2, 2, 2};
    for (int variant = 0; variant < 2; variant++) {
        p = ops->create(NULL, "m");
        for (int i = 0; i < 9; i++)
            assert_int_equal(pick(ops, p, &f, 3, variant ? two : NULL)->id, (size_t)(i % 3));
        ops->destroy(p);
    }
    /* Weights 3 and 1: a a b a, so 30:10 over 40. */
    p = ops->create(NULL, "m");
    const double w31[] = {3, 1};
    size_t count[2] = {0};
    for (int i = 0; i < 40; i++)
        count[pick(ops, p, &f, 2, w31)->id]++;
    assert_int_equal(count[0], 30);
    assert_int_equal(count[1], 10);
    /* A worker leaving the eligible set: the others go on; forgetting one is harmless. */
    kvr_worker *only[] = {f.el[1]};
    kvr_route_keys k1 = {.weights = w31 + 1};
    assert_int_equal(ops->pick(p, only, 1, &k1, &out), 0);
    assert_ptr_equal(out.worker, f.el[1]);
    ops->forget_worker(p, f.el[0]);
    assert_non_null(pick(ops, p, &f, 2, w31));
    ops->destroy(p);
}

static void test_weighted_random(void **state)
{
    (void)state;
    kvr_rand_seed(7);
    const kvr_policy_ops *ops = &kvr_policy_random;
    void *p = ops->create(NULL, "m");
    fleet f;
    fleet_init(&f, 3);
    enum { N = 100000 };
    const double w[] = {1, 2, 5};
    size_t count[3] = {0};
    for (int i = 0; i < N; i++)
        count[pick(ops, p, &f, 3, w)->id]++;
    for (size_t i = 0; i < 3; i++) {
        double share = (double)count[i] / N, want = w[i] / 8;
        assert_true(share > want * 0.95 && share < want * 1.05);
    }
    /* Equal weights: one kvr_rand_below(n) per pick, exactly as unweighted. */
    const double eq[] = {4, 4, 4};
    kvr_rand_seed(9);
    size_t a[64];
    for (int i = 0; i < 64; i++)
        a[i] = pick(ops, p, &f, 3, NULL)->id;
    kvr_rand_seed(9);
    for (int i = 0; i < 64; i++)
        assert_int_equal(pick(ops, p, &f, 3, eq)->id, a[i]);
    ops->destroy(p);
}

static void test_weighted_least_load(void **state)
{
    (void)state;
    kvr_rand_seed(3);
    const kvr_policy_ops *ops = &kvr_policy_least_load;
    void *p = ops->create(NULL, "m");
    fleet f;
    fleet_init(&f, 2);
    const double w[] = {3, 1};
    /* in-flight / weight: 5/3 < 2/1 → the heavy one; 7/3 > 2/1 → the light one. */
    f.w[0].inflight = 5;
    f.w[1].inflight = 2;
    assert_int_equal(pick(ops, p, &f, 2, w)->id, 0);
    f.w[0].inflight = 7;
    assert_int_equal(pick(ops, p, &f, 2, w)->id, 1);
    /* 6/3 == 2/1: a tie, broken at random (both seen). */
    f.w[0].inflight = 6;
    size_t seen[2] = {0};
    for (int i = 0; i < 64; i++)
        seen[pick(ops, p, &f, 2, w)->id]++;
    assert_true(seen[0] > 0 && seen[1] > 0);
    /* Requests that never end settle 30:10 in flight. */
    f.w[0].inflight = f.w[1].inflight = 0;
    for (int i = 0; i < 40; i++)
        pick(ops, p, &f, 2, w)->inflight++;
    assert_true(f.w[0].inflight >= 29 && f.w[0].inflight <= 31);
    ops->destroy(p);

    /* power_of_two compares the same ratio (two workers: both sampled). */
    ops = &kvr_policy_power_of_two;
    p = ops->create(NULL, "m");
    f.w[0].inflight = 5;
    f.w[1].inflight = 2;
    for (int i = 0; i < 16; i++)
        assert_int_equal(pick(ops, p, &f, 2, w)->id, 0);
    f.w[0].inflight = 7;
    for (int i = 0; i < 16; i++)
        assert_int_equal(pick(ops, p, &f, 2, w)->id, 1);
    ops->destroy(p);
}

static void test_load_bound_rule(void **state)
{
    (void)state;
    fleet f;
    fleet_init(&f, 4);
    /* T = 19 in flight over 4: cap = ceil(1.25 × 20 / 4) = 7. */
    int64_t load[] = {10, 3, 3, 3};
    for (int i = 0; i < 4; i++)
        f.w[i].inflight = load[i];
    kvr_load_bound b = kvr_load_bound_make(f.el, 4, NULL, 1.25);
    assert_true(kvr_load_bound_over(&b, &f.w[0], 1));
    assert_false(kvr_load_bound_over(&b, &f.w[1], 1));
    f.w[1].inflight = 6; /* T = 22: cap = ceil(1.25 × 23 / 4) = 8; 6 + 1 fits */
    b = kvr_load_bound_make(f.el, 4, NULL, 1.25);
    assert_false(kvr_load_bound_over(&b, &f.w[1], 1));
    f.w[1].inflight = 8;
    b = kvr_load_bound_make(f.el, 4, NULL, 1.25);
    assert_true(kvr_load_bound_over(&b, &f.w[1], 1));
    /* An exact bound stays exact: T = 15, cap = 1.25 × 16 / 4 = 5, whatever equal weight. */
    int64_t l2[] = {4, 5, 3, 3};
    const double w03[] = {0.3, 0.3, 0.3, 0.3};
    for (int i = 0; i < 4; i++)
        f.w[i].inflight = l2[i];
    kvr_route_keys k = {.weights = w03};
    b = kvr_load_bound_make(f.el, 4, &k, 1.25);
    assert_false(kvr_load_bound_over(&b, &f.w[0], 0.3));
    assert_true(kvr_load_bound_over(&b, &f.w[1], 0.3));
    /* Weighted share: weights 3, 1, T = 39: caps ceil(1.25 × 40 × 3/4) = 38 and 13. */
    const double w31[] = {3, 1};
    f.w[0].inflight = 30;
    f.w[1].inflight = 9;
    k.weights = w31;
    b = kvr_load_bound_make(f.el, 2, &k, 1.25);
    assert_false(kvr_load_bound_over(&b, &f.w[0], 3));
    assert_false(kvr_load_bound_over(&b, &f.w[1], 1));
    f.w[1].inflight = 20; /* T = 50: cap ceil(1.25 × 51 / 4) = 16 */
    b = kvr_load_bound_make(f.el, 2, &k, 1.25);
    assert_true(kvr_load_bound_over(&b, &f.w[1], 1));
    /* Factor 0: unbounded. */
    f.w[0].inflight = 1000;
    b = kvr_load_bound_make(f.el, 4, NULL, 0);
    assert_false(kvr_load_bound_over(&b, &f.w[0], 1));
}

/* One hot key, requests that never end: bounded, no worker holds more than its cap and the
 * passed-over picks are counted; unbounded, the owner takes them all. */
static void bounded_checks(const kvr_policy_ops *ops)
{
    fleet f;
    fleet_init(&f, 4);
    kvr_policy_cfg cfg;
    kvr_policy_cfg_default(&cfg);
    assert_true(cfg.hash_load_factor == 1.25);
    void *p = ops->create(&cfg, "m");
    kvr_route_keys k = {.session = "hot", .session_len = 3};
    kvr_pick out = {0};
    assert_int_equal(ops->pick(p, f.el, 4, &k, &out), 0);
    kvr_worker *owner = out.worker;
    for (int i = 0; i < 40; i++) {
        int64_t total = 0;
        for (int j = 0; j < 4; j++)
            total += f.w[j].inflight;
        int64_t cap = (int64_t)ceil(1.25 * (double)(total + 1) / 4);
        assert_int_equal(ops->pick(p, f.el, 4, &k, &out), 0);
        assert_true(out.worker->inflight + 1 <= cap);
        out.worker->inflight++;
    }
    int64_t max = 0;
    for (int j = 0; j < 4; j++)
        max = f.w[j].inflight > max ? f.w[j].inflight : max;
    assert_true(max <= 13); /* ceil(1.25 × 40 / 4) */
    assert_true(owner->inflight == max);
    kvr_policy_stats st = {0};
    ops->stats(p, &st);
    assert_true(st.hash_overflows > 0 && st.hash_overflows < 40);
    /* explain marks the owner overloaded, answers like pick, and counts nothing. */
    kvr_explain_row rows[4];
    assert_int_equal(ops->explain(p, f.el, 4, &k, rows, &out), 0);
    assert_ptr_not_equal(out.worker, owner);
    for (int j = 0; j < 4; j++)
        if (rows[j].worker == owner)
            assert_int_equal(rows[j].overloaded, 1);
    kvr_policy_stats st2 = {0};
    ops->stats(p, &st2);
    assert_true(st2.hash_overflows == st.hash_overflows);
    /* Owner drained: the key comes back. */
    for (int j = 0; j < 4; j++)
        f.w[j].inflight = 0;
    assert_int_equal(ops->pick(p, f.el, 4, &k, &out), 0);
    assert_ptr_equal(out.worker, owner);
    /* Unbounded (a retune to factor 0): every request to the owner. */
    cfg.hash_load_factor = 0;
    assert_int_equal(ops->retune(p, &cfg), 0);
    for (int i = 0; i < 40; i++) {
        assert_int_equal(ops->pick(p, f.el, 4, &k, &out), 0);
        assert_ptr_equal(out.worker, owner);
        out.worker->inflight++;
    }
    ops->destroy(p);
}

static void test_bounded_consistent_hash(void **state)
{
    (void)state;
    kvr_rand_seed(5);
    bounded_checks(&kvr_policy_consistent_hash);
}

static void test_bounded_rendezvous_hash(void **state)
{
    (void)state;
    kvr_rand_seed(6);
    bounded_checks(&kvr_policy_rendezvous_hash);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_smooth_wrr_sequence),
        cmocka_unit_test(test_weighted_random),
        cmocka_unit_test(test_weighted_least_load),
        cmocka_unit_test(test_load_bound_rule),
        cmocka_unit_test(test_bounded_consistent_hash),
        cmocka_unit_test(test_bounded_rendezvous_hash),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
