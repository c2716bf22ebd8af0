/* Consistent-hash ring and rendezvous hashing, and the two policies built on them: ~1/N keys
 * move when one of N workers joins or leaves (and no others), an ineligible owner passes its
 * keys to the next distinct worker clockwise, keys are sticky. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "routing/hashring.h"
#include "routing/policies.h"
#include "util/rand.h"

#define NKEYS 100000

static void url_of(char *buf, size_t n, size_t i)
{
    snprintf(buf, n, "http://10.0.%zu.%zu:8000", i / 200, i % 200 + 1);
}

static kvr_hashring *ring_of(size_t nw, size_t skip)
{
    kvr_hashring *r = kvr_hashring_create(KVR_HASHRING_VNODES);
    assert_non_null(r);
    for (size_t i = 0; i < nw; i++) {
        if (i == skip)
            continue;
        char u[64];
        url_of(u, sizeof(u), i);
        assert_int_equal(kvr_hashring_add(r, i, u), 0);
    }
    return r;
}

static uint64_t key(size_t i)
{
    char k[32];
    int n = snprintf(k, sizeof(k), "session-%zu", i);
    return kvr_hash_key(k, (size_t)n);
}

static size_t owner(const kvr_hashring *r, size_t i, kvr_hashring_ok_fn ok, void *ctx)
{
    size_t id = SIZE_MAX;
    assert_int_equal(kvr_hashring_lookup(r, key(i), ok, ctx, &id), 0);
    return id;
}

static void test_ring_balance_and_determinism(void **state)
{
    (void)state;
    enum { N = 8 };
    kvr_hashring *r = ring_of(N, SIZE_MAX);
    /* Built in another order: the same owners (positions depend on URLs only). */
    kvr_hashring *r2 = kvr_hashring_create(KVR_HASHRING_VNODES);
    for (size_t i = N; i-- > 0;) {
        char u[64];
        url_of(u, sizeof(u), i);
        kvr_hashring_add(r2, i, u);
    }
    size_t count[N] = {0};
    for (size_t i = 0; i < NKEYS; i++) {
        size_t o = owner(r, i, NULL, NULL);
        assert_int_equal(o, owner(r2, i, NULL, NULL));
        count[o]++;
    }
    /* 160 points per worker: each share within ±30 % of 1/N. */
    for (size_t w = 0; w < N; w++) {
        assert_true(count[w] > NKEYS / N * 7 / 10);
        assert_true(count[w] < NKEYS / N * 13 / 10);
    }
    assert_int_equal(kvr_hashring_workers(r), N);
    kvr_hashring_destroy(r);
    kvr_hashring_destroy(r2);
}

static void check_movement(size_t n)
{
    /* Remove worker 2 of n: exactly its keys move, ~1/n of all. */
    kvr_hashring *all = ring_of(n, SIZE_MAX), *less = ring_of(n, 2);
    size_t moved = 0;
    for (size_t i = 0; i < NKEYS; i++) {
        size_t a = owner(all, i, NULL, NULL), b = owner(less, i, NULL, NULL);
        if (a != b) {
            moved++;
            assert_int_equal(a, 2);  /* only the leaving worker's keys move */
        } else {
            assert_true(a != 2);
        }
    }
    double f = (double)moved / NKEYS, ideal = 1.0 / (double)n;
    print_message("n=%zu: removing one worker moved %.4f of keys (1/n = %.4f)\n", n, f, ideal);
    assert_true(f > ideal * 0.6 && f < ideal * 1.4);
    /* Adding worker n: keys move only to it, ~1/(n+1) of all. */
    kvr_hashring *more = ring_of(n + 1, SIZE_MAX);
    moved = 0;
    for (size_t i = 0; i < NKEYS; i++) {
        size_t a = owner(all, i, NULL, NULL), b = owner(more, i, NULL, NULL);
        if (a != b) {
            moved++;
            assert_int_equal(b, n);
        }
    }
    f = (double)moved / NKEYS;
    ideal = 1.0 / (double)(n + 1);
    print_message("n=%zu: adding one worker moved %.4f of keys (1/(n+1) = %.4f)\n", n, f, ideal);
    assert_true(f > ideal * 0.6 && f < ideal * 1.4);
    kvr_hashring_destroy(all);
    kvr_hashring_destroy(less);
    kvr_hashring_destroy(more);
}

