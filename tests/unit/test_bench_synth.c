/* Mooncake block → text: deterministic, one pseudo-token per 4 bytes, and prompts that share
 * leading block ids share exactly those bytes. Header choice and think times: reproducible. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "replay.h"
#include "synth.h"

static void text(uint64_t seed, uint64_t id, size_t n, kvr_buf *b)
{
    kvr_buf_init(b, 0);
    assert_int_equal(kvr_bench_block_text(seed, id, n, b), 0);
}

static void test_block_deterministic(void **state)
{
    (void)state;
    kvr_buf a, b, c, d;
    text(1, 42, 512, &a);
    text(1, 42, 512, &b);
    text(1, 43, 512, &c);
    text(2, 42, 512, &d);
    assert_int_equal(a.len, 512 * KVR_BENCH_PSEUDO_TOKEN_BYTES);
    assert_memory_equal(a.data, b.data, a.len);
    assert_true(memcmp(a.data, c.data, 64) != 0); /* another id: other text from the start */
    assert_true(memcmp(a.data, d.data, 64) != 0); /* another seed: other text */
    /* 512 words of three lowercase letters, each followed by one space. */
    for (size_t i = 0; i < a.len; i += 4) {
        for (int k = 0; k < 3; k++)
            assert_true(a.data[i + k] >= 'a' && a.data[i + k] <= 'z');
        assert_int_equal(a.data[i + 3], ' ');
    }
    /* A cut block is a prefix of the whole block; asking for more than 512 gives 512. */
    kvr_buf e, f;
    text(1, 42, 100, &e);
    text(1, 42, 10000, &f);
    assert_int_equal(e.len, 400);
    assert_memory_equal(e.data, a.data, e.len);
    assert_int_equal(f.len, a.len);
    kvr_buf_free(&a);
    kvr_buf_free(&b);
    kvr_buf_free(&c);
    kvr_buf_free(&d);
    kvr_buf_free(&e);
    kvr_buf_free(&f);
}

static void test_block_words_vary(void **state)
{
    (void)state;
    /* The text must not repeat inside a block, or an engine would find spurious matches. */
    kvr_buf a;
    text(7, 0, 512, &a);
    size_t same = 0;
    for (size_t i = 4; i < a.len; i += 4)
        same += memcmp(a.data + i, a.data + i - 4, 4) == 0;
    assert_true(same < 5);
    kvr_buf_free(&a);
}

static void test_prompt_prefix_structure(void **state)
{
    (void)state;
    const uint64_t r1[] = {0, 1, 2, 3}, r2[] = {0, 1, 9};
    kvr_buf p1, p2, blk;
    kvr_buf_init(&p1, 0);
    kvr_buf_init(&p2, 0);
    /* 1,700 tokens: three whole blocks and 164 tokens of the fourth. */
    assert_int_equal(kvr_bench_mooncake_prompt(5, r1, 4, 1700, &p1), 0);
    assert_int_equal(kvr_bench_mooncake_prompt(5, r2, 3, 1536, &p2), 0);
    assert_int_equal(p1.len, 1700 * 4);
    assert_int_equal(p2.len, 1536 * 4);
    /* Shared leading ids 0, 1 → exactly 1,024 shared tokens, then the texts part. */
    assert_memory_equal(p1.data, p2.data, 1024 * 4);
    assert_true(memcmp(p1.data + 4096, p2.data + 4096, 4) != 0);
    /* Block i of a prompt is block i's own text. */
    text(5, 3, 164, &blk);
    assert_memory_equal(p1.data + 3 * 2048, blk.data, blk.len);
    kvr_buf_free(&blk);
    /* Rebuilding gives the same bytes. */
    kvr_buf again;
    kvr_buf_init(&again, 0);
    assert_int_equal(kvr_bench_mooncake_prompt(5, r1, 4, 1700, &again), 0);
    assert_memory_equal(again.data, p1.data, p1.len);
    /* A row shorter than its input length never invents blocks. */
    kvr_buf_reset(&again);
    assert_int_equal(kvr_bench_mooncake_prompt(5, r2, 1, 1536, &again), 0);
    assert_int_equal(again.len, 512 * 4);
    kvr_buf_free(&again);
    kvr_buf_free(&p1);
    kvr_buf_free(&p2);
}

static void test_buffer_cap(void **state)
{
    (void)state;
    kvr_buf b;
    kvr_buf_init(&b, 1000);
    assert_int_equal(kvr_bench_block_text(1, 1, 512, &b), -1);
    kvr_buf_free(&b);
}

static void test_random_text_unique(void **state)
{
    (void)state;
    kvr_buf a, b;
    kvr_buf_init(&a, 0);
    kvr_buf_init(&b, 0);
    kvr_bench_random_text(1, 0, 300, &a);
    kvr_bench_random_text(1, 1, 300, &b);
    assert_int_equal(a.len, 1200);
    assert_true(memcmp(a.data, b.data, 8) != 0);
    kvr_buf c;
    text(1, 0, 300, &c); /* never the Mooncake text of the same number */
    assert_true(memcmp(a.data, c.data, 8) != 0);
    kvr_buf_free(&a);
    kvr_buf_free(&b);
    kvr_buf_free(&c);
}

