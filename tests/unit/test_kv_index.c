/* KV block index: chain keys, leading-run matching per worker and tier, reference counting of
 * duplicate stores, unknown parents and bad token counts, worker clearing and block size
 * changes, the cap, speculative entries, re-announces without tokens, and a randomized
 * comparison with a brute-force model. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <xxhash.h>

#include "index/kv_index.h"
#include "util/rand.h"

#define GPU KVR_KV_GPU
#define CPU KVR_KV_CPU

static uint32_t toks[64];

static void fill_tokens(uint32_t base)
{
    for (size_t i = 0; i < 64; i++)
        toks[i] = base + (uint32_t)i;
}

/* Stores blocks [first, first + n) of `toks` in blocks of bs under hashes h0 + block index. */
static size_t store(kvr_kv_index *ix, size_t w, uint64_t h0, size_t first, size_t n,
                    uint32_t bs, kvr_kv_medium m)
{
    uint64_t h[32];
    for (size_t i = 0; i < n; i++)
        h[i] = h0 + first + i;
    return kvr_kv_index_stored(ix, w, h, n, first > 0, h0 + first - 1, toks + first * bs,
                               n * bs, bs, m);
}

static size_t match(kvr_kv_index *ix, size_t w, size_t nblocks, uint32_t bs, uint64_t now,
                    size_t *gpu)
{
    uint64_t k[32];
    size_t nk = kvr_kv_index_keys(toks, nblocks * bs, bs, k, 32);
    return kvr_kv_index_match(ix, w, k, nk, now, gpu);
}

static kvr_kv_worker_stats wstats(kvr_kv_index *ix, size_t w)
{
    kvr_kv_worker_stats s;
    kvr_kv_index_worker_stats(ix, w, &s);
    return s;
}

static kvr_kv_index_stats istats(kvr_kv_index *ix)
{
    kvr_kv_index_stats s;
    kvr_kv_index_stats_get(ix, &s);
    return s;
}

static void test_keys_chain(void **state)
{
    (void)state;
    fill_tokens(100);
    uint64_t k[8] = {0};
    assert_int_equal(kvr_kv_index_keys(toks, 14, 4, k, 8), 3); /* the partial block has none */
    uint64_t seed = 0;
    for (size_t i = 0; i < 3; i++) {
        seed = XXH3_64bits_withSeed(toks + 4 * i, 16, seed);
        assert_true(k[i] == seed);
    }
    uint64_t k2[3] = {0, 0, 7};
    assert_int_equal(kvr_kv_index_keys(toks, 12, 4, k2, 2), 3); /* counts all, writes max */
    assert_true(k2[0] == k[0] && k2[1] == k[1] && k2[2] == 7);
    assert_int_equal(kvr_kv_index_keys(toks, 12, 0, k2, 2), 0);

    /* An event's chain, continued by a second event through its parent, gives the same keys. */
    kvr_kv_index *ix = kvr_kv_index_create(100);
    assert_int_equal(store(ix, 0, 1000, 0, 2, 4, GPU), 2);
    assert_int_equal(store(ix, 0, 1000, 2, 1, 4, GPU), 1);
    assert_int_equal(kvr_kv_index_match(ix, 0, k, 3, 0, NULL), 3);
    assert_int_equal(kvr_kv_index_block_size(ix, 0), 4);
    /* A request that differs in block 1 shares only block 0. */
    toks[5]++;
    assert_int_equal(match(ix, 0, 3, 4, 0, NULL), 1);
    toks[5]--;
    kvr_kv_index_destroy(ix);
    kvr_kv_index_destroy(NULL);
    assert_null(kvr_kv_index_create(0));
}

static void test_leading_run(void **state)
{
    (void)state;
    fill_tokens(1);
    kvr_kv_index *ix = kvr_kv_index_create(100);
    assert_int_equal(store(ix, 0, 10, 0, 4, 2, GPU), 4);
    size_t g = 99;
    assert_int_equal(match(ix, 0, 4, 2, 0, &g), 4);
    assert_int_equal(g, 4);
    uint64_t h = 12; /* block 2 */
    assert_int_equal(kvr_kv_index_removed(ix, 0, &h, 1, GPU), 1);
    assert_int_equal(match(ix, 0, 4, 2, 0, &g), 2); /* block 3 after the gap does not count */
    assert_int_equal(g, 2);
    /* Worker 1 holds blocks 1..2 only: no leading run at all. */
    assert_int_equal(store(ix, 1, 20, 0, 3, 2, GPU), 3);
    h = 20;
    assert_int_equal(kvr_kv_index_removed(ix, 1, &h, 1, GPU), 1);
    assert_int_equal(match(ix, 1, 3, 2, 0, &g), 0);
    assert_int_equal(g, 0);
    assert_int_equal(match(ix, 2, 3, 2, 0, &g), 0); /* a worker never seen */
    assert_int_equal(match(ix, 5000, 3, 2, 0, NULL), 0);
    assert_int_equal(wstats(ix, 1).blocks[GPU], 2);
    assert_int_equal(istats(ix).entries, 5);
    kvr_kv_index_destroy(ix);
}