static void test_ring_movement(void **state)
{
    (void)state;
    check_movement(4);
    check_movement(8);
    check_movement(16);
}

typedef struct not_ctx {
    size_t down;
    int calls;
} not_ctx;

static int all_but(void *ctx, size_t id)
{
    not_ctx *c = ctx;
    c->calls++;
    return id != c->down;
}

static int none(void *ctx, size_t id)
{
    (void)ctx;
    (void)id;
    return 0;
}

static void test_ring_ineligible_passes_on(void **state)
{
    (void)state;
    enum { N = 6 };
    kvr_hashring *r = ring_of(N, SIZE_MAX), *without = ring_of(N, 4);
    not_ctx c = {4, 0};
    size_t moved = 0;
    for (size_t i = 0; i < NKEYS; i++) {
        size_t a = owner(r, i, NULL, NULL);
        size_t b = owner(r, i, all_but, &c);
        /* Same owner as a ring without the worker: the next distinct worker clockwise. */
        assert_int_equal(b, owner(without, i, NULL, NULL));
        if (a != b) {
            assert_int_equal(a, 4);
            moved++;
        }
    }
    assert_true(moved > 0);
    assert_true(c.calls <= 2 * NKEYS); /* each distinct worker asked at most once per lookup */
    /* The worker comes back: its keys come back. */
    for (size_t i = 0; i < 1000; i++)
        assert_int_equal(owner(r, i, NULL, NULL), owner(r, i, all_but, &(not_ctx){99, 0}));
    size_t id;
    assert_int_equal(kvr_hashring_lookup(r, 123, none, NULL, &id), -1);
    /* Removing and re-adding; a changed URL replaces the old points. */
    assert_int_equal(kvr_hashring_remove(r, 4), 1);
    assert_int_equal(kvr_hashring_remove(r, 4), 0);
    for (size_t i = 0; i < 1000; i++)
        assert_int_equal(owner(r, i, NULL, NULL), owner(without, i, NULL, NULL));
    assert_int_equal(kvr_hashring_add(r, 0, "http://elsewhere:1"), 0);
    assert_true(kvr_hashring_has(r, 0, "http://elsewhere:1"));
    assert_int_equal(kvr_hashring_workers(r), N - 1);
    kvr_hashring_destroy(r);
    kvr_hashring_destroy(without);
    kvr_hashring *empty = kvr_hashring_create(160);
    assert_int_equal(kvr_hashring_lookup(empty, 1, NULL, NULL, &id), -1);
    kvr_hashring_destroy(empty);
}

static size_t rv_owner(size_t nw, size_t skip, uint64_t k)
{
    size_t best = SIZE_MAX;
    uint64_t bs = 0;
    for (size_t i = 0; i < nw; i++) {
        if (i == skip)
            continue;
        char u[64];
        url_of(u, sizeof(u), i);
        uint64_t s = kvr_rendezvous_score(k, u, strlen(u));
        if (best == SIZE_MAX || s > bs)
            best = i, bs = s;
    }
    return best;
}

static void test_rendezvous_movement(void **state)
{
    (void)state;
    enum { N = 8 };
    size_t moved = 0, count[N] = {0};
    for (size_t i = 0; i < NKEYS / 4; i++) {
        size_t a = rv_owner(N, SIZE_MAX, key(i)), b = rv_owner(N, 5, key(i));
        count[a]++;
        if (a != b) {
            moved++;
            assert_int_equal(a, 5);
        }
    }
    double f = (double)moved / (NKEYS / 4);
    assert_true(f > 0.6 / N && f < 1.4 / N);
    for (size_t w = 0; w < N; w++)
        assert_true(count[w] > NKEYS / 4 / N * 8 / 10 && count[w] < NKEYS / 4 / N * 12 / 10);
}

