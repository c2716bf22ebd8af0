/* The validating scanner (util/json_scan.h) and the request fields read with it
 * (routing/fields.h): same acceptance as kvr_json_read on hand-written edge cases (numbers at
 * the int64 and double overflow boundaries, escapes, UTF-8, depth) and a seeded mutation
 * fuzz; located members, their spans and array summaries; string decoding; member lookup;
 * session keys and validation against the tree-based functions. */
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/validate.h"
#include "routing/fields.h"
#include "util/json_read.h"
#include "util/json_scan.h"

static size_t checked, accepted;

/* Scanner and reader agree on acceptance (and on the top level). */
static void same(const char *buf, size_t len)
{
    json_t *t = kvr_json_read(buf, len, NULL);
    int rc = kvr_json_scan(buf, len, NULL, 0, NULL);
    int want = !t ? -1 : json_is_object(t) ? KVR_JSON_OBJECT : KVR_JSON_ARRAY;
    if (rc != want) {
        print_message("mismatch on %zu bytes: reader %d, scanner %d: %.*s\n", len, want, rc,
                      (int)(len > 300 ? 300 : len), buf);
        fail();
    }
    checked++;
    accepted += t != NULL;
    json_decref(t);
}

static void same_z(const char *s)
{
    same(s, strlen(s));
}

static void test_edge_cases(void **state)
{
    (void)state;
    static const char *cases[] = {
        "{}", "[]", " \t\r\n{ } \n", "", " ", "1", "\"x\"", "true", "null", "{", "[", "}",
        "{\"a\":1,}", "[1,]", "[,1]", "{\"a\" 1}", "{a:1}", "{\"a\":1 \"b\":2}", "[1 2]",
        "{\"a\":1,\"a\":2}", "[true,false,null]", "[tru]", "[truex]", "[nul]", "[True]",
        "[0]", "[-0]", "[01]", "[-01]", "[1.]", "[.5]", "[+1]", "[-]", "[1e]", "[1e+]",
        "[1E-2]", "[1.5e3]", "[-1.25]", "[0.0]", "[1e400]", "[-1e400]", "[1e-400]",
        "[9223372036854775807]", "[9223372036854775808]", "[-9223372036854775808]",
        "[-9223372036854775809]", "[123456789012345678901234567890]", "[00]", "[-0.0e-0]",
        "[999999999999999999]", "[-999999999999999999]", "[1000000000000000000]",
        "[-1000000000000000000]", "{\"max_tokens\":18446744073709551615}",
        "[\"\\u0041\\u00e9\\u20ac\\ud83d\\ude00\"]", "[\"\\ud83d\"]", "[\"\\ude00\"]",
        "[\"\\ud83d\\u0041\"]", "[\"\\u0000\"]", "[\"\\u00\"]", "[\"\\uZZZZ\"]", "[\"\\x\"]",
        "[\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"]", "[\"a\tb\"]", "[\"a\nb\"]", "[\"abc]", "[\"abc\\",
        "[\"\xc3\xa9\"]", "[\"\xc3\"]", "[\"\xc0\x80\"]", "[\"\xed\xa0\x80\"]",
        "[\"\xf4\x90\x80\x80\"]", "[\"\xf0\x9f\x98\x80\"]", "[\"\xe2\x82\"]", "[\"\x80\"]",
        "[\"\xff\"]", "[\"\x7f\"]", "{\"\\u00e9\":1}", "{\"k\\\"q\":[{}]}", "[] []", "[]x",
        "{\"a\":[1,{\"b\":[2,[3,{\"c\":\"d\"}]]}]}", "[1,\"two\",3.0,[],{}]", "\xef\xbb\xbf{}",
        "[\"0123456789abcdef0123456789abcdef\\n0123456789abcdef\"]",
        "[\"long string without escapes that spans several 16-byte vectors ........\"]",
        "[\"ends with escape at word edge\\u0041\"]", "[\"0123456789abcde\\\"\"]",
        "[\"0123456789abcdef0123456789abcd\x01\"]", "[\"0123456789abcdef\xc3\xa9\"]",
        "{\"\xc3\xa9\x80\":1}", "{\"a\":{\"b\":{\"c\":[[[]]]}}}", "[1e308]", "[1.7976931348623157e308]",
        "[1.7976931348623158e308]", "[1.7976931348623159e308]", "[17976931348623157e292]",
        "[179769313486231580793728971405303415079934132710037826936173778980444968292764750946"
        "649017977587207096330286416692887910946555547851940402630657488671505820681908902000"
        "708383676273854845817711531764475730270069855571366959622842914819860834936475292719"
        "074168444365510704342711559699508093042880177904174497791]",
        "[179769313486231580793728971405303415079934132710037826936173778980444968292764750946"
        "649017977587207096330286416692887910946555547851940402630657488671505820681908902000"
        "708383676273854845817711531764475730270069855571366959622842914819860834936475292719"
        "074168444365510704342711559699508093042880177904174497792.0]",
        "[0.000179769313486231580793728971405303415079934132710037826936173778980444968292764750946"
        "649017977587207096330286416692887910946555547851940402630657488671505820681908902000"
        "708383676273854845817711531764475730270069855571366959622842914819860834936475292719"
        "074168444365510704342711559699508093042880177904174497791e312]",
        "[0.0001797693134862315807937289714053034150799341327100378269361737789804449682927647509"
        "46649017977587207096330286416692887910946555547851940402630657488671505820681908902000"
        "708383676273854845817711531764475730270069855571366959622842914819860834936475292719"
        "074168444365510704342711559699508093042880177904174497792e312]",
        "[1797693134862315807937289714053034150799341327100378269361737789804449682927647509"
        "46649017977587207096330286416692887910946555547851940402630657488671505820681908902000"
        "708383676273854845817711531764475730270069855571366959622842914819860834936475292719"
        "07416844436551070434271155969950809304288017790417449779e1]",
        "[1797693134862315807937289714053034150799341327100378269361737789804449682927647509"
        "46649017977587207096330286416692887910946555547851940402630657488671505820681908902000"
        "708383676273854845817711531764475730270069855571366959622842914819860834936475292719"
        "0741684443655107043427115596995080930428801779041744977919999999999999e1]",
        "[0e999999999999999999]", "[0.0e999999]", "[1e-999999999999999999]",
        "[1e999999999999999999]", "[0.000000000000000000000000001e335]", "[1e309]",
        "[-1e309]", "[9.9999999999999999e307]", "[2e308]",
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++)
        same_z(cases[i]);
    same("[\"a\0b\"]", 7);
    same("[1]\0", 4);
    same("{\"a\":1}\0", 8);
    same("[1\0]", 4);
    /* integers up to 18 digits take the path without a check per digit; 19 the checked one */
    static const char *const names[] = {"a", "b", "c", "d", "e"};
    kvr_json_span v[5];
    const char *ints = "{\"a\":999999999999999999,\"b\":-999999999999999999,"
                       "\"c\":1000000000000000000,\"d\":-9223372036854775808,\"e\":-0}";
    assert_int_equal(kvr_json_scan(ints, strlen(ints), names, 5, v), KVR_JSON_OBJECT);
    assert_true(v[0].ival == 999999999999999999LL && v[1].ival == -999999999999999999LL);
    assert_true(v[2].ival == 1000000000000000000LL && v[3].ival == LLONG_MIN && v[4].ival == 0);
    for (int i = 0; i < 5; i++)
        assert_int_equal(v[i].kind, KVR_JSON_INTEGER);
}

