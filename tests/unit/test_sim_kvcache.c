/* kvroute-sim block pool: hits, pinning, LRU eviction order (tail of a prefix first),
 * duplicate blocks, reset, and the events it reports. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "kvcache.h"

#define BS 4

typedef struct rec {
    size_t stored_calls, stored_blocks, removed;
    int cleared;
    uint64_t last_removed;
    int last_has_parent;
    uint64_t last_parent;
} rec;

static void on_stored(void *ud, const uint64_t *h, size_t n, int has_parent, uint64_t parent,
                      const uint32_t *tokens, size_t ntok, uint32_t bs)
{
    (void)h;
    (void)tokens;
    rec *r = ud;
    assert_int_equal(ntok, n * bs);
    r->stored_calls++;
    r->stored_blocks += n;
    r->last_has_parent = has_parent;
    r->last_parent = parent;
}
static void on_removed(void *ud, uint64_t h)
{
    rec *r = ud;
    r->removed++;
    r->last_removed = h;
}
static void on_cleared(void *ud)
{
    ((rec *)ud)->cleared++;
}

static kvr_sim_kv *pool(uint32_t n, rec *r)
{
    kvr_sim_kv *kv = kvr_sim_kv_new(n, BS, 0);
    assert_non_null(kv);
    memset(r, 0, sizeof(*r));
    kvr_sim_kv_sink s = {on_stored, on_removed, on_cleared, r};
    kvr_sim_kv_set_sink(kv, &s);
    return kv;
}

/* Hashes of `nb` blocks of tokens base, base+1, … */
static void chain(kvr_sim_kv *kv, uint32_t base, size_t nb, uint64_t *h, uint32_t *tokens)
{
    for (size_t i = 0; i < nb * BS; i++)
        tokens[i] = base + (uint32_t)i;
    uint64_t parent = kvr_sim_kv_root_hash(kv);
    for (size_t i = 0; i < nb; i++)
        parent = h[i] = kvr_sim_kv_hash_block(kv, parent, tokens + i * BS);
}

/* Allocates and caches a whole sequence; returns its blocks in `b`. */
static void store_seq(kvr_sim_kv *kv, const uint64_t *h, const uint32_t *tokens, size_t nb,
                      uint32_t *b)
{
    assert_int_equal(kvr_sim_kv_alloc(kv, nb, b), 0);
    kvr_sim_kv_cache(kv, b, h, nb, 0, 0, tokens);
}

static void test_hit_and_prefix_anchoring(void **state)
{
    (void)state;
    rec r;
    kvr_sim_kv *kv = pool(16, &r);
    uint64_t h[4], h2[4];
    uint32_t t[4 * BS], t2[4 * BS], b[4], out[4];
    chain(kv, 100, 4, h, t);
    assert_int_equal(kvr_sim_kv_longest_hit(kv, h, 4, out), 0);
    store_seq(kv, h, t, 4, b);
    assert_int_equal(r.stored_calls, 1);
    assert_int_equal(r.stored_blocks, 4);
    assert_int_equal(r.last_has_parent, 0);
    assert_int_equal(kvr_sim_kv_longest_hit(kv, h, 4, out), 4);
    assert_memory_equal(out, b, sizeof(b));
    /* same tokens after a different first block: no hit at all (chained hash) */
    chain(kv, 100, 4, h2, t2);
    t2[0] = 7;
    uint64_t p = kvr_sim_kv_root_hash(kv);
    for (size_t i = 0; i < 4; i++)
        p = h2[i] = kvr_sim_kv_hash_block(kv, p, t2 + i * BS);
    assert_int_equal(kvr_sim_kv_longest_hit(kv, h2, 4, out), 0);
    assert_int_equal(kvr_sim_kv_num_used(kv), 4);
    assert_true(kvr_sim_kv_usage(kv) == 0.25);
    kvr_sim_kv_free_pool(kv);
}