static void test_duplicates(void **state)
{
    (void)state;
    fill_tokens(7);
    kvr_kv_index *ix = kvr_kv_index_create(100);
    assert_int_equal(store(ix, 0, 10, 0, 2, 4, GPU), 2);
    assert_int_equal(store(ix, 0, 10, 0, 2, 4, GPU), 2);
    kvr_kv_worker_stats s = wstats(ix, 0);
    assert_int_equal(s.entries, 2);
    assert_int_equal(s.blocks[GPU], 2);
    uint64_t h[2] = {10, 11};
    assert_int_equal(kvr_kv_index_removed(ix, 0, h, 2, GPU), 0); /* one copy left each */
    assert_int_equal(match(ix, 0, 2, 4, 0, NULL), 2);
    assert_int_equal(kvr_kv_index_removed(ix, 0, h, 2, GPU), 2);
    assert_int_equal(match(ix, 0, 2, 4, 0, NULL), 0);
    assert_int_equal(kvr_kv_index_removed(ix, 0, h, 2, GPU), 0); /* nothing left to drop */
    assert_int_equal(wstats(ix, 0).entries, 0);
    /* Two engine hashes for the same tokens (e.g. two KV-cache groups): one key, two entries. */
    assert_int_equal(store(ix, 0, 10, 0, 1, 4, GPU), 1);
    assert_int_equal(store(ix, 0, 50, 0, 1, 4, GPU), 1);
    s = wstats(ix, 0);
    assert_int_equal(s.entries, 2);
    assert_int_equal(s.blocks[GPU], 1);
    assert_int_equal(kvr_kv_index_removed(ix, 0, h, 1, GPU), 0);
    assert_int_equal(match(ix, 0, 1, 4, 0, NULL), 1);
    uint64_t h50 = 50;
    assert_int_equal(kvr_kv_index_removed(ix, 0, &h50, 1, GPU), 1);
    assert_int_equal(istats(ix).entries, 0);
    kvr_kv_index_destroy(ix);
}

static void test_tiers(void **state)
{
    (void)state;
    fill_tokens(3);
    kvr_kv_index *ix = kvr_kv_index_create(100);
    assert_int_equal(store(ix, 0, 10, 0, 3, 2, GPU), 3);
    assert_int_equal(store(ix, 0, 10, 0, 3, 2, CPU), 3); /* offloaded copies */
    kvr_kv_worker_stats s = wstats(ix, 0);
    assert_int_equal(s.blocks[GPU], 3);
    assert_int_equal(s.blocks[CPU], 3);
    assert_int_equal(s.entries, 3);
    uint64_t h = 11;
    assert_int_equal(kvr_kv_index_removed(ix, 0, &h, 1, GPU), 1);
    size_t g = 99;
    assert_int_equal(match(ix, 0, 3, 2, 0, &g), 3); /* the CPU copy still counts */
    assert_int_equal(g, 1);
    assert_int_equal(kvr_kv_index_removed(ix, 0, &h, 1, GPU), 0); /* no GPU copy: ignored */
    assert_int_equal(kvr_kv_index_removed(ix, 0, &h, 1, CPU), 1);
    assert_int_equal(match(ix, 0, 3, 2, 0, &g), 1);
    s = wstats(ix, 0);
    assert_int_equal(s.blocks[GPU], 2);
    assert_int_equal(s.blocks[CPU], 2);
    assert_int_equal(s.entries, 2);
    /* A chain stored only in the CPU tier matches with an empty GPU run. */
    assert_int_equal(store(ix, 1, 10, 0, 3, 2, CPU), 3);
    assert_int_equal(match(ix, 1, 3, 2, 0, &g), 3);
    assert_int_equal(g, 0);
    kvr_kv_index_destroy(ix);
}