static void test_depth_limit(void **state)
{
    (void)state;
    for (int depth = 2045; depth <= 2050; depth++) {
        char *s = malloc((size_t)depth * 6 + 16);
        size_t n = 0;
        for (int i = 0; i < depth; i++)
            s[n++] = '[';
        for (int i = 0; i < depth; i++)
            s[n++] = ']';
        same(s, n);
        n = 0;
        for (int i = 0; i < depth; i++)
            s[n++] = '[';
        s[n++] = '1';
        for (int i = 0; i < depth; i++)
            s[n++] = ']';
        same(s, n);
        n = 0; /* objects */
        for (int i = 0; i < depth; i++)
            n += (size_t)sprintf(s + n, "{\"a\":");
        s[n++] = '1';
        for (int i = 0; i < depth; i++)
            s[n++] = '}';
        same(s, n);
        free(s);
    }
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void test_mutation_fuzz(void **state)
{
    (void)state;
    static const char *seeds[] = {
        "{\"model\":\"m\",\"max_tokens\":16,\"stream\":true,\"stream_options\":{\"include_usage\""
        ":true},\"messages\":[{\"role\":\"system\",\"content\":\"You are \\\"helpful\\\".\"},{\"r"
        "ole\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"caf\xc3\xa9 \\u00e9 \\ud83d\\ud"
        "e00\"}]}],\"temperature\":0.7,\"n\":1,\"tools\":[{\"type\":\"function\",\"function\":{\"n"
        "ame\":\"f\",\"parameters\":{\"type\":\"object\",\"required\":[\"a\"]}}}]}",
        "[1,-2,3.5e-3,true,false,null,\"x\",[],{},{\"k\":[0,{\"j\":\"\\n\\t\"}]}]",
        "{\"prompt\":[1,2,3,128000],\"echo\":false,\"logprobs\":null,\"x\":1.5e308}",
    };
    static const char alphabet[] = "{}[]\",:\\/0123456789-+.eEtrufalsn u\t\n\x01\x80\xc3\xa9\xff";
    char buf[1024];
    for (int iter = 0; iter < 60000; iter++) {
        const char *seed = seeds[next() % 3];
        size_t n = strlen(seed);
        memcpy(buf, seed, n);
        int edits = 1 + (int)(next() % 4);
        for (int e = 0; e < edits; e++) {
            size_t pos = n ? next() % n : 0;
            char c = alphabet[next() % (sizeof(alphabet) - 1)];
            switch (next() % 4) {
            case 0:
                if (n)
                    buf[pos] = c;
                break;
            case 1:
                if (n + 1 < sizeof(buf)) {
                    memmove(buf + pos + 1, buf + pos, n - pos);
                    buf[pos] = c;
                    n++;
                }
                break;
            case 2:
                if (n) {
                    memmove(buf + pos, buf + pos + 1, n - pos - 1);
                    n--;
                }
                break;
            default:
                n = pos;
            }
        }
        same(buf, n);
    }
    print_message("checked %zu documents, %zu valid\n", checked, accepted);
    assert_true(accepted > 1000);
}

/* Strings dense in escapes, quotes and backslash runs at every offset of the scanner's
 * 16-byte blocks: the same acceptance as the reader, and `escaped` exactly when the string
 * holds a backslash. */
static void escape_blocks(void)
{
    static const char *const atoms[] = {"a", "b", "n", " ", "\\n", "\\\"", "\\\\", "\\/",
                                        "\\t", "\\u0041", "\\u00e9", "\\q", "\"", "\\",
                                        "\xc3\xa9", "\x01", "u", "/"};
    const size_t na = sizeof(atoms) / sizeof(atoms[0]);
    uint64_t x = 42;
    char buf[512], str[320];
    for (int round = 0; round < 200000; round++) {
        size_t n = 0;
        int pieces = (int)((x >> 40) % 48);
        for (int i = 0; i < pieces; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            /* mostly plain letters and valid escapes, now and then anything */
            size_t a = (x >> 33) % 16 < 13 ? (x >> 37) % 10 : (x >> 37) % na;
            size_t l = strlen(atoms[a]);
            memcpy(str + n, atoms[a], l);
            n += l;
        }
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        size_t pad = (x >> 35) % 17; /* where the string starts in a block */
        int len = snprintf(buf, sizeof(buf), "{\"%.*s\":1,\"s\":\"%.*s\",\"b\":\"\\n\"}",
                           (int)pad, "ppppppppppppppppp", (int)n, str);
        same(buf, (size_t)len);
        const char *names[] = {"s", "b"};
        kvr_json_span v[2];
        if (kvr_json_scan(buf, (size_t)len, names, 2, v) == KVR_JSON_OBJECT) {
            /* as the scan saw it, and as the iterator over validated text does */
            assert_int_equal(v[0].kind, KVR_JSON_STRING);
            assert_int_equal(v[0].escaped, memchr(buf + v[0].off, '\\', v[0].len) != NULL);
            assert_int_equal(v[1].kind, KVR_JSON_STRING);
            assert_int_equal(v[1].len, 4);
            kvr_json_span top = {.off = 0, .len = (size_t)len, .kind = KVR_JSON_OBJECT}, s;
            kvr_json_iter it;
            kvr_json_iter_init(&it, buf, &top);
            assert_int_equal(kvr_json_iter_next(&it, NULL, &s), 1);
            assert_int_equal(kvr_json_iter_next(&it, NULL, &s), 1);
            assert_int_equal(s.off, v[0].off);
            assert_int_equal(s.len, v[0].len);
            assert_int_equal(s.escaped, v[0].escaped);
        }
    }
}

/* kvr_json_scan_elems(): each element's offset, length as written and kind; the last
 * occurrence of the member counts; no more than `cap` recorded. */
static void test_escape_blocks(void **state)
{
    (void)state;
    escape_blocks();          /* 32-byte steps where the CPU has AVX2 */
    kvr_json_scan_wide(0);    /* 16-byte steps */
    escape_blocks();
    kvr_json_scan_wide(1);
}

static void test_elems(void **state)
{
    (void)state;
    const char *b = "{\"m\":[0],\"x\":[9,9],\"m\":[ 1 , {\"a\":\"b\\n\"} ,\"s\",[2],-1.5 ]}";
    const char *names[] = {"x", "m"};
    kvr_json_span v[2];
    kvr_json_elem el[8];
    memset(el, 0xee, sizeof(el));
    assert_int_equal(kvr_json_scan_elems(b, strlen(b), names, 2, v, 1, el, 4), KVR_JSON_OBJECT);
    assert_int_equal(v[1].count, 5);
    static const char *const want[] = {"1", "{\"a\":\"b\\n\"}", "\"s\"", "[2]"};
    static const kvr_json_kind kinds[] = {KVR_JSON_INTEGER, KVR_JSON_OBJECT, KVR_JSON_STRING,
                                          KVR_JSON_ARRAY};
    for (size_t i = 0; i < 4; i++) {
        assert_int_equal(el[i].len, strlen(want[i]));
        assert_memory_equal(b + el[i].off, want[i], el[i].len);
        assert_int_equal(el[i].kind, kinds[i]);
    }
    assert_int_equal(el[4].off, (size_t)0xeeeeeeeeeeeeeeeeull); /* past the cap: untouched */
    /* the member absent or no array: nothing recorded */
    memset(el, 0xee, sizeof(el));
    const char *c = "{\"m\":{\"a\":[1]},\"x\":[3]}";
    assert_int_equal(kvr_json_scan_elems(c, strlen(c), names, 2, v, 1, el, 8), KVR_JSON_OBJECT);
    assert_int_equal(el[0].off, (size_t)0xeeeeeeeeeeeeeeeeull);
}

static void test_spans(void **state)
{
    (void)state;
    const char *b = "{\"m\\u006fdel\":\"a\\/b\",\"n\":[1,\"x\",[2,3],[],{\"role\":\"u\"}],"
                    "\"k\":-7,\"r\":2.5,\"n\":[{\"role\":1,\"role\":\"s\"},{\"x\":{\"role\":\"y\"}}],"
                    "\"o\":{\"p\":{\"q\":null},\"p\":{\"q\":\"last\"}},\"t\":true}";
    const char *names[] = {"model", "n", "k", "r", "o", "t", "absent"};
    kvr_json_span v[7];
    assert_int_equal(kvr_json_scan(b, strlen(b), names, 7, v), KVR_JSON_OBJECT);
    assert_int_equal(v[0].kind, KVR_JSON_STRING);
    assert_true(v[0].escaped);
    char out[16];
    assert_int_equal(kvr_json_span_string(b, &v[0], out, sizeof(out)), 3);
    assert_memory_equal(out, "a/b", 3);
    assert_int_equal(kvr_json_span_string(b, &v[0], out, 1), 3); /* cut, length still full */
    /* the last "n" wins: two objects, the second without a role */
    assert_int_equal(v[1].kind, KVR_JSON_ARRAY);
    assert_int_equal(v[1].count, 2);
    assert_int_equal(v[1].first_norole, 1);
    assert_int_equal(v[1].nonstring, 2);
    assert_int_equal(v[2].kind, KVR_JSON_INTEGER);
    assert_int_equal(v[2].ival, -7);
    assert_int_equal(v[3].kind, KVR_JSON_REAL);
    assert_int_equal(v[4].kind, KVR_JSON_OBJECT);
    assert_memory_equal(b + v[4].off, "{\"p\":{\"q\":null}", 15);
    kvr_json_span p, q;
    assert_int_equal(kvr_json_span_member(b, &v[4], "p", &p), 1);
    assert_int_equal(kvr_json_span_member(b, &p, "q", &q), 1);
    assert_int_equal(q.kind, KVR_JSON_STRING);
    assert_memory_equal(b + q.off, "\"last\"", 6);
    assert_int_equal(kvr_json_span_member(b, &q, "q", &p), 0); /* not an object */
    assert_int_equal(v[5].kind, KVR_JSON_TRUE);
    assert_int_equal(v[6].kind, KVR_JSON_ABSENT);

    kvr_json_span el;
    assert_int_equal(kvr_json_span_first(b, &v[1], &el), 1);
    assert_int_equal(el.kind, KVR_JSON_OBJECT);
    assert_memory_equal(b + el.off, "{\"role\":1,\"role\":\"s\"}", el.len);
    assert_int_equal(kvr_json_span_first(b, &v[0], &el), 0);
    const char *fa = "{\"a\":[ \"x\\\"]\" ,1],\"b\":[],\"c\":[-12e1 ],\"d\":[[1,[2]],3],\"e\":[7]}";
    const char *fn[] = {"a", "b", "c", "d", "e"};
    kvr_json_span fv[5];
    assert_int_equal(kvr_json_scan(fa, strlen(fa), fn, 5, fv), KVR_JSON_OBJECT);
    assert_int_equal(kvr_json_span_first(fa, &fv[0], &el), 1);
    assert_int_equal(el.kind, KVR_JSON_STRING);
    assert_true(el.escaped);
    assert_memory_equal(fa + el.off, "\"x\\\"]\"", el.len);
    assert_int_equal(kvr_json_span_first(fa, &fv[1], &el), 0);
    assert_int_equal(kvr_json_span_first(fa, &fv[2], &el), 1);
    assert_int_equal(el.kind, KVR_JSON_REAL);
    assert_int_equal(el.len, 5);
    assert_int_equal(kvr_json_span_first(fa, &fv[3], &el), 1);
    assert_int_equal(el.kind, KVR_JSON_ARRAY);
    assert_memory_equal(fa + el.off, "[1,[2]]", el.len);
    assert_int_equal(kvr_json_span_first(fa, &fv[4], &el), 1);
    assert_int_equal(el.kind, KVR_JSON_INTEGER);
    assert_int_equal(el.ival, 7);

    const char *arr = "[{\"model\":\"x\"}]";
    assert_int_equal(kvr_json_scan(arr, strlen(arr), names, 1, v), KVR_JSON_ARRAY);
    assert_int_equal(v[0].kind, KVR_JSON_ABSENT);

    /* summaries of prompt forms */
    const char *pr = "{\"a\":[[1,2],[0],[-0]],\"b\":[[1],[],[2]],\"c\":[1,-1],\"d\":[\"s\",\"t\"]}";
    const char *pn[] = {"a", "b", "c", "d"};
    assert_int_equal(kvr_json_scan(pr, strlen(pr), pn, 4, v), KVR_JSON_OBJECT);
    assert_int_equal(v[0].nontokarr, 0);
    assert_int_equal(v[1].nontokarr, 1);
    assert_int_equal(v[2].nontoken, 1);
    assert_int_equal(v[3].nonstring, 0);
    assert_int_equal(v[3].nontoken, 2);
}

static const char *get_hdr(void *ctx, const char *name, size_t *len)
{
    const char *const *kv = ctx;
    for (; kv && *kv; kv += 2)
        if (strcmp(kv[0], name) == 0) {
            *len = strlen(kv[1]);
            return kv[1];
        }
    return NULL;
}

/* Session keys, validation and the other fields agree with the tree-based functions. */
static void agree(const char *body, const kvr_session_sources *src)
{
    kvr_body_fields f;
    json_t *j = kvr_json_read(body, strlen(body), NULL);
    assert_non_null(j);
    assert_int_equal(kvr_body_fields_scan(&f, body, strlen(body), src), 0);
    static const char *const hdr[] = {"x-user-id", "u-1", NULL};
    for (int h = 0; h < 2; h++) {
        kvr_buf a, b;
        kvr_buf_init(&a, 0);
        kvr_buf_init(&b, 0);
        int ra = kvr_session_key_build(j, get_hdr, h ? (void *)hdr : NULL, src, &a);
        int rb = kvr_body_session_key(&f, get_hdr, h ? (void *)hdr : NULL, src, &b);
        if (ra != rb || a.len != b.len || (a.len && memcmp(a.data, b.data, a.len)))
            fail_msg("session key of %s: tree %d '%.*s', scan %d '%.*s'", body, ra,
                     (int)a.len, a.data ? a.data : "", rb, (int)b.len, b.data ? b.data : "");
        kvr_buf_free(&a);
        kvr_buf_free(&b);
    }
    for (int ep = 0; ep < KVR_EP_COUNT; ep++) {
        char m1[300] = "", m2[300] = "";
        const char *p1 = "unset", *p2 = "unset";
        int s1 = kvr_api_validate(j, (kvr_endpoint)ep, m1, sizeof(m1), &p1);
        int s2 = kvr_api_validate_fields(&f, (kvr_endpoint)ep, m2, sizeof(m2), &p2);
        if (s1 != s2 || strcmp(m1, m2) || (p1 != p2 && (!p1 || !p2 || strcmp(p1, p2))))
            fail_msg("%s on %s: tree %d %s, scan %d %s", kvr_endpoint_path((kvr_endpoint)ep),
                     body, s1, m1, s2, m2);
    }
    assert_int_equal(kvr_body_integer(&f, KVR_FIELD_MAX_TOKENS),
                     json_integer_value(json_object_get(j, "max_tokens")));
    json_decref(j);
}

static void test_fields_agree(void **state)
{
    (void)state;
    static const char *bodies[] = {
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\"},{\"content\":\"x\"}]}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\"},[]]}",
        "{\"model\":\"m\",\"messages\":[]}", "{\"model\":\"m\",\"messages\":null}",
        "{\"model\":1}", "{\"messages\":[{\"role\":\"u\"}]}", "[]",
        "{\"model\":\"m\",\"stream\":\"yes\"}", "{\"model\":\"m\",\"stream\":null,\"prompt\":[]}",
        "{\"model\":\"m\",\"prompt\":[[1],[2,3]],\"max_tokens\":12}",
        "{\"model\":\"m\",\"prompt\":[[1],[]],\"max_tokens\":1.5}",
        "{\"model\":\"m\",\"prompt\":[\"a\",1]}", "{\"model\":\"m\",\"input\":{}}",
        "{\"tokens\":[1,-0,2]}", "{\"tokens\":[1,-1]}", "{\"tokens\":[]}", "{\"tokens\":{}}",
        "{\"model\":\"m\",\"query\":1,\"documents\":[]}", "{\"model\":\"m\",\"text_1\":null}",
        "{\"model\":\"m\",\"system\":{},\"messages\":[]}",
        "{\"model\":\"m\",\"tools\":{},\"messages\":[]}",
        "{\"model\":\"m\",\"user\":\"\",\"session_id\":\"s\\u00e9\"}",
        "{\"model\":\"m\",\"user\":42,\"session_id\":null}",
        "{\"model\":\"m\",\"metadata\":{\"user_id\":{\"b\":1,\"a\":[2.50,true]}}}",
        "{\"session_params\":{\"session_id\":\"a\"},\"session_params\":{\"x\":1},\"user\":\"u\"}",
        "{\"session_params\":[1],\"conversation_id\":\"\\ud83d\\ude00\"}",
        "{\"user\":\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
        "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
        "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
        "xxxxxxxxxxx\"}",
    };
    for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++)
        agree(bodies[i], NULL);
    kvr_session_sources src;
    assert_int_equal(kvr_session_sources_parse(&src, "body:a.b.c,body:model,header:x-user-id",
                                               NULL, 0), 0);
    agree("{\"a\":{\"b\":{\"c\":\"deep\"}},\"model\":\"m\"}", &src);
    agree("{\"a\":{\"b\":[1]},\"model\":\"m\"}", &src);
    agree("{\"a\":{\"b\":{\"c\":\"\"}},\"model\":\"m\"}", &src);
}

static void test_strdup(void **state)
{
    (void)state;
    const char *b = "{\"model\":\"caf\\u00e9\",\"previous_response_id\":7}";
    kvr_body_fields f;
    assert_int_equal(kvr_body_fields_scan(&f, b, strlen(b), NULL), 0);
    char *s;
    size_t n;
    assert_int_equal(kvr_body_strdup(&f, KVR_FIELD_MODEL, &s, &n), 1);
    assert_string_equal(s, "caf\xc3\xa9");
    assert_int_equal(n, 5);
    free(s);
    assert_int_equal(kvr_body_strdup(&f, KVR_FIELD_PREVIOUS_RESPONSE_ID, &s, &n), 0);
    assert_null(s);
    assert_int_equal(kvr_body_fields_scan(&f, "{\"a\":", 5, NULL), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_edge_cases),  cmocka_unit_test(test_depth_limit),
        cmocka_unit_test(test_mutation_fuzz), cmocka_unit_test(test_escape_blocks),
        cmocka_unit_test(test_elems), cmocka_unit_test(test_spans),
        cmocka_unit_test(test_fields_agree), cmocka_unit_test(test_strdup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
