/* Prefix block index: matching semantics (anchored, exact repeat 1.00, partial blocks), LRU
 * eviction against a brute-force model, caps under random traffic, ancestors outliving tails,
 * worker removal. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "index/prefix_index.h"
#include "util/xxh.h"
#include "util/rand.h"

#define B 64

static kvr_prefix_index *mk(size_t max_blocks, size_t worker_blocks)
{
    kvr_prefix_index_cfg c = {.block_bytes = B, .max_blocks = max_blocks,
                              .worker_blocks = worker_blocks};
    kvr_prefix_index *ix = kvr_prefix_index_create(&c);
    assert_non_null(ix);
    return ix;
}

/* Deterministic pseudo-random text. */
static void fill(char *p, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (char)('a' + (seed >> 59) % 26);
    }
}

static size_t match1(kvr_prefix_index *ix, size_t w, const char *t, size_t n)
{
    size_t m;
    kvr_prefix_index_match(ix, t, n, &w, 1, &m);
    return m;
}

static void test_exact_repeat_and_partial(void **state)
{
    (void)state;
    kvr_prefix_index *ix = mk(1000, 0);
    char t[1000];
    fill(t, sizeof(t), 1);
    /* An exact repeat matches 1.00, whether or not the text ends on a block boundary. */
    assert_int_equal(kvr_prefix_index_insert(ix, 3, t, 1000), 0);
    assert_int_equal(match1(ix, 3, t, 1000), 1000);
    assert_int_equal(kvr_prefix_index_insert(ix, 4, t, 640), 0);
    assert_int_equal(match1(ix, 4, t, 640), 640);
    /* A held partial block never matches a longer text: 1000 = 15 full blocks + 40 bytes. */
    char longer[1001];
    memcpy(longer, t, 1000);
    longer[1000] = 'x';
    assert_int_equal(match1(ix, 3, longer, 1001), 960);
    /* ...nor a shorter one ending inside that block. */
    assert_int_equal(match1(ix, 3, t, 999), 960);
    /* A prefix of a held text matches its full blocks. */
    assert_int_equal(match1(ix, 3, t, 700), 640);
    assert_int_equal(match1(ix, 3, t, 640), 640);
    assert_int_equal(match1(ix, 3, t, 63), 0);
    /* Unknown worker, empty text. */
    assert_int_equal(match1(ix, 9, t, 1000), 0);
    assert_int_equal(match1(ix, 3, t, 0), 0);
    kvr_prefix_index_stats st;
    kvr_prefix_index_stats_get(ix, &st);
    assert_int_equal(st.blocks, 16);   /* worker 4's 10 blocks are shared with worker 3's */
    assert_int_equal(st.holdings, 26);
    kvr_prefix_index_destroy(ix);
}

static void test_anchored_at_start(void **state)
{
    (void)state;
    kvr_prefix_index *ix = mk(1000, 0);
    char t[640], shifted[641];
    fill(t, sizeof(t), 2);
    kvr_prefix_index_insert(ix, 1, t, sizeof(t));
    /* The same bytes one position later share no block key. */
    shifted[0] = '#';
    memcpy(shifted + 1, t, sizeof(t));
    assert_int_equal(match1(ix, 1, shifted, sizeof(shifted)), 0);
    /* Blocks in another order: only the leading run counts. */
    char swapped[640];
    memcpy(swapped, t + 64, 64);
    memcpy(swapped + 64, t, 64);
    memcpy(swapped + 128, t + 128, 512);
    assert_int_equal(match1(ix, 1, swapped, sizeof(swapped)), 0);
    /* A divergence in block 3 stops the match there, whatever follows. */
    char div[640];
    memcpy(div, t, sizeof(t));
    div[3 * 64 + 5] ^= 1;
    assert_int_equal(match1(ix, 1, div, sizeof(div)), 3 * 64);
    kvr_prefix_index_destroy(ix);
}

static void test_several_workers(void **state)
{
    (void)state;
    kvr_prefix_index *ix = mk(1000, 0);
    char t[2000];
    fill(t, sizeof(t), 3);
    kvr_prefix_index_insert(ix, 0, t, 640);
    kvr_prefix_index_insert(ix, 1, t, 2000);
    kvr_prefix_index_insert(ix, 2, t + 1, 500);
    size_t ws[4] = {2, 1, 0, 5}, m[4];
    kvr_prefix_index_match(ix, t, 2000, ws, 4, m);
    assert_int_equal(m[0], 0);
    assert_int_equal(m[1], 2000);
    assert_int_equal(m[2], 640);
    assert_int_equal(m[3], 0);
    /* Only the workers asked about count. */
    size_t w0 = 0;
    kvr_prefix_index_match(ix, t, 2000, &w0, 1, m);
    assert_int_equal(m[0], 640);
    kvr_prefix_index_destroy(ix);
}

/* Reference model: per worker, the list of held keys, most recent first. */
typedef struct model_w {
    uint64_t *keys;
    size_t n, cap;
} model_w;

static void model_insert(model_w *w, const uint64_t *k, size_t nk)
{
    size_t m = nk < w->cap ? nk : w->cap;
    for (size_t i = m; i-- > 0;) {
        size_t j;
        for (j = 0; j < w->n; j++)
            if (w->keys[j] == k[i])
                break;
        if (j == w->n)
            w->n++;
        memmove(w->keys + 1, w->keys, j * sizeof(uint64_t));
        w->keys[0] = k[i];
    }
    if (w->n > w->cap)
        w->n = w->cap;
}

static size_t model_find(const model_w *w, uint64_t key)
{
    size_t j = 0;
    while (j < w->n && w->keys[j] != key)
        j++;
    return j;
}

/* kvr_prefix_index_insert_new's contract: the blocks past the held leading run go right
 * behind its last block, in order, and the run keeps its place; nothing moves when all are
 * held; no held run, or a block of the text among the victims of making room: a plain
 * insert. */
static void model_insert_new(model_w *w, const uint64_t *k, size_t nk)
{
    size_t m = nk < w->cap ? nk : w->cap, h = 0;
    while (h < m && model_find(w, k[h]) < w->n)
        h++;
    if (!h) {
        model_insert(w, k, nk);
        return;
    }
    /* Room first, from the tail, while the tail is no block of this text. */
    while (w->n + (m - h) > w->cap) {
        size_t i = 0;
        while (i < m && k[i] != w->keys[w->n - 1])
            i++;
        if (i < m) {
            model_insert(w, k, nk);
            return;
        }
        w->n--;
    }
    for (size_t i = h; i < m; i++) { /* held past a hole: taken out, placed with the rest */
        size_t j = model_find(w, k[i]);
        if (j < w->n) {
            memmove(w->keys + j, w->keys + j + 1, (w->n - j - 1) * sizeof(uint64_t));
            w->n--;
        }
    }
    size_t p = model_find(w, k[h - 1]) + 1;
    memmove(w->keys + p + (m - h), w->keys + p, (w->n - p) * sizeof(uint64_t));
    memcpy(w->keys + p, k + h, (m - h) * sizeof(uint64_t));
    w->n += m - h;
}

static size_t model_match(const model_w *w, const uint64_t *k, size_t nk, size_t len)
{
    size_t i;
    for (i = 0; i < nk; i++) {
        size_t j;
        for (j = 0; j < w->n; j++)
            if (w->keys[j] == k[i])
                break;
        if (j == w->n)
            break;
    }
    return i * B > len ? len : i * B;
}