static void test_pinned_blocks_survive_pressure(void **state)
{
    (void)state;
    rec r;
    kvr_sim_kv *kv = pool(4, &r);
    uint64_t h[4];
    uint32_t t[4 * BS], b[4], more[1];
    chain(kv, 1, 4, h, t);
    store_seq(kv, h, t, 4, b);
    /* all 4 in use: nothing can be allocated, nothing is evicted */
    assert_int_equal(kvr_sim_kv_alloc(kv, 1, more), -1);
    assert_int_equal(r.removed, 0);
    kvr_sim_kv_release(kv, b, 4);
    assert_int_equal(kvr_sim_kv_num_free(kv), 4);
    assert_int_equal(kvr_sim_kv_num_cached(kv), 4);
    kvr_sim_kv_free_pool(kv);
}

static void test_lru_evicts_tail_first(void **state)
{
    (void)state;
    rec r;
    kvr_sim_kv *kv = pool(4, &r);
    uint64_t h[4];
    uint32_t t[4 * BS], b[4], out[4], nb[2];
    chain(kv, 1, 4, h, t);
    store_seq(kv, h, t, 4, b);
    kvr_sim_kv_release(kv, b, 4); /* freed last-first: block 3 is the LRU head */
    assert_int_equal(kvr_sim_kv_alloc(kv, 1, nb), 0);
    assert_int_equal(r.removed, 1);
    assert_true(r.last_removed == h[3]);
    assert_int_equal(kvr_sim_kv_longest_hit(kv, h, 4, out), 3);
    assert_int_equal(kvr_sim_kv_alloc(kv, 1, nb + 1), 0);
    assert_true(r.last_removed == h[2]);
    assert_int_equal(kvr_sim_kv_longest_hit(kv, h, 4, out), 2);
    assert_int_equal(kvr_sim_kv_evictions(kv), 2);
    kvr_sim_kv_free_pool(kv);
}

static void test_touch_protects_from_eviction_and_refreshes_lru(void **state)
{
    (void)state;
    rec r;
    kvr_sim_kv *kv = pool(6, &r);
    uint64_t ha[2], hb[2];
    uint32_t ta[2 * BS], tb[2 * BS], ba[2], bb[2], out[2], x[4];
    chain(kv, 1, 2, ha, ta);
    chain(kv, 500, 2, hb, tb);
    store_seq(kv, ha, ta, 2, ba);
    store_seq(kv, hb, tb, 2, bb);
    kvr_sim_kv_release(kv, ba, 2);
    kvr_sim_kv_release(kv, bb, 2);
    /* A is older; a hit on A takes it out of the queue, then frees it again: B is now LRU */
    assert_int_equal(kvr_sim_kv_longest_hit(kv, ha, 2, out), 2);
    assert_int_equal(kvr_sim_kv_count_free(kv, out, 2), 2);
    kvr_sim_kv_touch(kv, out, 2);
    assert_int_equal(kvr_sim_kv_count_free(kv, out, 2), 0);
    kvr_sim_kv_release(kv, out, 2);
    /* 2 never-used blocks go first, then B's two */
    assert_int_equal(kvr_sim_kv_alloc(kv, 4, x), 0);
    assert_int_equal(r.removed, 2);
    assert_int_equal(kvr_sim_kv_longest_hit(kv, hb, 2, out), 0);
    assert_int_equal(kvr_sim_kv_longest_hit(kv, ha, 2, out), 2);
    kvr_sim_kv_free_pool(kv);
}