static void test_unknown_parent_and_bad_tokens(void **state)
{
    (void)state;
    fill_tokens(9);
    kvr_kv_index *ix = kvr_kv_index_create(100);
    uint64_t h[2] = {1, 2};
    assert_int_equal(kvr_kv_index_stored(ix, 0, h, 2, 1, 999, toks, 8, 4, GPU), 0);
    kvr_kv_index_stats st = istats(ix);
    assert_int_equal(st.skipped_unknown_parent, 2);
    assert_int_equal(st.entries, 0);
    assert_int_equal(kvr_kv_index_block_size(ix, 0), 4); /* the size is learned anyway */
    assert_int_equal(kvr_kv_index_stored(ix, 0, h, 2, 0, 0, toks, 7, 4, GPU), 0);
    assert_int_equal(istats(ix).skipped_bad_tokens, 2);
    /* No block size in the event: the learned one applies. */
    assert_int_equal(kvr_kv_index_stored(ix, 0, h, 2, 0, 0, toks, 8, 0, GPU), 2);
    assert_int_equal(match(ix, 0, 2, 4, 0, NULL), 2);
    /* Tokens without any block size ever learned cannot be cut into blocks. */
    assert_int_equal(kvr_kv_index_stored(ix, 1, h, 1, 0, 0, toks, 4, 0, GPU), 0);
    assert_int_equal(istats(ix).skipped_bad_tokens, 3);
    assert_int_equal(kvr_kv_index_stored(ix, KVR_KV_INDEX_MAX_WORKER_ID, h, 1, 0, 0, toks, 4,
                                         4, GPU), 0);
    kvr_kv_index_destroy(ix);
}

static void test_no_token_reannounce(void **state)
{
    (void)state;
    fill_tokens(5);
    kvr_kv_index *ix = kvr_kv_index_create(100);
    assert_int_equal(store(ix, 0, 10, 0, 3, 4, GPU), 3);
    uint64_t h[3] = {10, 11, 777};
    /* An offload connector names the blocks without tokens (and with any parent). */
    assert_int_equal(kvr_kv_index_stored(ix, 0, h, 3, 1, 4242, NULL, 0, 4, CPU), 2);
    assert_int_equal(istats(ix).skipped_unknown_parent, 1);
    kvr_kv_worker_stats s = wstats(ix, 0);
    assert_int_equal(s.blocks[CPU], 2);
    assert_int_equal(s.entries, 3);
    uint64_t all[3] = {10, 11, 12};
    assert_int_equal(kvr_kv_index_removed(ix, 0, all, 3, GPU), 3);
    size_t g = 9;
    assert_int_equal(match(ix, 0, 3, 4, 0, &g), 2);
    assert_int_equal(g, 0);
    /* Unknown to another worker: nothing resolves there. */
    assert_int_equal(kvr_kv_index_stored(ix, 1, h, 2, 0, 0, NULL, 0, 4, CPU), 0);
    kvr_kv_index_destroy(ix);
}

static void test_rekey(void **state)
{
    (void)state;
    kvr_kv_index *ix = kvr_kv_index_create(100);
    fill_tokens(1);
    assert_int_equal(store(ix, 0, 10, 0, 1, 4, GPU), 1);
    assert_int_equal(store(ix, 0, 10, 0, 1, 4, CPU), 1);
    fill_tokens(500);
    assert_int_equal(store(ix, 0, 10, 0, 1, 4, GPU), 1); /* same hash, other tokens */
    kvr_kv_worker_stats s = wstats(ix, 0);
    assert_int_equal(s.entries, 1);
    assert_int_equal(s.blocks[GPU], 1);
    assert_int_equal(s.blocks[CPU], 0); /* the old mapping's refs went with it */
    assert_int_equal(match(ix, 0, 1, 4, 0, NULL), 1);
    fill_tokens(1);
    assert_int_equal(match(ix, 0, 1, 4, 0, NULL), 0);
    kvr_kv_index_destroy(ix);
}