/* Texts built from a small tree of shared prefixes, like conversations sharing system prompts. */
static size_t make_text(char *buf, uint64_t r)
{
    size_t fam = r % 5, conv = (r >> 8) % 40, turns = 1 + (r >> 16) % 6, n = 0;
    fill(buf, 200 + fam * 37, 100 + fam);          /* family prefix (partial blocks too) */
    n = 200 + fam * 37;
    fill(buf + n, 130, 1000 + fam * 100 + conv);   /* the conversation */
    n += 130;
    for (size_t t = 0; t < turns; t++) {           /* its turns so far */
        fill(buf + n, 90, 50000 + conv * 10 + t);
        n += 90;
    }
    return n;
}

/* Teaches `buf` (n bytes, its block keys `keys`) to worker `to` in the index and the model,
 * then matches it against every worker of both. */
static void teach_checked(kvr_prefix_index *ix, model_w *mw, size_t nw, size_t *ws,
                          size_t *got, size_t to, const char *buf, size_t n,
                          const uint64_t *keys, size_t nk, int new_only)
{
    if (new_only) {
        assert_int_equal(kvr_prefix_index_insert_new(ix, to, buf, n, NULL), 0);
        model_insert_new(&mw[to], keys, nk);
    } else {
        assert_int_equal(kvr_prefix_index_insert(ix, to, buf, n), 0);
        model_insert(&mw[to], keys, nk);
    }
    assert_int_equal(kvr_prefix_index_worker_blocks(ix, to), mw[to].n);
    kvr_prefix_index_match(ix, buf, n, ws, nw, got);
    for (size_t i = 0; i < nw; i++)
        assert_int_equal(got[i], model_match(&mw[i], keys, nk, n));
}

/* Random traffic on `nw` workers with per-worker caps, compared with the model after every
 * step; now and then a worker leaves. Families of texts are shared by all workers, so keys get
 * many holders (several holder groups, compaction on every removal). */
static void run_model(size_t nw, size_t cap, int rounds, uint64_t seed)
{
    kvr_rand_seed(seed);
    kvr_prefix_index *ix = mk(1u << 30, cap);
    model_w *mw = calloc(nw, sizeof(*mw));
    size_t *ws = calloc(nw, sizeof(size_t)), *got = calloc(nw, sizeof(size_t));
    for (size_t i = 0; i < nw; i++) {
        mw[i] = (model_w){calloc(cap + 200, sizeof(uint64_t)), 0, cap};
        ws[i] = i;
    }
    char buf[2000];
    uint64_t keys[64];
    for (int r = 0; r < rounds; r++) {
        uint64_t x = kvr_rand_u64();
        size_t n = make_text(buf, x);
        size_t nk = kvr_prefix_index_block_keys(B, buf, n, keys, 64);
        size_t w = (x >> 40) % nw;
        assert_int_equal(kvr_prefix_index_insert(ix, w, buf, n), 0);
        model_insert(&mw[w], keys, nk);
        assert_int_equal(kvr_prefix_index_worker_blocks(ix, w), mw[w].n);
        if (r % 397 == 396) {
            size_t gone = kvr_rand_below(nw);
            assert_int_equal(kvr_prefix_index_forget_worker(ix, gone), mw[gone].n);
            mw[gone].n = 0;
        }
        /* Probe a random text against every worker. */
        n = make_text(buf, kvr_rand_u64());
        nk = kvr_prefix_index_block_keys(B, buf, n, keys, 64);
        kvr_prefix_index_match(ix, buf, n, ws, nw, got);
        for (size_t i = 0; i < nw; i++)
            assert_int_equal(got[i], model_match(&mw[i], keys, nk, n));
        /* The probed text routed and taught, as a request is: the insert reuses the keys its
         * match hashed (and, for a worker holding most of it, touches the held run at once). */
        if (x & 1) {
            size_t to = (x >> 20) % nw;
            /* When the reply's teach follows, the prompt's records only new blocks (as
             * the proxy teaches when an answer starts), half of the time. */
            teach_checked(ix, mw, nw, ws, got, to, buf, n, keys, nk, (x & 2) && (x & 8));
            /* Its reply taught next, as completion teaching does: the same text grown, on the
             * same worker (whose insert reuses the slots the first one left), now and then
             * after another worker's insert that moved slots meanwhile. */
            if (x & 2) {
                if (x & 4) {
                    char other[2000];
                    uint64_t okeys[64];
                    size_t on = make_text(other, x ^ 0x9e3779b97f4a7c15ull);
                    size_t onk = kvr_prefix_index_block_keys(B, other, on, okeys, 64);
                    /* After a prompt taught new blocks only, on its own worker too: that
                     * insert's evictions meet the run the first one left unrefreshed. */
                    size_t ow = (x & 16) ? to : (to + 1) % nw;
                    assert_int_equal(kvr_prefix_index_insert(ix, ow, other, on), 0);
                    model_insert(&mw[ow], okeys, onk);
                }
                size_t n2 = n + 1 + (x >> 50) % 150;
                fill(buf + n, n2 - n, x);
                nk = kvr_prefix_index_block_keys(B, buf, n2, keys, 64);
                teach_checked(ix, mw, nw, ws, got, to, buf, n2, keys, nk, 0);
            }
        }
    }
    kvr_prefix_index_stats st;
    kvr_prefix_index_stats_get(ix, &st);
    assert_true(st.evictions > 0);
    size_t total = 0;
    for (size_t i = 0; i < nw; i++) {
        total += mw[i].n;
        free(mw[i].keys);
    }
    assert_int_equal(st.holdings, total);
    for (size_t i = 0; i < nw; i++)
        kvr_prefix_index_forget_worker(ix, i);
    kvr_prefix_index_stats_get(ix, &st);
    assert_int_equal(st.blocks, 0);
    assert_int_equal(st.holdings, 0);
    free(mw);
    free(ws);
    free(got);
    kvr_prefix_index_destroy(ix);
}

static void test_lru_matches_model(void **state)
{
    (void)state;
    run_model(4, 60, 3000, 7);
    run_model(12, 30, 3000, 8);
}

static void test_many_holders(void **state)
{
    (void)state;
    enum { NW = 40 };
    kvr_prefix_index *ix = mk(1000, 0);
    char t[640];
    fill(t, sizeof(t), 40);
    size_t ws[NW], m[NW];
    for (size_t i = 0; i < NW; i++) {
        ws[i] = i;
        kvr_prefix_index_insert(ix, i, t, sizeof(t));
    }
    kvr_prefix_index_stats st;
    kvr_prefix_index_stats_get(ix, &st);
    assert_int_equal(st.blocks, 10);
    assert_int_equal(st.holdings, 10 * NW);
    kvr_prefix_index_match(ix, t, sizeof(t), ws, NW, m);
    for (size_t i = 0; i < NW; i++)
        assert_int_equal(m[i], sizeof(t));
    /* Holders leave in a scattered order; the others keep their match. */
    for (size_t k = 0; k < NW / 2; k++)
        kvr_prefix_index_forget_worker(ix, (k * 7) % NW);
    kvr_prefix_index_match(ix, t, sizeof(t), ws, NW, m);
    size_t left = 0;
    for (size_t i = 0; i < NW; i++) {
        int gone = 0;
        for (size_t k = 0; k < NW / 2; k++)
            gone |= (k * 7) % NW == i;
        assert_int_equal(m[i], gone ? 0 : sizeof(t));
        left += !gone;
    }
    /* Shrinking caps evicts tails holder by holder. */
    for (size_t i = 0; i < NW; i++)
        if (m[i])
            kvr_prefix_index_set_worker_capacity(ix, i, 1 + i % 10);
    kvr_prefix_index_match(ix, t, sizeof(t), ws, NW, m);
    for (size_t i = 0; i < NW; i++)
        if (m[i])
            assert_int_equal(m[i], 64 * (1 + i % 10));
    kvr_prefix_index_stats_get(ix, &st);
    assert_int_equal(st.blocks, 10);
    kvr_prefix_index_destroy(ix);
}

