/* kvroute-sim detokenizing: the bounded map of pieces seen while tokenizing (LRU per set,
 * latest piece wins an id), generated and special tokens without a map, and the UTF-8 repair
 * of pieces cut inside a character. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "tokenizer.h"

/* Tokenizes `text` into a fresh vector that records into `m`. */
static kvr_sim_toks toks_of(kvr_sim_pieces *m, const char *text)
{
    kvr_sim_toks t;
    kvr_sim_toks_init(&t, 0);
    t.seen = m;
    kvr_sim_tokenize(&t, text, strlen(text));
    return t;
}

/* The detokenized text of `n` ids, NUL-terminated in `out` (cap bytes). */
static const char *detok(const kvr_sim_pieces *m, const uint32_t *ids, size_t n, char *out,
                         size_t cap)
{
    kvr_buf b;
    kvr_buf_init(&b, 0);
    assert_int_equal(kvr_sim_detokenize(m, ids, n, &b), 0);
    assert_true(b.len < cap);
    memcpy(out, b.data ? b.data : "", b.len + 1);
    kvr_buf_free(&b);
    return out;
}

static void test_prompt_round_trip(void **state)
{
    (void)state;
    kvr_sim_pieces *m = kvr_sim_pieces_new(1024);
    const char *text = "The quick brown fox, 12345 times;\n\n  indented\ttabs and ünïcödé!";
    kvr_sim_toks t = toks_of(m, text);
    char out[256];
    assert_string_equal(detok(m, t.ids, t.len, out, sizeof(out)), text);
    assert_int_equal(kvr_sim_pieces_count(m), t.len); /* every piece differs here */
    /* without the map: placeholders (" quick"; "The" is a generated piece, always known) */
    char want[32];
    snprintf(want, sizeof(want), "The<|%u|>", t.ids[1]);
    assert_string_equal(detok(NULL, t.ids, 2, out, sizeof(out)), want);
    kvr_sim_toks_free(&t);
    assert_ptr_equal(t.seen, m); /* kept for reuse */
    kvr_sim_pieces_free(m);
    assert_null(kvr_sim_pieces_new(0));
}

static void test_generated_and_special_tokens_need_no_map(void **state)
{
    (void)state;
    /* every generated piece (64 capitalised words, 64 " word", ".") has its own id */
    uint32_t ids[200];
    const char *texts[200];
    size_t n = 0;
    for (uint64_t seed = 0; seed < 5000 && n < 129; seed++)
        for (size_t i = 0; i < 12; i++) {
            const char *p;
            size_t len;
            uint32_t id = kvr_sim_gen_token(seed, i, &p, &len);
            size_t k = 0;
            while (k < n && texts[k] != p)
                k++;
            if (k < n)
                continue;
            for (k = 0; k < n; k++)
                assert_int_not_equal(ids[k], id);
            char out[16];
            assert_string_equal(detok(NULL, &id, 1, out, sizeof(out)), p);
            ids[n] = id;
            texts[n++] = p;
        }
    assert_int_equal(n, 129);
    const uint32_t sp[] = {128000, 128002, 128004, 128005, 128009, 128011, 128255};
    char out[512];
    assert_string_equal(detok(NULL, sp, 7, out, sizeof(out)),
                        "<|begin_of_text|><|reserved_special_token_0|><|finetune_right_pad_id|>"
                        "<|reserved_special_token_2|><|eot_id|><|reserved_special_token_3|>"
                        "<|reserved_special_token_247|>");
}

static void test_lru_per_set_and_latest_piece_wins(void **state)
{
    (void)state;
    kvr_sim_pieces *m = kvr_sim_pieces_new(4); /* one set of 4 ways: every id shares it */
    const char *w[6] = {"alpha", "bravo", "charlie", "delta", "echo", "foxtrot"};
    uint32_t id[6];
    for (int i = 0; i < 6; i++) {
        kvr_sim_toks t = toks_of(NULL, w[i]);
        assert_int_equal(t.len, 1);
        id[i] = t.ids[0];
        kvr_sim_toks_free(&t);
    }
    for (int i = 0; i < 4; i++) {
        kvr_sim_toks t = toks_of(m, w[i]);
        kvr_sim_toks_free(&t);
    }
    kvr_sim_toks t = toks_of(m, "alpha echo"); /* refreshes alpha, then drops bravo */
    kvr_sim_toks_free(&t);
    char out[64], want[32];
    assert_string_equal(detok(m, &id[0], 1, out, sizeof(out)), "alpha");
    snprintf(want, sizeof(want), "<|%u|>", id[1]);
    assert_string_equal(detok(m, &id[1], 1, out, sizeof(out)), want);
    assert_string_equal(detok(m, &id[2], 1, out, sizeof(out)), "charlie");
    assert_int_equal(kvr_sim_pieces_count(m), 4);
    kvr_sim_pieces_free(m);
    /* 1..3 entries still make one set of 4 */
    m = kvr_sim_pieces_new(1);
    t = toks_of(m, w[5]);
    kvr_sim_toks_free(&t);
    assert_string_equal(detok(m, &id[5], 1, out, sizeof(out)), "foxtrot");
    kvr_sim_pieces_free(m);
}

static void test_utf8_repair(void **state)
{
    (void)state;
    kvr_sim_pieces *m = kvr_sim_pieces_new(64);
    char out[128];
    kvr_sim_toks t = toks_of(m, "ééééé"); /* 10 bytes: pieces of 7 and 3, cut inside é */
    assert_int_equal(t.len, 2);
    assert_string_equal(detok(m, t.ids, 2, out, sizeof(out)), "ééééé");
    assert_string_equal(detok(m, t.ids, 1, out, sizeof(out)), "ééé\xef\xbf\xbd");
    assert_string_equal(detok(m, t.ids + 1, 1, out, sizeof(out)), "\xef\xbf\xbd" "é");
    kvr_sim_toks_free(&t);
    /* as Python's decode(errors="replace"): one U+FFFD per maximal invalid subpart */
    static const struct {
        const char *in, *out;
    } cases[] = {
        {"\xff\xfe" "ab", "\xef\xbf\xbd\xef\xbf\xbd" "ab"},
        {"\xc0\x80", "\xef\xbf\xbd\xef\xbf\xbd"},                     /* overlong */
        {"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},     /* surrogate */
        {"x\xe2\x82", "x\xef\xbf\xbd"},                               /* truncated */
        {"\xf0\x9f\x98\x80", "\xf0\x9f\x98\x80"},                     /* valid 4-byte */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
        t = toks_of(m, cases[i].in);
        assert_string_equal(detok(m, t.ids, t.len, out, sizeof(out)), cases[i].out);
        kvr_sim_toks_free(&t);
    }
    kvr_sim_pieces_free(m);
}

static void test_output_cap(void **state)
{
    (void)state;
    kvr_buf b;
    kvr_buf_init(&b, 20);
    const uint32_t ids[] = {128000, 128000};
    assert_int_equal(kvr_sim_detokenize(NULL, ids, 1, &b), 0);
    assert_int_equal(kvr_sim_detokenize(NULL, ids, 2, &b), -1);
    assert_int_equal(b.len, strlen("<|begin_of_text|>"));
    kvr_buf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prompt_round_trip),
        cmocka_unit_test(test_generated_and_special_tokens_need_no_map),
        cmocka_unit_test(test_lru_per_set_and_latest_piece_wins),
        cmocka_unit_test(test_utf8_repair),
        cmocka_unit_test(test_output_cap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
