/* kvroute-sim held KV blocks (a prefill keeping a request's blocks for its decode): a hold
 * pins blocks against eviction, ends on fetch, expiry or a full table, and a replaced key
 * gives its blocks back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "kvcache.h"
#include "kvhold.h"

#define BS 4

/* Computes and caches a 3-block prompt in `kv`, then frees it as a finished sequence would;
 * `blocks` gets the block ids (held by the caller: ref 1 until released). */
static void prefill(kvr_sim_kv *kv, uint32_t base, uint32_t blocks[3], uint32_t tokens[12])
{
    uint64_t h[3], parent = kvr_sim_kv_root_hash(kv);
    for (uint32_t i = 0; i < 12; i++)
        tokens[i] = base + i;
    for (int i = 0; i < 3; i++)
        parent = h[i] = kvr_sim_kv_hash_block(kv, parent, tokens + i * BS);
    assert_int_equal(kvr_sim_kv_alloc(kv, 3, blocks), 0);
    kvr_sim_kv_cache(kv, blocks, h, 3, 0, 0, tokens);
}

static void test_hold_pins_blocks_until_released(void **state)
{
    (void)state;
    kvr_sim_kv *kv = kvr_sim_kv_new(4, BS, 0);
    kvr_sim_hold *h = kvr_sim_hold_new(8);
    uint32_t b[3], t[12];
    prefill(kv, 100, b, t);
    assert_int_equal(kvr_sim_hold_put(h, "req-1", kv, 0, b, 3, t, 1000), 0);
    kvr_sim_kv_release(kv, b, 3); /* the sequence ends */
    assert_int_equal(kvr_sim_kv_num_used(kv), 3);
    assert_int_equal(kvr_sim_hold_blocks(h), 3);
    /* the pool cannot take them: only one block is free */
    uint32_t x[2];
    assert_int_equal(kvr_sim_kv_alloc(kv, 2, x), -1);
    const kvr_sim_hold_entry *e = kvr_sim_hold_get(h, "req-1");
    assert_non_null(e);
    assert_int_equal(e->n, 3);
    assert_memory_equal(e->blocks, b, sizeof(b));
    assert_memory_equal(e->tokens, t, sizeof(t));
    assert_int_equal(kvr_sim_hold_release(h, "req-1"), 0);
    assert_null(kvr_sim_hold_get(h, "req-1"));
    assert_int_equal(kvr_sim_hold_release(h, "req-1"), -1);
    assert_int_equal(kvr_sim_kv_num_used(kv), 0);
    assert_int_equal(kvr_sim_kv_num_cached(kv), 3); /* still cached, now evictable */
    assert_int_equal(kvr_sim_kv_alloc(kv, 2, x), 0);
    kvr_sim_hold_free(h);
    kvr_sim_kv_free_pool(kv);
}

static void test_hold_expiry(void **state)
{
    (void)state;
    kvr_sim_kv *kv = kvr_sim_kv_new(16, BS, 0);
    kvr_sim_hold *h = kvr_sim_hold_new(8);
    uint32_t b1[3], b2[3], t[12];
    prefill(kv, 100, b1, t);
    prefill(kv, 200, b2, t);
    assert_int_equal(kvr_sim_hold_put(h, "a", kv, 0, b1, 3, t, 100), 0);
    assert_int_equal(kvr_sim_hold_put(h, "b", kv, 1, b2, 3, t, 200), 0);
    kvr_sim_kv_release(kv, b1, 3);
    kvr_sim_kv_release(kv, b2, 3);
    assert_int_equal(kvr_sim_hold_next_expiry(h), 100);
    assert_int_equal(kvr_sim_hold_expire(h, 99), 0);
    assert_int_equal(kvr_sim_hold_expire(h, 100), 1);
    assert_null(kvr_sim_hold_get(h, "a"));
    assert_int_equal(kvr_sim_hold_get(h, "b")->rank, 1);
    assert_int_equal(kvr_sim_kv_num_used(kv), 3);
    assert_int_equal(kvr_sim_hold_next_expiry(h), 200);
    assert_int_equal(kvr_sim_hold_expire(h, 1000), 1);
    assert_int_equal(kvr_sim_hold_next_expiry(h), UINT64_MAX);
    assert_int_equal(kvr_sim_hold_expired(h), 2);
    assert_int_equal(kvr_sim_kv_num_used(kv), 0);
    assert_int_equal(kvr_sim_hold_count(h), 0);
    kvr_sim_hold_free(h);
    kvr_sim_kv_free_pool(kv);
}

static void test_full_table_ends_oldest_and_same_key_replaces(void **state)
{
    (void)state;
    kvr_sim_kv *kv = kvr_sim_kv_new(32, BS, 0);
    kvr_sim_hold *h = kvr_sim_hold_new(2);
    uint32_t b[4][3], t[12];
    for (int i = 0; i < 4; i++)
        prefill(kv, 100u * (uint32_t)(i + 1), b[i], t);
    assert_int_equal(kvr_sim_hold_put(h, "a", kv, 0, b[0], 3, t, 10), 0);
    assert_int_equal(kvr_sim_hold_put(h, "b", kv, 0, b[1], 3, t, 20), 0);
    assert_int_equal(kvr_sim_hold_put(h, "c", kv, 0, b[2], 3, t, 30), 0);
    for (int i = 0; i < 4; i++)
        kvr_sim_kv_release(kv, b[i], 3);
    assert_null(kvr_sim_hold_get(h, "a"));
    assert_int_equal(kvr_sim_hold_evicted(h), 1);
    assert_int_equal(kvr_sim_hold_count(h), 2);
    assert_int_equal(kvr_sim_kv_num_used(kv), 6);
    /* the same key again: the old blocks go back, the new ones are held (no eviction) */
    kvr_sim_kv_touch(kv, b[3], 3);
    assert_int_equal(kvr_sim_hold_put(h, "b", kv, 0, b[3], 3, t, 40), 0);
    kvr_sim_kv_release(kv, b[3], 3);
    assert_int_equal(kvr_sim_hold_evicted(h), 1);
    assert_memory_equal(kvr_sim_hold_get(h, "b")->blocks, b[3], sizeof(b[3]));
    assert_int_equal(kvr_sim_kv_num_used(kv), 6);
    assert_int_equal(kvr_sim_hold_blocks(h), 6);
    kvr_sim_hold_free(h); /* releases what is left */
    assert_int_equal(kvr_sim_kv_num_used(kv), 0);
    kvr_sim_kv_free_pool(kv);
}

static void test_empty_hold(void **state)
{
    (void)state;
    kvr_sim_kv *kv = kvr_sim_kv_new(4, BS, 0);
    kvr_sim_hold *h = kvr_sim_hold_new(1);
    assert_int_equal(kvr_sim_hold_put(h, "short prompt", kv, 0, NULL, 0, NULL, 5), 0);
    assert_int_equal(kvr_sim_hold_get(h, "short prompt")->n, 0);
    assert_int_equal(kvr_sim_hold_expire(h, 5), 1);
    kvr_sim_hold_free(h);
    kvr_sim_kv_free_pool(kv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hold_pins_blocks_until_released),
        cmocka_unit_test(test_hold_expiry),
        cmocka_unit_test(test_full_table_ends_oldest_and_same_key_replaces),
        cmocka_unit_test(test_empty_hold),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