static void test_growth_keeps_lru(void **state)
{
    (void)state;
    /* Enough blocks to force several table rebuilds; the LRU order must survive them. */
    kvr_prefix_index *ix = mk(1u << 30, 20000);
    static char buf[64 * 1000];
    for (int r = 0; r < 40; r++) {
        fill(buf, sizeof(buf), 77 + r);
        kvr_prefix_index_insert(ix, 1, buf, sizeof(buf)); /* 1000 blocks each */
    }
    kvr_prefix_index_stats st;
    kvr_prefix_index_stats_get(ix, &st);
    assert_int_equal(st.holdings, 20000);
    assert_true(st.table_slots >= 20000);
    assert_true(st.holdings * 25 <= st.table_slots * 23 + 25); /* load target 92 % */
    /* The 20 most recent texts are held in full, the 20 oldest are gone. */
    for (int r = 0; r < 40; r++) {
        fill(buf, sizeof(buf), 77 + r);
        assert_int_equal(match1(ix, 1, buf, sizeof(buf)), r >= 20 ? sizeof(buf) : 0);
    }
    kvr_prefix_index_destroy(ix);
}

static void test_caps_under_random_traffic(void **state)
{
    (void)state;
    enum { NW = 8, MAXB = 700, WCAP = 250 };
    kvr_rand_seed(11);
    kvr_prefix_index *ix = mk(MAXB, WCAP);
    kvr_prefix_index_set_worker_capacity(ix, 5, 40);
    char buf[4000];
    for (int r = 0; r < 20000; r++) {
        uint64_t x = kvr_rand_u64();
        size_t n;
        if (x % 10 == 0) {           /* now and then a long unique text */
            n = 1000 + x % 3000;
            fill(buf, n, x);
        } else {
            n = make_text(buf, x);
        }
        size_t w = (x >> 32) % NW;
        assert_int_equal(kvr_prefix_index_insert(ix, w, buf, n), 0);
        kvr_prefix_index_stats st;
        kvr_prefix_index_stats_get(ix, &st);
        assert_true(st.blocks <= MAXB);
        assert_true(st.holdings <= NW * WCAP);
        for (size_t i = 0; i < NW; i++)
            assert_true(kvr_prefix_index_worker_blocks(ix, i) <= (i == 5 ? 40 : WCAP));
        if (r == 19999)
            print_message("blocks %zu holdings %zu evictions %llu memory %zu bytes\n",
                          st.blocks, st.holdings, (unsigned long long)st.evictions,
                          st.memory_bytes);
    }
    /* Counters stayed consistent: dropping every worker leaves nothing. */
    for (size_t i = 0; i < NW; i++)
        kvr_prefix_index_forget_worker(ix, i);
    kvr_prefix_index_stats st;
    kvr_prefix_index_stats_get(ix, &st);
    assert_int_equal(st.blocks, 0);
    assert_int_equal(st.holdings, 0);
    kvr_prefix_index_destroy(ix);
}

static void test_ancestors_outlive_tails(void **state)
{
    (void)state;
    kvr_prefix_index *ix = mk(1000, 12);
    char p[256 + 256];
    fill(p, sizeof(p), 5);          /* shared prefix: 4 blocks, then a 4-block tail */
    kvr_prefix_index_insert(ix, 1, p, sizeof(p));
    /* 30 other tails on the same prefix, 4 blocks each: the cap (12) keeps the prefix and the
     * most recent tails; the oldest tails lose their deepest blocks first. */
    for (int i = 0; i < 30; i++) {
        fill(p + 256, 256, 1000 + i);
        kvr_prefix_index_insert(ix, 1, p, sizeof(p));
        assert_true(kvr_prefix_index_worker_blocks(ix, 1) <= 12);
        assert_int_equal(match1(ix, 1, p, 256), 256);           /* prefix always held */
        assert_int_equal(match1(ix, 1, p, sizeof(p)), sizeof(p)); /* newest tail in full */
    }
    /* The tail touched before the newest is partly gone, deepest blocks first: with 12 blocks =
     * 4 prefix + 4 newest tail + 4 more, the previous tail is intact; older ones are gone. */
    fill(p + 256, 256, 1000 + 28);
    assert_int_equal(match1(ix, 1, p, sizeof(p)), sizeof(p));
    fill(p + 256, 256, 1000 + 27);
    assert_int_equal(match1(ix, 1, p, sizeof(p)), 256);
    /* Under pressure a text loses its last block, never its first: a text's root is more
     * recent than its tail, so what remains is still a usable prefix. */
    kvr_prefix_index_destroy(ix);
    ix = mk(1000, 7);
    char x[320], y[192];
    fill(x, sizeof(x), 20);
    kvr_prefix_index_insert(ix, 1, x, sizeof(x)); /* 5 blocks */
    fill(y, sizeof(y), 21);
    kvr_prefix_index_insert(ix, 1, y, sizeof(y)); /* 3 more: one eviction */
    assert_int_equal(match1(ix, 1, x, sizeof(x)), 256);
    assert_int_equal(match1(ix, 1, y, sizeof(y)), 192);
    /* Re-sending a text that is the worker's least recent: its own blocks are kept (not
     * evicted and re-added); exactly one other block makes room for the new one. */
    kvr_prefix_index_destroy(ix);
    ix = mk(1000, 3);
    char k3[192], y1[64];
    fill(k3, sizeof(k3), 30);
    fill(y1, sizeof(y1), 31);
    kvr_prefix_index_insert(ix, 1, k3, 128);
    kvr_prefix_index_insert(ix, 1, y1, 64);
    kvr_prefix_index_insert(ix, 1, k3, 192);
    kvr_prefix_index_stats st;
    kvr_prefix_index_stats_get(ix, &st);
    assert_int_equal(st.evictions, 1);
    assert_int_equal(match1(ix, 1, k3, 192), 192);
    assert_int_equal(match1(ix, 1, y1, 64), 0);
    /* Using a prefix again keeps it alive against newer unrelated text. */
    kvr_prefix_index_destroy(ix);
    ix = mk(1000, 10);
    char a[320], other[320];
    fill(a, sizeof(a), 9);                      /* 5 blocks */
    kvr_prefix_index_insert(ix, 1, a, 320);
    fill(other, sizeof(other), 10);
    kvr_prefix_index_insert(ix, 1, other, 320); /* 10 blocks held: full */
    kvr_prefix_index_insert(ix, 1, a, 128);     /* touch a's first 2 blocks (and ancestors) */
    fill(other, sizeof(other), 11);
    kvr_prefix_index_insert(ix, 1, other, 192); /* 3 new blocks: evicts 3 LRU blocks */
    /* a's last 3 blocks were older than its touched first 2, and the evictions took the
     * deepest ones; the first "other" text lost nothing yet... */
    assert_int_equal(match1(ix, 1, a, 320), 128);
    fill(other, sizeof(other), 10);
    assert_int_equal(match1(ix, 1, other, 320), 320);
    kvr_prefix_index_destroy(ix);
}