static void test_clear_and_block_size(void **state)
{
    (void)state;
    fill_tokens(2);
    kvr_kv_index *ix = kvr_kv_index_create(1000);
    assert_int_equal(store(ix, 0, 10, 0, 8, 4, GPU), 8);
    assert_int_equal(store(ix, 1, 10, 0, 8, 4, GPU), 8);
    uint64_t k[8];
    kvr_kv_index_keys(toks, 64, 8, k, 8);
    assert_int_equal(kvr_kv_index_speculate(ix, 0, k, 2, 100), 2);
    assert_int_equal(istats(ix).entries, 18);
    assert_int_equal(kvr_kv_index_clear_worker(ix, 0), 10);
    kvr_kv_worker_stats s = wstats(ix, 0);
    assert_true(!s.blocks[GPU] && !s.blocks[CPU] && !s.entries && !s.speculative &&
                !s.block_size);
    assert_int_equal(match(ix, 0, 8, 4, 0, NULL), 0);
    assert_int_equal(kvr_kv_index_match(ix, 0, k, 2, 0, NULL), 0);
    assert_int_equal(match(ix, 1, 8, 4, 0, NULL), 8);
    assert_int_equal(istats(ix).entries, 8);
    assert_int_equal(kvr_kv_index_clear_worker(ix, 0), 0);
    assert_int_equal(kvr_kv_index_clear_worker(ix, 77), 0);
    /* A new block size makes the old keys meaningless: the worker starts over. */
    assert_int_equal(store(ix, 1, 100, 0, 2, 8, GPU), 2);
    s = wstats(ix, 1);
    assert_int_equal(s.block_size, 8);
    assert_int_equal(s.entries, 2);
    assert_int_equal(match(ix, 1, 8, 4, 0, NULL), 0);
    assert_int_equal(match(ix, 1, 2, 8, 0, NULL), 2);
    assert_int_equal(istats(ix).entries, 2);
    /* The old hashes are gone: a child of one has an unknown parent. */
    uint64_t h = 20;
    assert_int_equal(kvr_kv_index_stored(ix, 1, &h, 1, 1, 10, toks, 8, 8, GPU), 0);
    kvr_kv_index_destroy(ix);
}

static void test_cap(void **state)
{
    (void)state;
    fill_tokens(4);
    kvr_kv_index *ix = kvr_kv_index_create(10);
    assert_int_equal(store(ix, 0, 10, 0, 16, 4, GPU), 10);
    kvr_kv_index_stats st = istats(ix);
    assert_int_equal(st.entries, 10);
    assert_int_equal(st.skipped_cap, 6);
    assert_int_equal(store(ix, 0, 10, 0, 2, 4, CPU), 2); /* more copies: no new entries */
    uint64_t k[16];
    kvr_kv_index_keys(toks, 64, 4, k, 16);
    assert_int_equal(kvr_kv_index_speculate(ix, 1, k, 2, 100), 0);
    uint64_t h = 19;
    assert_int_equal(kvr_kv_index_removed(ix, 0, &h, 1, GPU), 1);
    assert_int_equal(kvr_kv_index_speculate(ix, 1, k, 2, 100), 1);
    assert_int_equal(istats(ix).entries, 10);
    /* At the cap, a store that settles a speculative key still fits: it is a swap. */
    assert_int_equal(store(ix, 1, 10, 0, 2, 4, GPU), 1);
    st = istats(ix);
    assert_int_equal(st.entries, 10);
    assert_int_equal(st.skipped_cap, 7);
    assert_int_equal(wstats(ix, 1).speculative, 0);
    /* A lowered cap keeps what is there and takes nothing new. */
    kvr_kv_index_set_max_blocks(ix, 5);
    assert_int_equal(istats(ix).entries, 10);
    h = 18;
    assert_int_equal(kvr_kv_index_removed(ix, 0, &h, 1, GPU), 1);
    assert_int_equal(store(ix, 0, 10, 8, 1, 4, GPU), 0);
    kvr_kv_index_destroy(ix);

    /* Memory stays bounded by the cap however much is stored, and follows the entries down. */
    ix = kvr_kv_index_create(1000);
    kvr_rand_seed(7);
    for (size_t i = 0; i < 2000; i++) {
        for (size_t j = 0; j < 64; j++)
            toks[j] = (uint32_t)kvr_rand_u64();
        store(ix, i % 4, i * 100, 0, 16, 4, GPU);
    }
    st = istats(ix);
    assert_int_equal(st.entries, 1000);
    assert_true(st.memory_bytes < 2 * 2048 * 40 + 4096);
    size_t dropped = 0;
    for (size_t w = 0; w < 4; w++)
        dropped += kvr_kv_index_clear_worker(ix, w);
    assert_int_equal(dropped, 1000);
    st = istats(ix);
    assert_int_equal(st.entries, 0);
    assert_true(st.memory_bytes < 2 * 64 * 40 + 4096);
    kvr_kv_index_destroy(ix);
}