static void test_header_sessions(void **state)
{
    (void)state;
    bool a[140], b[140], c[140];
    assert_int_equal(kvr_bench_pick_header_sessions(140, 0.5, 1, a), 0);
    assert_int_equal(kvr_bench_pick_header_sessions(140, 0.5, 1, b), 0);
    assert_int_equal(kvr_bench_pick_header_sessions(140, 0.5, 2, c), 0);
    size_t na = 0, diff = 0;
    for (size_t i = 0; i < 140; i++) {
        na += a[i];
        assert_int_equal(a[i], b[i]);
        diff += a[i] != c[i];
    }
    assert_int_equal(na, 70); /* exactly the share */
    assert_true(diff > 20);   /* another seed, another choice */
    /* Not just the first half. */
    size_t first = 0;
    for (size_t i = 0; i < 70; i++)
        first += a[i];
    assert_true(first > 20 && first < 50);
    assert_int_equal(kvr_bench_pick_header_sessions(16, 0.25, 9, a), 0);
    na = 0;
    for (size_t i = 0; i < 16; i++)
        na += a[i];
    assert_int_equal(na, 4);
    assert_int_equal(kvr_bench_pick_header_sessions(3, 0, 9, a), 0);
    assert_false(a[0] || a[1] || a[2]);
    assert_int_equal(kvr_bench_pick_header_sessions(3, 1, 9, a), 0);
    assert_true(a[0] && a[1] && a[2]);
}

static void test_think_time(void **state)
{
    (void)state;
    assert_float_equal(kvr_bench_think_ms(1, 2, 3, 0), 0, 0);
    assert_float_equal(kvr_bench_think_ms(1, 2, 3, 500), kvr_bench_think_ms(1, 2, 3, 500), 0);
    double sum = 0;
    for (size_t s = 0; s < 200; s++)
        for (size_t t = 0; t < 100; t++) {
            double v = kvr_bench_think_ms(4, s, t, 1000);
            assert_true(v >= 0);
            sum += v;
        }
    assert_float_equal(sum / 20000, 1000, 50); /* exponential with mean 1000 ms */
}

/* --spread random: every URL gets about as many requests, the same ones for the same seed, and
 * a turn's URL does not follow its session's (a load balancer spreads per request). */
static void test_spread_pick(void **state)
{
    (void)state;
    enum { N = 30000, U = 3 };
    size_t per[U] = {0}, same_as_turn0 = 0;
    for (size_t i = 0; i < N; i++) {
        size_t u = kvr_bench_spread_pick(7, i / 10, i % 10, U);
        assert_true(u < U);
        assert_int_equal(u, kvr_bench_spread_pick(7, i / 10, i % 10, U));
        per[u]++;
        same_as_turn0 += u == kvr_bench_spread_pick(7, i / 10, 0, U);
    }
    for (int u = 0; u < U; u++)
        assert_true(per[u] > N / U * 0.95 && per[u] < N / U * 1.05);
    assert_true(same_as_turn0 < N / 2);
    for (size_t i = 0; i < 100; i++)
        assert_int_equal(kvr_bench_spread_pick(1, i, 0, 1), 0);
}

/* --bypass-share: the share of requests bypassed is close to the share asked, each of the
 * workers gets about as many, and the choice is a pure function of (seed, session, turn). */
static void test_bypass_pick(void **state)
{
    (void)state;
    enum { N = 20000, W = 4 };
    size_t per[W] = {0}, bypassed = 0;
    for (size_t i = 0; i < N; i++) {
        int w = kvr_bench_bypass_pick(1, i / 10, i % 10, 0.3, W);
        assert_true(w >= -1 && w < W);
        assert_int_equal(w, kvr_bench_bypass_pick(1, i / 10, i % 10, 0.3, W));
        if (w >= 0) {
            bypassed++;
            per[w]++;
        }
    }
    assert_true(bypassed > N * 0.28 && bypassed < N * 0.32);
    for (int w = 0; w < W; w++)
        assert_true(per[w] > bypassed / W * 0.9 && per[w] < bypassed / W * 1.1);
    /* Share 0 (or no workers) never bypasses; share 1 always does. */
    size_t differ = 0;
    for (size_t i = 0; i < 1000; i++) {
        assert_int_equal(kvr_bench_bypass_pick(1, i, 0, 0, W), -1);
        assert_int_equal(kvr_bench_bypass_pick(1, i, 0, 1, 0), -1);
        int w = kvr_bench_bypass_pick(1, i, 0, 1, W);
        assert_true(w >= 0 && w < W);
        assert_int_equal(kvr_bench_bypass_pick(1, i, 0, 1, 1), 0);
        /* Another seed, another choice. */
        differ += w != kvr_bench_bypass_pick(2, i, 0, 1, W);
    }
    assert_true(differ > 500);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_block_deterministic),
        cmocka_unit_test(test_block_words_vary),
        cmocka_unit_test(test_prompt_prefix_structure),
        cmocka_unit_test(test_buffer_cap),
        cmocka_unit_test(test_random_text_unique),
        cmocka_unit_test(test_header_sessions),
        cmocka_unit_test(test_think_time),
        cmocka_unit_test(test_bypass_pick),
        cmocka_unit_test(test_spread_pick),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