static void test_forget_worker_and_capacity(void **state)
{
    (void)state;
    kvr_prefix_index *ix = mk(1000, 0);
    char t[1280];
    fill(t, sizeof(t), 6);
    kvr_prefix_index_insert(ix, 1, t, sizeof(t));
    kvr_prefix_index_insert(ix, 2, t, sizeof(t));
    kvr_prefix_index_stats st;
    kvr_prefix_index_stats_get(ix, &st);
    assert_int_equal(st.blocks, 20);
    assert_int_equal(st.holdings, 40);
    assert_int_equal(kvr_prefix_index_forget_worker(ix, 1), 20);
    assert_int_equal(match1(ix, 1, t, sizeof(t)), 0);
    assert_int_equal(match1(ix, 2, t, sizeof(t)), sizeof(t));
    kvr_prefix_index_stats_get(ix, &st);
    assert_int_equal(st.blocks, 20);                /* still held by worker 2 */
    assert_int_equal(st.holdings, 20);
    assert_int_equal(st.forgotten, 20);
    assert_int_equal(st.evictions, 0);
    assert_int_equal(kvr_prefix_index_forget_worker(ix, 1), 0);
    /* Lowering a cap evicts at once, least recent first (the tail of the text). */
    assert_int_equal(kvr_prefix_index_set_worker_capacity(ix, 2, 5), 0);
    assert_int_equal(kvr_prefix_index_worker_blocks(ix, 2), 5);
    assert_int_equal(kvr_prefix_index_worker_capacity(ix, 2), 5);
    assert_int_equal(match1(ix, 2, t, sizeof(t)), 5 * 64);
    /* The cap never exceeds the global one; 0 restores the default. */
    kvr_prefix_index_set_worker_capacity(ix, 2, 5000);
    assert_int_equal(kvr_prefix_index_worker_capacity(ix, 2), 1000);
    kvr_prefix_index_set_worker_capacity(ix, 2, 0);
    assert_int_equal(kvr_prefix_index_worker_capacity(ix, 2), 1000);
    /* A text longer than the cap keeps its first blocks. */
    kvr_prefix_index_set_worker_capacity(ix, 3, 4);
    kvr_prefix_index_insert(ix, 3, t, sizeof(t));
    assert_int_equal(match1(ix, 3, t, sizeof(t)), 4 * 64);
    assert_int_equal(kvr_prefix_index_forget_worker(ix, 2), 5);
    assert_int_equal(kvr_prefix_index_forget_worker(ix, 3), 4);
    kvr_prefix_index_stats_get(ix, &st);
    assert_int_equal(st.blocks, 0);
    /* Out-of-range worker ids are refused, not crashed on. */
    assert_int_equal(kvr_prefix_index_insert(ix, KVR_PREFIX_INDEX_MAX_WORKER_ID, t, 10), -1);
    kvr_prefix_index_destroy(ix);
}

static void test_global_cap_shared(void **state)
{
    (void)state;
    /* The global cap counts distinct keys: the same text on 3 workers is 10 blocks, not 30. */
    kvr_prefix_index *ix = mk(10, 0);
    char t[640], u[640];
    fill(t, sizeof(t), 8);
    for (size_t w = 0; w < 3; w++)
        kvr_prefix_index_insert(ix, w, t, sizeof(t));
    kvr_prefix_index_stats st;
    kvr_prefix_index_stats_get(ix, &st);
    assert_int_equal(st.blocks, 10);
    assert_int_equal(st.evictions, 0);
    /* A new text needs room: the biggest holders give up their least recent blocks. */
    fill(u, sizeof(u), 9);
    kvr_prefix_index_insert(ix, 0, u, 320);
    kvr_prefix_index_stats_get(ix, &st);
    assert_true(st.blocks <= 10);
    assert_int_equal(match1(ix, 0, u, 320), 320);
    kvr_prefix_index_destroy(ix);
}

/* ---- use stamps and corrections ------------------------------------------------------- */

/* The stamp a snapshot gives block `b`, or 0 past it (tests never see stamp 0 for a held
 * block: the clock is 1 after the first insert). */
static uint32_t use_at(const kvr_prefix_use *u, size_t b)
{
    for (uint32_t r = 0; r < u->runs; r++)
        if (b < u->end[r])
            return u->stamp[r];
    return 0;
}

/* The snapshot the pick takes: match then match_use for one worker. */
static size_t snap(kvr_prefix_index *ix, size_t w, const char *t, size_t n, kvr_prefix_use *u)
{
    size_t m = 0;
    kvr_prefix_index_match(ix, t, n, &w, 1, &m);
    kvr_prefix_index_match_use(ix, w, m, u);
    return m;
}

/* Reference model with stamps: per worker, keys most recent first with the insert call that
 * last touched each, a base cap and a learned one. */
typedef struct smodel {
    uint64_t *keys, *st;
    size_t n, cap, base;
} smodel;

static void smodel_insert(smodel *w, const uint64_t *k, size_t nk, uint64_t clock)
{
    size_t m = nk < w->cap ? nk : w->cap;
    for (size_t i = m; i-- > 0;) {
        size_t j;
        for (j = 0; j < w->n; j++)
            if (w->keys[j] == k[i])
                break;
        if (j == w->n)
            w->n++;
        memmove(w->keys + 1, w->keys, j * sizeof(uint64_t));
        memmove(w->st + 1, w->st, j * sizeof(uint64_t));
        w->keys[0] = k[i];
        w->st[0] = clock;
    }
    if (w->n > w->cap)
        w->n = w->cap;
}

static size_t smodel_find(const smodel *w, uint64_t key)
{
    size_t j = 0;
    while (j < w->n && w->keys[j] != key)
        j++;
    return j;
}

static void smodel_drop(smodel *w, size_t j)
{
    memmove(w->keys + j, w->keys + j + 1, (w->n - j - 1) * sizeof(uint64_t));
    memmove(w->st + j, w->st + j + 1, (w->n - j - 1) * sizeof(uint64_t));
    w->n--;
}

/* model_insert_new with stamps: the placed blocks take the stamp of the held run's last. */
static void smodel_insert_new(smodel *w, const uint64_t *k, size_t nk, uint64_t clock)
{
    size_t m = nk < w->cap ? nk : w->cap, h = 0;
    while (h < m && smodel_find(w, k[h]) < w->n)
        h++;
    if (h == m)
        return;
    int plain = !h;
    while (!plain && w->n + (m - h) > w->cap) {
        size_t i = 0;
        while (i < m && k[i] != w->keys[w->n - 1])
            i++;
        if (i < m)
            plain = 1;
        else
            w->n--;
    }
    if (plain) {
        smodel_insert(w, k, nk, clock);
        return;
    }
    for (size_t i = h; i < m; i++)
        if (smodel_find(w, k[i]) < w->n)
            smodel_drop(w, smodel_find(w, k[i]));
    size_t p = smodel_find(w, k[h - 1]);
    uint64_t st = w->st[p++];
    memmove(w->keys + p + (m - h), w->keys + p, (w->n - p) * sizeof(uint64_t));
    memmove(w->st + p + (m - h), w->st + p, (w->n - p) * sizeof(uint64_t));
    for (size_t i = h; i < m; i++) {
        w->keys[p + i - h] = k[i];
        w->st[p + i - h] = st;
    }
    w->n += m - h;
}

static int smodel_stamp(const smodel *w, uint64_t key, uint64_t *st)
{
    for (size_t j = 0; j < w->n; j++)
        if (w->keys[j] == key) {
            *st = w->st[j];
            return 1;
        }
    return 0;
}

static void smodel_correct(smodel *w, uint64_t threshold, size_t keep, size_t *dropped)
{
    *dropped = 0;
    while (w->n && w->st[w->n - 1] <= threshold) {
        w->n--;
        ++*dropped;
    }
    size_t floor = w->n > keep ? w->n : keep;
    if (!floor)
        floor = 1;
    if (floor < w->cap)
        w->cap = floor;
}

/* Random traffic over 4 workers with caps large enough that the shards grow several times and
 * cuckoo walks move entries: snapshots taken at random, corrected many inserts later, give
 * exactly what a brute-force model with stamps gives: the stamps followed their holdings
 * through every move and rebuild. */