static void test_speculative(void **state)
{
    (void)state;
    fill_tokens(6);
    kvr_kv_index *ix = kvr_kv_index_create(100);
    uint64_t k[4];
    kvr_kv_index_keys(toks, 16, 4, k, 4);
    assert_int_equal(kvr_kv_index_speculate(ix, 0, k, 3, 100), 3);
    size_t g = 0;
    assert_int_equal(kvr_kv_index_match(ix, 0, k, 4, 99, &g), 3);
    assert_int_equal(g, 3); /* speculative keys count as GPU */
    assert_int_equal(kvr_kv_index_match(ix, 0, k, 4, 100, &g), 0);
    assert_int_equal(kvr_kv_index_match(ix, 1, k, 4, 50, &g), 0);
    kvr_kv_worker_stats s = wstats(ix, 0);
    assert_int_equal(s.speculative, 3);
    assert_int_equal(istats(ix).entries, 3);
    assert_int_equal(kvr_kv_index_speculate(ix, 0, k, 2, 200), 2); /* later expiry wins */
    assert_int_equal(kvr_kv_index_speculate(ix, 0, k, 2, 150), 2); /* earlier one does not */
    assert_int_equal(kvr_kv_index_match(ix, 0, k, 4, 199, NULL), 2);
    assert_int_equal(kvr_kv_index_speculate(ix, 0, k, 1, 0), 0);
    /* An event confirms block 0: it is real from now on. */
    assert_int_equal(store(ix, 0, 10, 0, 1, 4, CPU), 1);
    s = wstats(ix, 0);
    assert_int_equal(s.speculative, 2);
    assert_int_equal(s.entries, 1);
    assert_int_equal(s.blocks[CPU], 1);
    assert_int_equal(istats(ix).entries, 3);
    assert_int_equal(kvr_kv_index_match(ix, 0, k, 4, 199, &g), 2);
    assert_int_equal(g, 0); /* block 0 is a real CPU block now */
    assert_int_equal(kvr_kv_index_match(ix, 0, k, 4, 1000, NULL), 1);
    /* Keys held for real are left alone. */
    assert_int_equal(kvr_kv_index_speculate(ix, 0, k, 1, 5000), 0);
    assert_int_equal(kvr_kv_index_sweep(ix, 99, 10), 0);
    assert_int_equal(kvr_kv_index_sweep(ix, 100, 10), 1); /* block 2, expired at 100 */
    assert_int_equal(kvr_kv_index_sweep(ix, 300, 10), 1);
    assert_int_equal(kvr_kv_index_sweep(ix, 300, 10), 0);
    s = wstats(ix, 0);
    assert_int_equal(s.speculative, 0);
    assert_int_equal(istats(ix).entries, 1);
    assert_int_equal(kvr_kv_index_match(ix, 0, k, 4, 0, NULL), 1);
    /* Sweeps take at most `max`, earliest expiry first, and every worker gets its turn. */
    uint64_t many[40];
    for (size_t i = 0; i < 40; i++)
        many[i] = 1000 + i;
    for (size_t i = 0; i < 10; i++) {
        assert_int_equal(kvr_kv_index_speculate(ix, 1, many + i, 1, 500 - i), 1);
        assert_int_equal(kvr_kv_index_speculate(ix, 2, many + 20 + i, 1, 500 + i), 1);
    }
    assert_int_equal(kvr_kv_index_sweep(ix, 495, 3), 3);
    assert_int_equal(kvr_kv_index_match(ix, 1, many + 9, 1, 0, NULL), 0); /* 491 went first */
    assert_int_equal(kvr_kv_index_match(ix, 1, many + 6, 1, 0, NULL), 1);
    assert_int_equal(kvr_kv_index_sweep(ix, 505, 100), 10 - 3 + 6);
    assert_int_equal(wstats(ix, 1).speculative, 0);
    assert_int_equal(wstats(ix, 2).speculative, 4);
    kvr_kv_index_destroy(ix);
}

/* ---- randomized comparison with a brute-force model ---- */

#define NW 3
#define MCAP 150
#define NSEQ 24
#define SEQ_TOKENS 32