/* ---- the policies ---------------------------------------------------------------------- */

typedef struct fleet {
    kvr_worker w[8];
    char url[8][64];
    kvr_worker *el[8];
} fleet;

static void fleet_init(fleet *f, size_t n)
{
    memset(f, 0, sizeof(*f));
    for (size_t i = 0; i < n; i++) {
        url_of(f->url[i], sizeof(f->url[i]), i);
        f->w[i] = (kvr_worker){.url = f->url[i], .id = i, .healthy = 1, .queue = -1,
                               .running = -1, .kv_usage = -1, .kv_tokens = -1};
        f->el[i] = &f->w[i];
    }
}

static kvr_worker *pick(const kvr_policy_ops *ops, void *p, kvr_worker *const *el, size_t n,
                        const char *session, const char *text)
{
    kvr_route_keys k = {.session = session, .session_len = session ? strlen(session) : 0,
                        .text = text, .text_len = text ? strlen(text) : 0};
    kvr_pick out = {0};
    assert_int_equal(ops->pick(p, el, n, &k, &out), 0);
    assert_string_equal(out.decision, ops->name);
    assert_true(out.match == -1);
    return out.worker;
}

static void policy_checks(const kvr_policy_ops *ops)
{
    kvr_policy_cfg cfg = {.block_bytes = 64, .max_index_blocks = 1000, .max_sessions = 10};
    void *p = ops->create(&cfg, "m");
    assert_non_null(p);
    fleet f;
    fleet_init(&f, 8);
    /* Sticky by session key; different sessions spread over the workers. */
    size_t used[8] = {0};
    for (int s = 0; s < 400; s++) {
        char sess[32];
        snprintf(sess, sizeof(sess), "conv-%d", s);
        kvr_worker *w = pick(ops, p, f.el, 8, sess, "same text");
        for (int r = 0; r < 3; r++)
            assert_ptr_equal(pick(ops, p, f.el, 8, sess, "other text"), w);
        used[w->id]++;
    }
    for (size_t i = 0; i < 8; i++)
        assert_true(used[i] > 20);
    /* Without a session: the first block of the routing text is the key. */
    char t1[200], t2[200];
    memset(t1, 'a', 64);
    memset(t2, 'a', 64);
    strcpy(t1 + 64, "first conversation continues");
    strcpy(t2 + 64, "another one");
    kvr_worker *w1 = pick(ops, p, f.el, 8, NULL, t1);
    assert_ptr_equal(pick(ops, p, f.el, 8, NULL, t2), w1);
    /* An ineligible owner's keys go elsewhere and come back with it. */
    kvr_worker *rest[7];
    size_t nr = 0;
    for (size_t i = 0; i < 8; i++)
        if (f.el[i] != w1)
            rest[nr++] = f.el[i];
    kvr_worker *w2 = pick(ops, p, rest, nr, NULL, t1);
    assert_ptr_not_equal(w2, w1);
    assert_ptr_equal(pick(ops, p, f.el, 8, NULL, t1), w1);
    /* Keys owned by other workers do not move when one leaves. */
    for (int s = 0; s < 200; s++) {
        char sess[32];
        snprintf(sess, sizeof(sess), "conv-%d", s);
        kvr_worker *a = pick(ops, p, f.el, 8, sess, NULL);
        kvr_worker *b = pick(ops, p, rest, nr, sess, NULL);
        if (a != w1)
            assert_ptr_equal(a, b);
    }
    if (ops->forget_worker)
        ops->forget_worker(p, w1);
    assert_ptr_equal(pick(ops, p, rest, nr, NULL, t1), w2);
    /* No key at all: some eligible worker (at random). */
    size_t hits[8] = {0};
    for (int i = 0; i < 800; i++)
        hits[pick(ops, p, f.el, 8, NULL, NULL)->id]++;
    for (size_t i = 0; i < 8; i++)
        assert_true(hits[i] > 40);
    kvr_route_keys none = {0};
    kvr_pick out;
    assert_int_equal(ops->pick(p, f.el, 0, &none, &out), -1);
    ops->destroy(p);
}