/* `repeats`: half the rounds teach the previous round's text to its worker again, as a
 * conversation resent as is does (the index defers those stamps: they must read the same). */
static void corrections_vs_model(int repeats)
{
    enum { NW = 4, CAP = 6000, ROUNDS = 9000, PENDING = 16 };
    kvr_rand_seed(21);
    kvr_prefix_index *ix = mk(1u << 30, CAP);
    kvr_prefix_index_stats st0;
    kvr_prefix_index_stats_get(ix, &st0);
    smodel mw[NW];
    for (size_t i = 0; i < NW; i++)
        mw[i] = (smodel){calloc(CAP + 200, 8), calloc(CAP + 200, 8), 0, CAP, CAP};
    struct {
        int live;
        size_t w, m;
        kvr_prefix_use u;
        uint64_t st[64]; /* the model's stamps of the matched blocks at the snapshot */
        int due;
        unsigned forgets;
    } pend[PENDING];
    memset(pend, 0, sizeof(pend));
    unsigned forgets[NW] = {0};
    char buf[4000];
    uint64_t keys[80];
    uint64_t clock = 0;
    size_t corrections = 0, dropped_total = 0, multi_run = 0;
    uint64_t last_x = 1;
    for (int r = 0; r < ROUNDS; r++) {
        uint64_t x = kvr_rand_u64();
        if (repeats && (x & 1))
            x = last_x;
        last_x = x;
        size_t n = make_text(buf, x);
        if (x % 7 == 0) { /* longer unique tails, so the worker lists fill up */
            fill(buf + n, 1500, x);
            n += 1500;
        }
        size_t nk = kvr_prefix_index_block_keys(B, buf, n, keys, 80);
        size_t w = (x >> 40) % NW;
        if (x % 3 == 1) { /* a prompt's teach when its answer starts: new blocks only */
            assert_int_equal(kvr_prefix_index_insert_new(ix, w, buf, n, NULL), 0);
            smodel_insert_new(&mw[w], keys, nk, ++clock);
        } else {
            assert_int_equal(kvr_prefix_index_insert(ix, w, buf, n), 0);
            smodel_insert(&mw[w], keys, nk, ++clock);
        }
        assert_int_equal(kvr_prefix_index_worker_blocks(ix, w), mw[w].n);

        /* A pick: snapshot of a random text on a worker that matches it. */
        if (r % 5 == 0) {
            size_t slot = kvr_rand_below(PENDING);
            if (!pend[slot].live) {
                n = make_text(buf, kvr_rand_u64());
                nk = kvr_prefix_index_block_keys(B, buf, n, keys, 80);
                size_t pw = kvr_rand_below(NW);
                size_t m = snap(ix, pw, buf, n, &pend[slot].u);
                size_t mb = (m + B - 1) / B;
                if (mb) {
                    assert_true(pend[slot].u.runs > 0);
                    multi_run += pend[slot].u.runs > 1;
                    for (size_t b = 0; b < mb; b++) {
                        assert_true(smodel_stamp(&mw[pw], keys[b], &pend[slot].st[b]));
                        uint32_t got = use_at(&pend[slot].u, b);
                        if (pend[slot].u.runs < KVR_PREFIX_USE_RUNS)
                            assert_int_equal(got, pend[slot].st[b]);
                        else
                            assert_true(got <= pend[slot].st[b]); /* never later */
                    }
                    pend[slot].live = 1;
                    pend[slot].w = pw;
                    pend[slot].m = mb;
                    pend[slot].forgets = forgets[pw];
                    /* the first third only takes snapshots: they wait through growth */
                    pend[slot].due = (r < ROUNDS / 3 ? ROUNDS / 3 : r + 1) +
                                     (int)kvr_rand_below(400);
                }
            }
        }
        /* The answers come back later: corrections, with more traffic in between. */
        for (size_t i = 0; i < PENDING; i++) {
            if (!pend[i].live || pend[i].due != r)
                continue;
            pend[i].live = 0;
            size_t pw = pend[i].w, b = kvr_rand_below(pend[i].m);
            size_t keep = kvr_rand_below(40);
            long got = kvr_prefix_index_correct(ix, pw, &pend[i].u, b, keep);
            if (forgets[pw] != pend[i].forgets) {
                assert_int_equal(got, -1); /* forgotten since the snapshot: void */
                continue;
            }
            assert_true(got >= 0);
            size_t want;
            smodel_correct(&mw[pw], use_at(&pend[i].u, b), keep, &want);
            assert_int_equal((size_t)got, want);
            assert_int_equal(kvr_prefix_index_worker_blocks(ix, pw), mw[pw].n);
            assert_int_equal(kvr_prefix_index_worker_capacity(ix, pw), mw[pw].cap);
            corrections++;
            dropped_total += want;
        }
        /* Now and then a worker holds more than predicted: its lowered cap comes back. */
        if (r % 37 == 36) {
            size_t pw = kvr_rand_below(NW), more = kvr_rand_below(3000);
            kvr_prefix_index_raise_capacity(ix, pw, more);
            smodel *m = &mw[pw];
            m->cap = m->cap >= m->base || more >= m->base - m->cap ? m->base : m->cap + more;
            assert_int_equal(kvr_prefix_index_worker_capacity(ix, pw), m->cap);
        }
        if (r % 1499 == 1498) {
            size_t gone = kvr_rand_below(NW);
            assert_int_equal(kvr_prefix_index_forget_worker(ix, gone), mw[gone].n);
            mw[gone].n = 0;
            mw[gone].cap = mw[gone].base;
            forgets[gone]++;
        }
        /* Matching agrees with the model throughout. */
        n = make_text(buf, kvr_rand_u64());
        nk = kvr_prefix_index_block_keys(B, buf, n, keys, 80);
        for (size_t i = 0; i < NW; i++) {
            uint64_t sx;
            size_t k = 0;
            while (k < nk && smodel_stamp(&mw[i], keys[k], &sx))
                k++;
            size_t want = k * B > n ? n : k * B;
            assert_int_equal(match1(ix, i, buf, n), want);
        }
    }
    kvr_prefix_index_stats st;
    kvr_prefix_index_stats_get(ix, &st);
    print_message("corrections %zu dropped %zu multi-run snapshots %zu table slots %zu -> %zu\n",
                  corrections, dropped_total, multi_run, st0.table_slots, st.table_slots);
    assert_true(corrections > 200);
    assert_true(dropped_total > 0);
    assert_true(multi_run > 0);
    assert_true(st.table_slots * 2 > st0.table_slots * 3); /* shards grew meanwhile */
    assert_int_equal(st.corrected, dropped_total);
    for (size_t i = 0; i < NW; i++) {
        free(mw[i].keys);
        free(mw[i].st);
    }
    kvr_prefix_index_destroy(ix);
}

static void test_corrections_match_model(void **state)
{
    (void)state;
    corrections_vs_model(0);
}

static void test_repeated_teaches_match_model(void **state)
{
    (void)state;
    corrections_vs_model(1);
}