typedef struct ment { uint64_t hash, key; uint32_t cnt[2]; } ment;
typedef struct mspec { uint64_t key, exp; } mspec;
typedef struct mworker {
    ment e[MCAP + 1];
    size_t ne;
    mspec s[MCAP + 1];
    size_t ns;
    uint32_t bs;
} mworker;

static mworker mw[NW];
static size_t mtotal;
static uint64_t m_parent, m_cap, m_tokens;

static long m_find_e(mworker *w, uint64_t hash)
{
    for (size_t i = 0; i < w->ne; i++)
        if (w->e[i].hash == hash)
            return (long)i;
    return -1;
}

static long m_find_s(mworker *w, uint64_t key)
{
    for (size_t i = 0; i < w->ns; i++)
        if (w->s[i].key == key)
            return (long)i;
    return -1;
}

static int m_held(mworker *w, uint64_t key, int t) /* t = -1: any tier */
{
    for (size_t i = 0; i < w->ne; i++)
        if (w->e[i].key == key && (t < 0 ? 1 : w->e[i].cnt[t] > 0))
            return 1;
    return 0;
}

static size_t m_add_copy(mworker *w, uint64_t hash, uint64_t key, int t)
{
    long i = m_find_e(w, hash);
    if (i >= 0 && w->e[i].key != key) {
        w->e[i] = w->e[--w->ne];
        mtotal--;
        i = -1;
    }
    if (i >= 0) {
        w->e[i].cnt[t]++;
        return 1;
    }
    long si = m_find_s(w, key);
    if (mtotal >= MCAP && si < 0) {
        m_cap++;
        return 0;
    }
    w->e[w->ne++] = (ment){hash, key, {t == 0, t == 1}};
    mtotal++;
    if (si >= 0) {
        w->s[si] = w->s[--w->ns];
        mtotal--;
    }
    return 1;
}

static size_t m_clear(mworker *w)
{
    size_t d = w->ne + w->ns;
    mtotal -= d;
    w->ne = w->ns = 0;
    w->bs = 0;
    return d;
}

static size_t m_stored(mworker *w, const uint64_t *h, size_t n, int hp, uint64_t parent,
                       const uint32_t *tk, size_t nt, uint32_t bs, int t)
{
    if (bs && w->bs != bs) {
        if (w->bs)
            m_clear(w);
        w->bs = bs;
    }
    size_t done = 0;
    if (!nt) {
        for (size_t i = 0; i < n; i++) {
            long e = m_find_e(w, h[i]);
            if (e < 0)
                m_parent++;
            else
                done += m_add_copy(w, h[i], w->e[e].key, t);
        }
        return done;
    }
    if (!w->bs || nt != n * w->bs) {
        m_tokens += n;
        return 0;
    }
    uint64_t seed = 0;
    if (hp) {
        long e = m_find_e(w, parent);
        if (e < 0) {
            m_parent += n;
            return 0;
        }
        seed = w->e[e].key;
    }
    for (size_t i = 0; i < n; i++) {
        seed = XXH3_64bits_withSeed(tk + i * w->bs, w->bs * 4, seed);
        done += m_add_copy(w, h[i], seed, t);
    }
    return done;
}

static size_t m_removed(mworker *w, const uint64_t *h, size_t n, int t)
{
    size_t gone = 0;
    for (size_t i = 0; i < n; i++) {
        long e = m_find_e(w, h[i]);
        if (e < 0 || !w->e[e].cnt[t])
            continue;
        uint64_t key = w->e[e].key;
        if (!--w->e[e].cnt[t] && !w->e[e].cnt[!t]) {
            w->e[e] = w->e[--w->ne];
            mtotal--;
        }
        gone += !m_held(w, key, t);
    }
    return gone;
}

static size_t m_match(mworker *w, const uint64_t *k, size_t nk, uint64_t now, size_t *g)
{
    size_t run = 0;
    int gpu = 1;
    *g = 0;
    for (; run < nk; run++) {
        long si = m_find_s(w, k[run]);
        int live = si >= 0 && now < w->s[si].exp;
        if (!live && !m_held(w, k[run], -1))
            break;
        gpu = gpu && (live || m_held(w, k[run], 0));
        *g += (size_t)gpu;
    }
    return run;
}