static void test_consistent_hash_policy(void **state)
{
    (void)state;
    kvr_rand_seed(1);
    policy_checks(&kvr_policy_consistent_hash);
    /* Every router instance computes the same owner. */
    kvr_policy_cfg cfg = {.block_bytes = 64};
    void *a = kvr_policy_consistent_hash.create(&cfg, "m"), *b =
        kvr_policy_consistent_hash.create(&cfg, "m");
    fleet f, g;
    fleet_init(&f, 8);
    fleet_init(&g, 8);
    kvr_worker *rev[8];
    for (int i = 0; i < 8; i++)
        rev[i] = g.el[7 - i];
    for (int s = 0; s < 100; s++) {
        char sess[32];
        snprintf(sess, sizeof(sess), "u%d", s);
        assert_int_equal(pick(&kvr_policy_consistent_hash, a, f.el, 8, sess, NULL)->id,
                         pick(&kvr_policy_consistent_hash, b, rev, 8, sess, NULL)->id);
    }
    kvr_policy_consistent_hash.destroy(a);
    kvr_policy_consistent_hash.destroy(b);
}

static void test_rendezvous_hash_policy(void **state)
{
    (void)state;
    kvr_rand_seed(2);
    policy_checks(&kvr_policy_rendezvous_hash);
}

/* ---- target weights -------------------------------------------------------------------- */

static void test_vnode_counts(void **state)
{
    (void)state;
    assert_int_equal(kvr_hashring_vnodes_for(1), 160);
    assert_int_equal(kvr_hashring_vnodes_for(0.5), 80);
    assert_int_equal(kvr_hashring_vnodes_for(2.5), 400);
    assert_int_equal(kvr_hashring_vnodes_for(0.0034), 1); /* 0.544 rounds to 1 */
    assert_int_equal(kvr_hashring_vnodes_for(0.0028), 1); /* 0.448: at least 1 */
    assert_int_equal(kvr_hashring_vnodes_for(0.0128), 2); /* 2.048 */
    assert_int_equal(kvr_hashring_vnodes_for(1e9), KVR_HASHRING_MAX_VNODES);
    kvr_hashring *r = kvr_hashring_create(KVR_HASHRING_VNODES);
    assert_int_equal(kvr_hashring_add(r, 0, "http://a"), 0);
    assert_int_equal(kvr_hashring_member_vnodes(r, 0), 160);
    assert_int_equal(kvr_hashring_add_vnodes(r, 1, "http://b", 480), 0);
    assert_int_equal(kvr_hashring_member_vnodes(r, 1), 480);
    /* A new weight replaces the points; the same one is a no-op. */
    assert_int_equal(kvr_hashring_add_vnodes(r, 1, "http://b", 80), 0);
    assert_int_equal(kvr_hashring_member_vnodes(r, 1), 80);
    assert_int_equal(kvr_hashring_add_vnodes(r, 1, "http://b", 80), 0);
    assert_int_equal(kvr_hashring_workers(r), 2);
    assert_int_equal(kvr_hashring_member_vnodes(r, 7), 0);
    kvr_hashring_destroy(r);
}

/* Share of NKEYS session keys each of 4 workers gets under `ops` with these weights. */
static void shares(const kvr_policy_ops *ops, const double *w, double *share)
{
    kvr_policy_cfg cfg = {.block_bytes = 64};
    void *p = ops->create(&cfg, "m");
    fleet f;
    fleet_init(&f, 4);
    size_t count[4] = {0};
    for (size_t i = 0; i < NKEYS; i++) {
        char sess[32];
        snprintf(sess, sizeof(sess), "session-%zu", i);
        kvr_route_keys k = {.session = sess, .session_len = strlen(sess), .weights = w};
        kvr_pick out = {0};
        assert_int_equal(ops->pick(p, f.el, 4, &k, &out), 0);
        count[out.worker->id]++;
    }
    for (size_t i = 0; i < 4; i++)
        share[i] = (double)count[i] / NKEYS;
    ops->destroy(p);
}