static void test_correct_semantics(void **state)
{
    (void)state;
    kvr_prefix_index *ix = mk(100000, 0);
    char p1[640], p2[640], x[640], o[640];
    fill(p1, sizeof(p1), 101);
    fill(p2, sizeof(p2), 102);
    /* P2 then P1 taught to worker 1; P1 routed there again (snapshot); its answer starts and
     * teaches P1 again; the worker says it had nothing: P2, used before P1, is gone, and P1,
     * just recomputed, stays. */
    kvr_prefix_index_insert(ix, 1, p2, sizeof(p2));
    kvr_prefix_index_insert(ix, 1, p1, sizeof(p1));
    kvr_prefix_index_insert(ix, 2, p2, sizeof(p2)); /* other workers are not touched */
    kvr_prefix_use u;
    assert_int_equal(snap(ix, 1, p1, sizeof(p1), &u), sizeof(p1));
    assert_int_equal(u.runs, 1);
    assert_int_equal(u.end[0], 10);
    kvr_prefix_index_insert(ix, 1, p1, sizeof(p1));
    assert_int_equal(kvr_prefix_index_correct(ix, 1, &u, 0, 10), 10);
    assert_int_equal(match1(ix, 1, p2, sizeof(p2)), 0);
    assert_int_equal(match1(ix, 1, p1, sizeof(p1)), sizeof(p1));
    assert_int_equal(match1(ix, 2, p2, sizeof(p2)), sizeof(p2));
    /* Its cap is now what remains (P1's 10 blocks), never below the request's own blocks. */
    assert_int_equal(kvr_prefix_index_worker_capacity(ix, 1), 10);
    kvr_prefix_index_stats st;
    kvr_prefix_index_stats_get(ix, &st);
    assert_int_equal(st.corrected, 10);
    assert_int_equal(st.evictions, 0);
    /* A report of more than predicted lifts the lowered cap, up to the uncorrected one. */
    kvr_prefix_index_raise_capacity(ix, 1, 15);
    assert_int_equal(kvr_prefix_index_worker_capacity(ix, 1), 25);
    kvr_prefix_index_raise_capacity(ix, 1, 1u << 30);
    assert_int_equal(kvr_prefix_index_worker_capacity(ix, 1), 100000);
    kvr_prefix_index_raise_capacity(ix, 1, 5); /* no lowered cap: nothing */
    assert_int_equal(kvr_prefix_index_worker_capacity(ix, 1), 100000);

    /* Runs: X (10 blocks), then its first 4 blocks, then its first 2, each in a later call. */
    kvr_prefix_index_forget_worker(ix, 1);
    fill(x, sizeof(x), 103);
    fill(o, sizeof(o), 104);
    kvr_prefix_index_insert(ix, 1, o, sizeof(o)); /* older than all of X */
    kvr_prefix_index_insert(ix, 1, x, 640);
    kvr_prefix_index_insert(ix, 1, x, 256);
    kvr_prefix_index_insert(ix, 1, x, 128);
    assert_int_equal(snap(ix, 1, x, sizeof(x), &u), sizeof(x));
    assert_int_equal(u.runs, 3);
    assert_int_equal(u.end[0], 2);
    assert_int_equal(u.end[1], 4);
    assert_int_equal(u.end[2], 10);
    assert_true(u.stamp[0] > u.stamp[1] && u.stamp[1] > u.stamp[2]);
    /* The worker had blocks 0..2 but not 3: what it used no later than block 3 goes, i.e.
     * blocks 2..9 of X and all of O; blocks 0..1, used later, stay. */
    assert_int_equal(kvr_prefix_index_correct(ix, 1, &u, 3, 1), 18);
    assert_int_equal(match1(ix, 1, x, sizeof(x)), 128);
    assert_int_equal(match1(ix, 1, o, sizeof(o)), 0);
    assert_int_equal(kvr_prefix_index_worker_capacity(ix, 1), 2);
    /* A block past the snapshot, an empty snapshot, an unknown worker: nothing applies. */
    assert_int_equal(kvr_prefix_index_correct(ix, 1, &u, 10, 1), -1);
    kvr_prefix_use none;
    memset(&none, 0, sizeof(none));
    assert_int_equal(kvr_prefix_index_correct(ix, 1, &none, 0, 1), -1);
    assert_int_equal(kvr_prefix_index_correct(ix, 7, &u, 0, 1), -1);
    /* A snapshot taken before the worker was forgotten is void: its entries since are new. */
    kvr_prefix_index_raise_capacity(ix, 1, 1u << 30);
    kvr_prefix_index_insert(ix, 1, x, sizeof(x));
    assert_int_equal(snap(ix, 1, x, sizeof(x), &u), sizeof(x));
    kvr_prefix_index_forget_worker(ix, 1);
    kvr_prefix_index_insert(ix, 1, o, sizeof(o));
    assert_int_equal(kvr_prefix_index_correct(ix, 1, &u, 0, 1), -1);
    assert_int_equal(match1(ix, 1, o, sizeof(o)), sizeof(o));
    assert_int_equal(kvr_prefix_index_worker_capacity(ix, 1), 100000);
    /* An insert between the match and match_use voids the latter. */
    size_t w = 1, m;
    kvr_prefix_index_match(ix, o, sizeof(o), &w, 1, &m);
    assert_int_equal(m, sizeof(o));
    kvr_prefix_index_insert(ix, 1, x, 64);
    kvr_prefix_index_match_use(ix, 1, m, &u);
    assert_int_equal(u.runs, 0);
    /* A published capacity replaces a learned one. */
    kvr_prefix_index_insert(ix, 1, x, sizeof(x));
    assert_int_equal(snap(ix, 1, o, sizeof(o), &u), sizeof(o));
    assert_true(kvr_prefix_index_correct(ix, 1, &u, 0, 3) >= 10);
    assert_int_equal(kvr_prefix_index_worker_capacity(ix, 1), 10); /* x's blocks remain */
    kvr_prefix_index_set_worker_capacity(ix, 1, 500);
    assert_int_equal(kvr_prefix_index_worker_capacity(ix, 1), 500);
    /* keep_blocks is a floor, and a correction never raises a cap. */
    kvr_prefix_index_insert(ix, 1, o, sizeof(o));
    assert_int_equal(snap(ix, 1, o, sizeof(o), &u), sizeof(o));
    kvr_prefix_index_insert(ix, 1, o, sizeof(o));
    assert_int_equal(kvr_prefix_index_correct(ix, 1, &u, 0, 50), 10); /* x's blocks */
    assert_int_equal(kvr_prefix_index_worker_capacity(ix, 1), 50);
    assert_int_equal(snap(ix, 1, o, sizeof(o), &u), sizeof(o));
    assert_int_equal(kvr_prefix_index_correct(ix, 1, &u, 0, 400), 10);
    assert_int_equal(kvr_prefix_index_worker_capacity(ix, 1), 50);
    kvr_prefix_index_destroy(ix);
}

static void test_snapshot_with_more_runs_than_kept(void **state)
{
    (void)state;
    kvr_prefix_index *ix = mk(100000, 0);
    char x[64 * 20];
    fill(x, sizeof(x), 105);
    /* 20 runs: prefixes of 20, 19, ..., 1 blocks, each taught after the longer one. */
    for (size_t k = 20; k >= 1; k--)
        kvr_prefix_index_insert(ix, 1, x, k * 64);
    kvr_prefix_use u;
    assert_int_equal(snap(ix, 1, x, sizeof(x), &u), sizeof(x));
    assert_int_equal(u.runs, KVR_PREFIX_USE_RUNS);
    for (size_t b = 0; b + 1 < KVR_PREFIX_USE_RUNS; b++)
        assert_int_equal(u.end[b], b + 1);
    assert_int_equal(u.end[KVR_PREFIX_USE_RUNS - 1], 20);
    /* Inside the merged run, the oldest stamp stands for all: only block 19 (the oldest) goes
     * for a miss at block 12, never a block used later than block 12 was. */
    assert_int_equal(kvr_prefix_index_correct(ix, 1, &u, 12, 1), 1);
    assert_int_equal(match1(ix, 1, x, sizeof(x)), 19 * 64);
    /* Before the merged run, exact: a miss at block 3 drops blocks 3.. */
    assert_int_equal(snap(ix, 1, x, sizeof(x), &u), 19 * 64);
    assert_int_equal(kvr_prefix_index_correct(ix, 1, &u, 3, 1), 16);
    assert_int_equal(match1(ix, 1, x, sizeof(x)), 3 * 64);
    kvr_prefix_index_destroy(ix);
}