static size_t m_spec(mworker *w, const uint64_t *k, size_t n, uint64_t exp)
{
    size_t done = 0;
    for (size_t i = 0; i < n; i++) {
        if (m_held(w, k[i], -1))
            continue;
        long si = m_find_s(w, k[i]);
        if (si >= 0) {
            if (exp > w->s[si].exp)
                w->s[si].exp = exp;
            done++;
            continue;
        }
        size_t nspec = 0;
        for (size_t wi = 0; wi < NW; wi++)
            nspec += mw[wi].ns;
        if (mtotal >= MCAP || nspec >= MCAP / 4) /* guesses: a quarter of the cap at most */
            continue;
        w->s[w->ns++] = (mspec){k[i], exp};
        mtotal++;
        done++;
    }
    return done;
}

static size_t m_sweep(uint64_t now)
{
    size_t d = 0;
    for (size_t wi = 0; wi < NW; wi++)
        for (size_t i = 0; i < mw[wi].ns;)
            if (mw[wi].s[i].exp <= now) {
                mw[wi].s[i] = mw[wi].s[--mw[wi].ns];
                mtotal--;
                d++;
            } else {
                i++;
            }
    return d;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static size_t m_blocks(mworker *w, int t)
{
    uint64_t k[MCAP + 1];
    size_t n = 0, d = 0;
    for (size_t i = 0; i < w->ne; i++)
        if (w->e[i].cnt[t])
            k[n++] = w->e[i].key;
    qsort(k, n, sizeof(k[0]), cmp_u64);
    for (size_t i = 0; i < n; i++)
        d += !i || k[i] != k[i - 1];
    return d;
}

static void check_stats(kvr_kv_index *ix)
{
    kvr_kv_index_stats st = istats(ix);
    assert_int_equal(st.entries, mtotal);
    assert_int_equal(st.skipped_unknown_parent, m_parent);
    assert_int_equal(st.skipped_cap, m_cap);
    assert_int_equal(st.skipped_bad_tokens, m_tokens);
    for (size_t w = 0; w < NW; w++) {
        kvr_kv_worker_stats s = wstats(ix, w);
        assert_int_equal(s.entries, mw[w].ne);
        assert_int_equal(s.speculative, mw[w].ns);
        assert_int_equal(s.block_size, mw[w].bs);
        assert_int_equal(s.blocks[GPU], m_blocks(&mw[w], 0));
        assert_int_equal(s.blocks[CPU], m_blocks(&mw[w], 1));
    }
}

/* Engine hashes are mostly a function of the prefix (as vLLM's are), so the same prefix stored
 * twice is a duplicate; some come from a small pool, so one hash meets several prefixes. */
static uint64_t ehash(uint64_t key)
{
    return kvr_rand_below(10) ? key * 0x9e3779b97f4a7c15ull + 1 : 1 + kvr_rand_below(40);
}

static void test_random_vs_model(void **state)
{
    (void)state;
    clock_t t0 = clock();
    kvr_rand_seed(12345);
    memset(mw, 0, sizeof(mw));
    mtotal = 0;
    m_parent = m_cap = m_tokens = 0;
    static uint32_t seq[NSEQ][SEQ_TOKENS];
    for (size_t s = 0; s < NSEQ; s++) {
        /* Sequences share prefixes of earlier ones, as conversations and system prompts do. */
        size_t keep = s ? kvr_rand_below(SEQ_TOKENS) : 0;
        if (keep)
            memcpy(seq[s], seq[kvr_rand_below(s)], keep * sizeof(uint32_t));
        for (size_t i = keep; i < SEQ_TOKENS; i++)
            seq[s][i] = (uint32_t)kvr_rand_below(3);
    }
    kvr_kv_index *ix = kvr_kv_index_create(MCAP);
    uint64_t now = 1;
    size_t matched = 0;
    for (int op = 0; op < 20000; op++) {
        size_t wi = kvr_rand_below(NW);
        mworker *w = &mw[wi];
        uint32_t bs = w->bs ? w->bs : 2;
        if (!kvr_rand_below(400))
            bs = bs == 2 ? 4 : 2; /* a block size change clears the worker */
        const uint32_t *sq = seq[kvr_rand_below(NSEQ)];
        size_t nblk = SEQ_TOKENS / bs;
        uint64_t keys[SEQ_TOKENS], h[SEQ_TOKENS];
        kvr_kv_index_keys(sq, SEQ_TOKENS, bs, keys, SEQ_TOKENS);
        now += kvr_rand_below(4);
        unsigned r = (unsigned)kvr_rand_below(100);
        if (r < 40) { /* stored with tokens */
            /* Mostly early blocks, whose parents are more likely stored. */
            size_t st = kvr_rand_below(1 + kvr_rand_below(nblk)), n = 1 + kvr_rand_below(4);
            if (st + n > nblk)
                n = nblk - st;
            for (size_t i = 0; i < n; i++)
                h[i] = ehash(keys[st + i]);
            int hp = st > 0;
            uint64_t parent = hp ? keys[st - 1] * 0x9e3779b97f4a7c15ull + 1 : 0;
            if (!kvr_rand_below(10))
                parent = 1 + kvr_rand_below(60), hp = 1;
            size_t nt = n * bs - (kvr_rand_below(30) == 0);
            uint32_t ebs = kvr_rand_below(10) ? bs : 0;
            int t = kvr_rand_below(5) == 0;
            size_t m = m_stored(w, h, n, hp, parent, sq + st * bs, nt, ebs, t);
            assert_int_equal(kvr_kv_index_stored(ix, wi, h, n, hp, parent, sq + st * bs, nt,
                                                 ebs, t ? CPU : GPU), m);
        } else if (r < 47) { /* re-announce without tokens */
            size_t n = 1 + kvr_rand_below(4);
            for (size_t i = 0; i < n; i++)
                h[i] = w->ne && kvr_rand_below(5) ? w->e[kvr_rand_below(w->ne)].hash
                                                  : 1 + kvr_rand_below(60);
            int t = (int)kvr_rand_below(2);
            size_t m = m_stored(w, h, n, 0, 0, NULL, 0, bs, t);
            assert_int_equal(kvr_kv_index_stored(ix, wi, h, n, 0, 0, NULL, 0, bs,
                                                 t ? CPU : GPU), m);
        } else if (r < 60) { /* removed */
            size_t n = 1 + kvr_rand_below(4);
            for (size_t i = 0; i < n; i++)
                h[i] = w->ne && kvr_rand_below(10) ? w->e[kvr_rand_below(w->ne)].hash
                                                   : 1 + kvr_rand_below(60);
            int t = kvr_rand_below(3) == 0;
            size_t m = m_removed(w, h, n, t);
            assert_int_equal(kvr_kv_index_removed(ix, wi, h, n, t ? CPU : GPU), m);
        } else if (r < 61) {
            if (!kvr_rand_below(5))
                assert_int_equal(kvr_kv_index_clear_worker(ix, wi), m_clear(w));
        } else if (r < 68) { /* speculate */
            size_t n = 1 + kvr_rand_below(nblk);
            uint64_t exp = now + 1 + kvr_rand_below(200);
            size_t m = m_spec(w, keys, n, exp);
            assert_int_equal(kvr_kv_index_speculate(ix, wi, keys, n, exp), m);
        } else if (r < 71) {
            assert_int_equal(kvr_kv_index_sweep(ix, now, SIZE_MAX), m_sweep(now));
        } else { /* match */
            size_t g, mg = 0;
            size_t m = m_match(w, keys, nblk, now, &mg);
            assert_int_equal(kvr_kv_index_match(ix, wi, keys, nblk, now, &g), m);
            assert_int_equal(g, mg);
            matched += m > 0;
        }
        check_stats(ix);
    }
    /* The run exercised what it is meant to: hits, caps, unknown parents, bad tokens. */
    assert_true(matched > 1000);
    assert_true(m_cap > 0 && m_parent > 0 && m_tokens > 0);
    for (size_t w = 0; w < NW; w++)
        assert_int_equal(kvr_kv_index_clear_worker(ix, w), m_clear(&mw[w]));
    assert_int_equal(istats(ix).entries, 0);
    kvr_kv_index_destroy(ix);
    assert_true((double)(clock() - t0) / CLOCKS_PER_SEC < 2.0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keys_chain),
        cmocka_unit_test(test_leading_run),
        cmocka_unit_test(test_duplicates),
        cmocka_unit_test(test_tiers),
        cmocka_unit_test(test_unknown_parent_and_bad_tokens),
        cmocka_unit_test(test_no_token_reannounce),
        cmocka_unit_test(test_rekey),
        cmocka_unit_test(test_clear_and_block_size),
        cmocka_unit_test(test_cap),
        cmocka_unit_test(test_speculative),
        cmocka_unit_test(test_random_vs_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