static void weighted_checks(const kvr_policy_ops *ops, double tolerance, double equal)
{
    const double w[] = {1, 2, 3, 4};
    double share[4];
    shares(ops, w, share);
    for (size_t i = 0; i < 4; i++)
        assert_true(share[i] > w[i] / 10 * (1 - tolerance) &&
                    share[i] < w[i] / 10 * (1 + tolerance));
    /* Equal weights `equal`: the unweighted owners exactly. */
    const double eq[] = {equal, equal, equal, equal};
    kvr_policy_cfg cfg = {.block_bytes = 64};
    void *a = ops->create(&cfg, "m"), *b = ops->create(&cfg, "m");
    fleet f;
    fleet_init(&f, 4);
    for (int s = 0; s < 2000; s++) {
        char sess[32];
        snprintf(sess, sizeof(sess), "conv-%d", s);
        kvr_route_keys k = {.session = sess, .session_len = strlen(sess)}, ke = k;
        ke.weights = eq;
        kvr_pick x = {0}, y = {0};
        assert_int_equal(ops->pick(a, f.el, 4, &k, &x), 0);
        assert_int_equal(ops->pick(b, f.el, 4, &ke, &y), 0);
        assert_ptr_equal(x.worker, y.worker);
    }
    /* Weighted, a leaving worker's keys move and no others. */
    kvr_worker *rest[] = {f.el[0], f.el[1], f.el[3]};
    const double wrest[] = {1, 2, 4};
    for (int s = 0; s < 2000; s++) {
        char sess[32];
        snprintf(sess, sizeof(sess), "conv-%d", s);
        kvr_route_keys k = {.session = sess, .session_len = strlen(sess), .weights = w}, kr = k;
        kr.weights = wrest;
        kvr_pick x = {0}, y = {0};
        assert_int_equal(ops->pick(a, f.el, 4, &k, &x), 0);
        assert_int_equal(ops->pick(a, rest, 3, &kr, &y), 0);
        if (x.worker != f.el[2])
            assert_ptr_equal(x.worker, y.worker);
    }
    ops->destroy(a);
    ops->destroy(b);
}

static void test_weighted_consistent_hash(void **state)
{
    (void)state;
    /* 160 points per unit of weight: shares within ±25 % of weight / total. Weight 1 (the
     * default) is the unweighted ring; other equal weights give another ring, as balanced, so
     * that changing one worker's weight moves only its share of the keys. */
    weighted_checks(&kvr_policy_consistent_hash, 0.25, 1);
    double share[4];
    const double eq[] = {3, 3, 3, 3};
    shares(&kvr_policy_consistent_hash, eq, share);
    for (size_t i = 0; i < 4; i++)
        assert_true(share[i] > 0.25 * 0.8 && share[i] < 0.25 * 1.2);
}

static void test_weighted_rendezvous_hash(void **state)
{
    (void)state;
    /* Weighted HRW is exact in expectation: only sampling noise over 100k keys. */
    weighted_checks(&kvr_policy_rendezvous_hash, 0.05, 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ring_balance_and_determinism),
        cmocka_unit_test(test_ring_movement),
        cmocka_unit_test(test_ring_ineligible_passes_on),
        cmocka_unit_test(test_rendezvous_movement),
        cmocka_unit_test(test_consistent_hash_policy),
        cmocka_unit_test(test_rendezvous_hash_policy),
        cmocka_unit_test(test_vnode_counts),
        cmocka_unit_test(test_weighted_consistent_hash),
        cmocka_unit_test(test_weighted_rendezvous_hash),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