static void test_stamps_survive_clock_wrap(void **state)
{
    (void)state;
    kvr_prefix_index *ix = mk(100000, 0);
    char a[640], b[640], c[640];
    fill(a, sizeof(a), 106);
    fill(b, sizeof(b), 107);
    fill(c, sizeof(c), 108);
    /* A is left untouched while the clock runs 1.5 times round: in serial order its stamp
     * would then be newer than B's, taught after, and stop the correction at the tail. The age
     * sweeps keep it old. */
    kvr_prefix_index_insert(ix, 1, a, sizeof(a));
    kvr_prefix_index_tick(ix, (3ull << 31) + 12345);
    kvr_prefix_index_insert(ix, 1, b, sizeof(b));
    kvr_prefix_index_tick(ix, 777);
    kvr_prefix_index_insert(ix, 1, c, sizeof(c));
    kvr_prefix_use u;
    assert_int_equal(snap(ix, 1, b, sizeof(b), &u), sizeof(b));
    kvr_prefix_index_tick(ix, 1000);
    assert_int_equal(kvr_prefix_index_correct(ix, 1, &u, 0, 1), 20);
    assert_int_equal(match1(ix, 1, a, sizeof(a)), 0);
    assert_int_equal(match1(ix, 1, b, sizeof(b)), 0);
    assert_int_equal(match1(ix, 1, c, sizeof(c)), sizeof(c));
    kvr_prefix_index_destroy(ix);
}

/* A text that goes on from the last one (a reply after its prompt, the next turn) reuses the
 * keys of the old text's full blocks: its blocks must be exactly a fresh text's. */
static void test_extended_text_keys(void **state)
{
    (void)state;
    static char t[4000];
    fill(t, sizeof(t), 99);
    static const size_t lens[][2] = {{640, 1280}, {650, 1300}, {63, 64}, {64, 65}, {1, 3999},
                                     {1000, 1001}, {2000, 2000}};
    for (size_t i = 0; i < sizeof(lens) / sizeof(*lens); i++) {
        size_t l1 = lens[i][0], l2 = lens[i][1], w = 0, got = 0;
        kvr_prefix_index *ix = mk(1u << 20, 0);
        assert_int_equal(kvr_prefix_index_insert(ix, 0, t, l1), 0);
        kvr_prefix_index_match(ix, t, l2, &w, 1, &got); /* binds the longer text */
        assert_int_equal(got, l1 == l2 ? l1 : l1 / B * B); /* its partial block is not l2's */
        assert_int_equal(kvr_prefix_index_insert(ix, 0, t, l2), 0);
        kvr_prefix_index_match(ix, t, l2, &w, 1, &got);
        assert_int_equal(got, l2);
        kvr_prefix_index_match(ix, t, l1, &w, 1, &got);
        assert_int_equal(got, l1);
        size_t want = (l2 + B - 1) / B + (l1 % B && l1 != l2 ? 1 : 0);
        assert_int_equal(kvr_prefix_index_worker_blocks(ix, 0), want);
        kvr_prefix_index_destroy(ix);
    }
}

/* Requests that keep their block keys (kvr_prefix_index_match_kept / insert_kept) get exactly
 * what the plain calls give, while other requests' texts interleave with theirs (the index's
 * own chain then names another text) and their text grows by a reply; the kept keys are the
 * text's full blocks' keys; an index of another block size ignores them. */
static void kept_same_as_plain(int ids)
{
    enum { CONV = 6, LIVE = 3, MAXT = 6000 };
    static char conv[CONV][MAXT];
    for (size_t c = 0; c < CONV; c++) {
        fill(conv[c], MAXT, 1000 + c);
        memcpy(conv[c], conv[0], 700); /* a shared system prompt */
    }
    kvr_prefix_index *kx = mk(1u << 20, 300), *px = mk(1u << 20, 300);
    kvr_prefix_index_cfg c32 = {.block_bytes = 32, .max_blocks = 1u << 20};
    kvr_prefix_index *k32 = kvr_prefix_index_create(&c32), *p32 = kvr_prefix_index_create(&c32);
    assert_non_null(k32);
    assert_non_null(p32);
    struct live {
        size_t c, len, reply, w, step;
        kvr_prefix_keys kept;
    } r[LIVE] = {0};
    kvr_rand_seed(7);
    size_t lens[CONV] = {0}, workers[3] = {0, 1, 2}, saved = 0;
    for (int it = 0; it < 3000; it++) {
        struct live *q = &r[kvr_rand_below(LIVE)];
        if (q->step == 0) { /* a new request: its conversation's next turn */
            q->c = kvr_rand_below(CONV);
            lens[q->c] += 50 + kvr_rand_below(400);
            if (lens[q->c] + 400 > MAXT)
                lens[q->c] = 60 + kvr_rand_below(600);
            q->len = lens[q->c];
            q->reply = kvr_rand_below(300);
            kvr_prefix_keys_free(&q->kept);
            if (ids && kvr_rand_below(3)) { /* its id, as kvr_route_text_scan_id() gives
                                                 it; some requests come without one (other
                                                 endpoints, no text cache) */
                q->kept.text_id = XXH3_64bits(conv[q->c], q->len) | 1;
                q->kept.text_id_len = q->len;
            }
        }
        const char *t = conv[q->c];
        size_t mk_[3], mp[3], len = q->step == 2 ? q->len + q->reply : q->len;
        if (q->step == 0) {
            kvr_prefix_index_match_kept(kx, t, len, &q->kept, workers, 3, mk_);
            kvr_prefix_index_match(px, t, len, workers, 3, mp);
            assert_memory_equal(mk_, mp, sizeof(mk_));
            kvr_prefix_index_match_kept(k32, t, len, &q->kept, workers, 3, mk_);
            kvr_prefix_index_match(p32, t, len, workers, 3, mp);
            assert_memory_equal(mk_, mp, sizeof(mk_));
            q->w = kvr_rand_below(3);
        } else {
            assert_int_equal(kvr_prefix_index_insert_kept(kx, q->w, t, len, &q->kept), 0);
            assert_int_equal(kvr_prefix_index_insert(px, q->w, t, len), 0);
            assert_int_equal(kvr_prefix_index_insert_kept(k32, q->w, t, len, &q->kept), 0);
            assert_int_equal(kvr_prefix_index_insert(p32, q->w, t, len), 0);
            if (q->step == 2)
                lens[q->c] = len > lens[q->c] ? len : lens[q->c];
        }
        /* the kept keys are this text's own, for one block size: the first index that used
         * them (the 64-byte one, unless it held nothing yet to match against) */
        uint64_t want[MAXT / 32];
        size_t bb = q->kept.block_bytes;
        if (bb) {
            assert_true(q->kept.n <= len / bb);
            kvr_prefix_index_block_keys(bb, t, len, want, MAXT / 32);
            assert_memory_equal(q->kept.key, want, q->kept.n * sizeof(*want));
            saved += bb == B ? q->kept.n : 0;
            /* all of the text's keys from the kept ones: the same as hashing them all */
            uint64_t got[MAXT / 32];
            size_t max = kvr_rand_below(MAXT / 32) + 1;
            assert_int_equal(kvr_prefix_keys_get(&q->kept, bb, t, len, got, max),
                             (len + bb - 1) / bb);
            size_t nk = (len + bb - 1) / bb < max ? (len + bb - 1) / bb : max;
            assert_memory_equal(got, want, nk * sizeof(*want));
        }
        q->step = (q->step + 1) % 3;
    }
    assert_true(saved > 0);
    kvr_prefix_index *both[2][2] = {{kx, px}, {k32, p32}};
    for (int i = 0; i < 2; i++) {
        kvr_prefix_index_stats a, b;
        kvr_prefix_index_stats_get(both[i][0], &a);
        kvr_prefix_index_stats_get(both[i][1], &b);
        assert_int_equal(a.holdings, b.holdings);
        assert_int_equal(a.blocks, b.blocks);
        assert_int_equal(a.evictions, b.evictions);
        assert_true(i == 0 || a.evictions == 0);
        assert_true(i == 1 || a.evictions > 0); /* the per-worker cap was reached */
        kvr_prefix_index_destroy(both[i][0]);
        kvr_prefix_index_destroy(both[i][1]);
    }
    for (size_t i = 0; i < LIVE; i++)
        kvr_prefix_keys_free(&r[i].kept);
}

