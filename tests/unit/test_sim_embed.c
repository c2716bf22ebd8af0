/* kvroute-sim embeddings: unit vectors that depend only on the model and the input's token
 * ids, OpenAI's data shape in float and base64, and the 400s for malformed inputs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "embed.h"

static json_t *data_of(const char *input, const kvr_sim_embed_opts *o, size_t *tokens,
                       uint64_t *digest, int want)
{
    json_t *in = json_loads(input, JSON_DECODE_ANY, NULL);
    assert_non_null(in);
    kvr_buf b;
    kvr_buf_init(&b, 0);
    char msg[300] = "";
    int rc = kvr_sim_embed_data(in, o, &b, tokens, digest, msg, sizeof(msg));
    json_decref(in);
    assert_int_equal(rc, want);
    json_t *out = rc ? NULL : json_loadb(b.data, b.len, 0, NULL);
    if (rc)
        assert_true(msg[0] != '\0');
    else
        assert_non_null(out);
    kvr_buf_free(&b);
    return out;
}

static void test_vectors(void **state)
{
    (void)state;
    kvr_sim_embed_opts o = {.model = "m", .dim = 16, .add_special_tokens = 1,
                            .max_model_len = 1000};
    size_t tokens;
    uint64_t d1, d2;
    json_t *a = data_of("[\"hello world\", \"x\"]", &o, &tokens, &d1, 0);
    assert_int_equal(json_array_size(a), 2);
    json_t *e0 = json_array_get(a, 0);
    assert_int_equal(json_integer_value(json_object_get(e0, "index")), 0);
    assert_string_equal(json_string_value(json_object_get(e0, "object")), "embedding");
    json_t *vec = json_object_get(e0, "embedding");
    assert_int_equal(json_array_size(vec), 16);
    double norm = 0;
    for (size_t i = 0; i < 16; i++)
        norm += json_real_value(json_array_get(vec, i)) * json_real_value(json_array_get(vec, i));
    assert_true(fabs(norm - 1.0) < 1e-5);
    /* the same input again: the same vector and digest; a single string is its batch's first */
    json_t *b = data_of("\"hello world\"", &o, &tokens, &d2, 0);
    assert_true(json_equal(json_object_get(json_array_get(b, 0), "embedding"), vec));
    assert_true(d1 != d2);
    json_t *c = data_of("[\"hello world\", \"x\"]", &o, &tokens, &d2, 0);
    assert_true(json_equal(a, c) && d1 == d2);
    /* another model embeds otherwise */
    o.model = "other";
    json_t *d = data_of("\"hello world\"", &o, &tokens, &d2, 0);
    assert_false(json_equal(json_object_get(json_array_get(d, 0), "embedding"), vec));
    json_decref(a);
    json_decref(b);
    json_decref(c);
    json_decref(d);
}

static void test_tokens_and_base64(void **state)
{
    (void)state;
    kvr_sim_embed_opts o = {.model = "m", .dim = 3, .base64 = 1, .max_model_len = 4};
    size_t tokens;
    uint64_t dg;
    json_t *a = data_of("[[1,2],[3]]", &o, &tokens, &dg, 0);
    assert_int_equal(tokens, 3);
    const char *s = json_string_value(json_object_get(json_array_get(a, 1), "embedding"));
    assert_non_null(s);
    assert_int_equal(strlen(s), 16); /* 12 bytes of float32 in base64 */
    json_decref(a);
    a = data_of("[7,8,9]", &o, &tokens, &dg, 0); /* one input of token ids */
    assert_int_equal(json_array_size(a), 1);
    assert_int_equal(tokens, 3);
    json_decref(a);
    /* too long for max_model_len, malformed, empty, ids out of vocabulary */
    const char *bad[] = {"[1,2,3,4,5]", "{}", "[]", "[\"a\",{}]", "[[1,-2]]", "[[1],[99999999]]",
                         "null", "3"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        data_of(bad[i], &o, &tokens, &dg, 400);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vectors),
        cmocka_unit_test(test_tokens_and_base64),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
