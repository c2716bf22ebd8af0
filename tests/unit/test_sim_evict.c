/* kvroute-sim's on-demand eviction (POST /sim/evict): every free cached block loses its hash
 * with one `removed` event, in free-queue order; held blocks keep theirs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "kvcache.h"

#define BS 4

typedef struct rec {
    uint64_t removed[16];
    size_t nremoved;
} rec;

static void on_removed(void *ud, uint64_t h)
{
    rec *r = ud;
    assert_true(r->nremoved < 16);
    r->removed[r->nremoved++] = h;
}

/* Caches a sequence of `nb` blocks (tokens base, base+1, …) and leaves it held. */
static void cached_seq(kvr_sim_kv *kv, uint32_t base, size_t nb, uint64_t *h, uint32_t *b)
{
    uint32_t t[4 * BS];
    uint64_t parent = kvr_sim_kv_root_hash(kv);
    for (size_t i = 0; i < nb * BS; i++)
        t[i] = base + (uint32_t)i;
    for (size_t i = 0; i < nb; i++)
        parent = h[i] = kvr_sim_kv_hash_block(kv, parent, t + i * BS);
    assert_int_equal(kvr_sim_kv_alloc(kv, nb, b), 0);
    kvr_sim_kv_cache(kv, b, h, nb, 0, 0, t);
}

static void test_evicts_free_blocks_only(void **state)
{
    (void)state;
    kvr_sim_kv *kv = kvr_sim_kv_new(8, BS, 0);
    rec r = {0};
    kvr_sim_kv_sink sink = {NULL, on_removed, NULL, &r};
    kvr_sim_kv_set_sink(kv, &sink);
    uint64_t ha[3], hb[2];
    uint32_t ba[3], bb[2], out[3];
    cached_seq(kv, 100, 3, ha, ba);
    cached_seq(kv, 200, 2, hb, bb);
    kvr_sim_kv_release(kv, ba, 3); /* freed last-first, behind the 3 never-used blocks */
    assert_int_equal(kvr_sim_kv_evict_free(kv), 3);
    assert_int_equal(r.nremoved, 3);
    assert_true(r.removed[0] == ha[2] && r.removed[1] == ha[1] && r.removed[2] == ha[0]);
    assert_int_equal(kvr_sim_kv_longest_hit(kv, ha, 3, out), 0);
    assert_int_equal(kvr_sim_kv_longest_hit(kv, hb, 2, out), 2); /* held: untouched */
    assert_int_equal(kvr_sim_kv_num_cached(kv), 2);
    assert_int_equal(kvr_sim_kv_num_free(kv), 6);
    assert_int_equal(kvr_sim_kv_evictions(kv), 3);
    assert_int_equal(kvr_sim_kv_evict_free(kv), 0);
    /* reusing the evicted blocks reports nothing more */
    uint32_t all[6];
    assert_int_equal(kvr_sim_kv_alloc(kv, 6, all), 0);
    assert_int_equal(r.nremoved, 3);
    kvr_sim_kv_release(kv, all, 6);
    kvr_sim_kv_release(kv, bb, 2);
    assert_int_equal(kvr_sim_kv_evict_free(kv), 2);
    assert_int_equal(kvr_sim_kv_num_cached(kv), 0);
    assert_int_equal(kvr_sim_kv_reset(kv), 0);
    kvr_sim_kv_free_pool(kv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_evicts_free_blocks_only),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