static void test_kept_keys_same_as_plain(void **state)
{
    (void)state;
    kept_same_as_plain(0);
}

/* The same with the texts' ids (kvr_prefix_keys text_id): the index then compares none of the
 * bytes an id vouches for, and must still give what the plain calls give while other texts
 * rebind its chain, shorten it and extend it. */
static void test_text_ids_same_as_plain(void **state)
{
    (void)state;
    kept_same_as_plain(1);
}

/* A prompt's teach when its answer starts (kvr_prefix_index_insert_new): the blocks past the
 * held run rank right behind it, with its stamp; the run keeps its place. */
static void test_insert_new_places_behind(void **state)
{
    (void)state;
    kvr_prefix_index *ix = mk(1u << 20, 0);
    char p[14 * B], q[5 * B];
    fill(p, sizeof(p), 11);
    fill(q, sizeof(q), 12);
    assert_int_equal(kvr_prefix_index_insert(ix, 0, p, 10 * B), 0); /* the conversation */
    assert_int_equal(kvr_prefix_index_insert(ix, 0, q, sizeof(q)), 0); /* another, later */
    /* The next turn: 3 blocks more. Nothing held moves, so the conversation stays older than
     * q, and its new blocks are the least recent of all. */
    assert_int_equal(kvr_prefix_index_insert_new(ix, 0, p, 13 * B, NULL), 0);
    assert_int_equal(kvr_prefix_index_worker_blocks(ix, 0), 18);
    assert_int_equal(match1(ix, 0, p, 13 * B), 13 * B);
    kvr_prefix_use u, uq;
    assert_int_equal(match1(ix, 0, p, 13 * B), 13 * B);
    kvr_prefix_index_match_use(ix, 0, 13 * B, &u);
    assert_int_equal(u.runs, 1); /* one stamp along the chain: the run's */
    assert_int_equal(u.end[0], 13);
    assert_int_equal(match1(ix, 0, q, sizeof(q)), sizeof(q));
    kvr_prefix_index_match_use(ix, 0, sizeof(q), &uq);
    assert_true((int32_t)(uq.stamp[0] - u.stamp[0]) > 0);
    /* Shrinking the worker evicts the deepest blocks first: the new ones, then the run's
     * tail, never q (more recent) and never leaving a hole. */
    assert_int_equal(kvr_prefix_index_set_worker_capacity(ix, 0, 15), 0);
    assert_int_equal(match1(ix, 0, p, 13 * B), 10 * B);
    assert_int_equal(match1(ix, 0, q, sizeof(q)), sizeof(q));
    assert_int_equal(kvr_prefix_index_set_worker_capacity(ix, 0, 12), 0);
    assert_int_equal(match1(ix, 0, p, 13 * B), 7 * B);
    assert_int_equal(match1(ix, 0, q, sizeof(q)), sizeof(q));
    /* All held: nothing is refreshed. A full insert then makes it the most recent. */
    assert_int_equal(kvr_prefix_index_insert_new(ix, 0, p, 7 * B, NULL), 0);
    assert_int_equal(kvr_prefix_index_set_worker_capacity(ix, 0, 11), 0);
    assert_int_equal(match1(ix, 0, p, 13 * B), 6 * B);
    assert_int_equal(kvr_prefix_index_insert(ix, 0, p, 6 * B), 0);
    assert_int_equal(kvr_prefix_index_set_worker_capacity(ix, 0, 8), 0);
    assert_int_equal(match1(ix, 0, p, 13 * B), 6 * B);
    assert_int_equal(match1(ix, 0, q, sizeof(q)), 2 * B);
    /* Making room for new blocks under the cap takes the least recent holdings outside the
     * text: q's tail here, while the run stays where it was. */
    assert_int_equal(kvr_prefix_index_insert_new(ix, 0, p, 8 * B, NULL), 0);
    assert_int_equal(match1(ix, 0, p, 13 * B), 8 * B);
    assert_int_equal(match1(ix, 0, q, sizeof(q)), 0);
    /* Blocks past the cap are not recorded, as by kvr_prefix_index_insert: all held here. */
    assert_int_equal(kvr_prefix_index_insert_new(ix, 0, p, 12 * B, NULL), 0);
    assert_int_equal(kvr_prefix_index_worker_blocks(ix, 0), 8);
    assert_int_equal(match1(ix, 0, p, 13 * B), 8 * B);
    /* When the least recent holding is the text's own (the run's tail, placed behind it), it
     * is a full insert: the other text goes, the whole text stays, within the cap. */
    assert_int_equal(kvr_prefix_index_set_worker_capacity(ix, 0, 10), 0);
    assert_int_equal(kvr_prefix_index_insert(ix, 0, q, B), 0);
    assert_int_equal(kvr_prefix_index_insert_new(ix, 0, p, 10 * B, NULL), 0);
    assert_int_equal(kvr_prefix_index_worker_blocks(ix, 0), 10);
    assert_int_equal(match1(ix, 0, p, 13 * B), 10 * B);
    assert_int_equal(match1(ix, 0, q, sizeof(q)), 0);
    kvr_prefix_index_destroy(ix);
}

static void test_kv_tokens_conversion(void **state)
{
    (void)state;
    /* 1,000 vLLM blocks of 16 tokens = 16,000 tokens ≈ 64,000 bytes = 1,000 64-byte blocks. */
    assert_int_equal(kvr_prefix_index_blocks_for_kv_tokens(16000, 64), 1000);
    assert_int_equal(kvr_prefix_index_blocks_for_kv_tokens(-1, 64), 0);
    assert_int_equal(kvr_prefix_index_blocks_for_kv_tokens(1, 64), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact_repeat_and_partial),
        cmocka_unit_test(test_anchored_at_start),
        cmocka_unit_test(test_several_workers),
        cmocka_unit_test(test_lru_matches_model),
        cmocka_unit_test(test_many_holders),
        cmocka_unit_test(test_growth_keeps_lru),
        cmocka_unit_test(test_caps_under_random_traffic),
        cmocka_unit_test(test_ancestors_outlive_tails),
        cmocka_unit_test(test_forget_worker_and_capacity),
        cmocka_unit_test(test_global_cap_shared),
        cmocka_unit_test(test_extended_text_keys),
        cmocka_unit_test(test_kept_keys_same_as_plain),
        cmocka_unit_test(test_text_ids_same_as_plain),
        cmocka_unit_test(test_insert_new_places_behind),
        cmocka_unit_test(test_kv_tokens_conversion),
        cmocka_unit_test(test_corrections_match_model),
        cmocka_unit_test(test_repeated_teaches_match_model),
        cmocka_unit_test(test_correct_semantics),
        cmocka_unit_test(test_snapshot_with_more_runs_than_kept),
        cmocka_unit_test(test_stamps_survive_clock_wrap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