static void test_duplicates_stored_and_removed_separately(void **state)
{
    (void)state;
    rec r;
    kvr_sim_kv *kv = pool(4, &r);
    uint64_t h[1];
    uint32_t t[BS], b1[1], b2[1], out[1], x[4];
    chain(kv, 9, 1, h, t);
    store_seq(kv, h, t, 1, b1);
    store_seq(kv, h, t, 1, b2); /* computed twice: two physical blocks, two events */
    assert_int_equal(r.stored_calls, 2);
    assert_int_equal(kvr_sim_kv_num_cached(kv), 2);
    kvr_sim_kv_release(kv, b1, 1);
    kvr_sim_kv_release(kv, b2, 1);
    assert_int_equal(kvr_sim_kv_alloc(kv, 3, x), 0); /* 2 fresh + b1 */
    assert_int_equal(r.removed, 1);
    assert_int_equal(kvr_sim_kv_longest_hit(kv, h, 1, out), 1); /* b2 still holds it */
    assert_int_equal(out[0], b2[0]);
    assert_int_equal(kvr_sim_kv_alloc(kv, 1, x + 3), 0);
    assert_int_equal(r.removed, 2);
    assert_int_equal(kvr_sim_kv_longest_hit(kv, h, 1, out), 0);
    assert_int_equal(kvr_sim_kv_num_cached(kv), 0);
    kvr_sim_kv_free_pool(kv);
}

static void test_reset_refused_while_in_use(void **state)
{
    (void)state;
    rec r;
    kvr_sim_kv *kv = pool(8, &r);
    uint64_t h[2];
    uint32_t t[2 * BS], b[2], out[2];
    chain(kv, 3, 2, h, t);
    store_seq(kv, h, t, 2, b);
    assert_int_equal(kvr_sim_kv_reset(kv), -1);
    assert_int_equal(r.cleared, 0);
    kvr_sim_kv_release(kv, b, 2);
    assert_int_equal(kvr_sim_kv_reset(kv), 0);
    assert_int_equal(r.cleared, 1);
    assert_int_equal(kvr_sim_kv_longest_hit(kv, h, 2, out), 0);
    assert_int_equal(kvr_sim_kv_num_cached(kv), 0);
    /* evicting after a reset reports nothing (the hashes are gone) */
    uint32_t x[8];
    assert_int_equal(kvr_sim_kv_alloc(kv, 8, x), 0);
    assert_int_equal(r.removed, 0);
    kvr_sim_kv_free_pool(kv);
}

/* Many sequences through a small pool: the table stays consistent with the blocks. */
static void test_churn_consistency(void **state)
{
    (void)state;
    rec r;
    kvr_sim_kv *kv = pool(64, &r);
    uint64_t h[8];
    uint32_t t[8 * BS], b[8], out[8];
    for (uint32_t round = 0; round < 2000; round++) {
        uint32_t base = (round * 7919u) % 50u * 1000u;
        chain(kv, base, 8, h, t);
        size_t hit = kvr_sim_kv_longest_hit(kv, h, 8, out);
        kvr_sim_kv_touch(kv, out, hit);
        memcpy(b, out, hit * sizeof(*b));
        assert_int_equal(kvr_sim_kv_alloc(kv, 8 - hit, b + hit), 0);
        kvr_sim_kv_cache(kv, b + hit, h + hit, 8 - hit, hit > 0, hit ? h[hit - 1] : 0,
                         t + hit * BS);
        assert_int_equal(kvr_sim_kv_longest_hit(kv, h, 8, out), 8);
        kvr_sim_kv_release(kv, b, 8);
        assert_int_equal(kvr_sim_kv_num_used(kv), 0);
        assert_true(kvr_sim_kv_num_cached(kv) <= 64);
    }
    assert_int_equal(r.stored_blocks - r.removed, kvr_sim_kv_num_cached(kv));
    kvr_sim_kv_free_pool(kv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hit_and_prefix_anchoring),
        cmocka_unit_test(test_pinned_blocks_survive_pressure),
        cmocka_unit_test(test_lru_evicts_tail_first),
        cmocka_unit_test(test_touch_protects_from_eviction_and_refreshes_lru),
        cmocka_unit_test(test_duplicates_stored_and_removed_separately),
        cmocka_unit_test(test_reset_refused_while_in_use),
        cmocka_unit_test(test_churn_consistency),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
