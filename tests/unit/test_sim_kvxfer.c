/* kvroute-sim KV transfer bookkeeping: the request fields (kv_transfer_params, bootstrap_*),
 * the transfer answer written by a prefill and read back by a decode, and the URL segment
 * escaping of request ids. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "kvxfer.h"

static int read_params(const char *json, kvr_sim_xfer_params *p, const char **param)
{
    json_t *j = json_loads(json, JSON_ALLOW_NUL, NULL);
    assert_non_null(j);
    char err[200];
    int rc = kvr_sim_xfer_read_params(j, 8, p, err, sizeof(err), param);
    json_decref(j);
    return rc;
}

static void test_router_prefill_params(void **state)
{
    (void)state;
    kvr_sim_xfer_params p;
    const char *param;
    assert_int_equal(read_params("{\"kv_transfer_params\":{\"do_remote_decode\":true,"
                                 "\"do_remote_prefill\":false,\"remote_engine_id\":null,"
                                 "\"remote_block_ids\":null,\"remote_host\":null,"
                                 "\"remote_port\":null}}",
                                 &p, &param),
                     0);
    assert_true(p.has_params && p.do_remote_decode && !p.do_remote_prefill);
    assert_null(p.remote_block_ids);
    assert_string_equal(p.remote_host, "");
    assert_int_equal(p.remote_port, 0);
    kvr_sim_xfer_params_free(&p);
}

static void test_decode_params_and_bootstrap(void **state)
{
    (void)state;
    kvr_sim_xfer_params p;
    const char *param;
    assert_int_equal(read_params("{\"kv_transfer_params\":{\"do_remote_prefill\":true,"
                                 "\"do_remote_decode\":false,\"remote_engine_id\":\"e1\","
                                 "\"remote_block_ids\":[4,5,6],\"remote_host\":\"127.0.0.1\","
                                 "\"remote_port\":9001,\"remote_request_id\":\"chatcmpl-1\","
                                 "\"tp_size\":1},\"bootstrap_room\":4611686018427387911,"
                                 "\"bootstrap_host\":\"h\",\"bootstrap_port\":8998}",
                                 &p, &param),
                     0);
    assert_true(p.do_remote_prefill);
    assert_int_equal(p.nremote_block_ids, 3);
    assert_int_equal(p.remote_block_ids[2], 6);
    assert_string_equal(p.remote_engine_id, "e1");
    assert_string_equal(p.remote_request_id, "chatcmpl-1");
    assert_int_equal(p.remote_port, 9001);
    assert_true(p.has_room);
    assert_true(p.room == 4611686018427387911ull);
    assert_string_equal(p.bootstrap_host, "h");
    assert_int_equal(p.bootstrap_port, 8998);
    kvr_sim_xfer_params_free(&p);
    assert_int_equal(read_params("{}", &p, &param), 0);
    assert_false(p.has_params || p.has_room);
}

static void test_bad_params(void **state)
{
    (void)state;
    static const struct {
        const char *json, *param;
    } bad[] = {
        {"{\"kv_transfer_params\":[]}", "kv_transfer_params"},
        {"{\"kv_transfer_params\":{\"do_remote_decode\":1}}", "kv_transfer_params"},
        {"{\"kv_transfer_params\":{\"remote_port\":0}}", "kv_transfer_params"},
        {"{\"kv_transfer_params\":{\"remote_port\":\"80\"}}", "kv_transfer_params"},
        {"{\"kv_transfer_params\":{\"remote_block_ids\":[1,2,3,4,5,6,7,8,9]}}",
         "kv_transfer_params"},
        {"{\"kv_transfer_params\":{\"remote_block_ids\":[1.5]}}", "kv_transfer_params"},
        {"{\"kv_transfer_params\":{\"remote_block_ids\":[4294967296]}}", "kv_transfer_params"},
        {"{\"kv_transfer_params\":{\"remote_request_id\":\"a\\u0000b\"}}", "kv_transfer_params"},
        {"{\"bootstrap_room\":-1}", "bootstrap_room"},
        {"{\"bootstrap_room\":[1]}", "bootstrap_room"},
        {"{\"bootstrap_port\":65536}", "bootstrap_port"},
        {"{\"bootstrap_host\":7}", "bootstrap_host"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        kvr_sim_xfer_params p;
        const char *param = NULL;
        assert_int_equal(read_params(bad[i].json, &p, &param), -1);
        assert_string_equal(param, bad[i].param);
        assert_null(p.remote_block_ids);
    }
}

static void test_answer_round_trip(void **state)
{
    (void)state;
    uint32_t ids[2] = {7, 3}, toks[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    kvr_buf b;
    kvr_buf_init(&b, 0);
    assert_int_equal(kvr_sim_xfer_write(&b, "req\"1", "eng", 4, ids, 2, toks), 0);
    kvr_sim_xfer_blocks x;
    char err[200];
    assert_int_equal(kvr_sim_xfer_parse(b.data, b.len, 4, 16, 100, &x, err, sizeof(err)), 0);
    assert_int_equal(x.n, 2);
    assert_memory_equal(x.block_ids, ids, sizeof(ids));
    assert_memory_equal(x.tokens, toks, sizeof(toks));
    kvr_sim_xfer_blocks_free(&x);
    /* another block size, too many blocks, a token out of vocabulary */
    assert_int_equal(kvr_sim_xfer_parse(b.data, b.len, 8, 16, 100, &x, err, sizeof(err)), -1);
    assert_int_equal(kvr_sim_xfer_parse(b.data, b.len, 4, 1, 100, &x, err, sizeof(err)), -1);
    assert_int_equal(kvr_sim_xfer_parse(b.data, b.len, 4, 16, 8, &x, err, sizeof(err)), -1);
    kvr_buf_free(&b);
    static const char *const junk[] = {
        "", "null", "[]", "{\"block_size\":4}", "{\"block_size\":4,\"block_ids\":[1],"
        "\"token_ids\":[1,2,3]}", "{\"block_size\":4,\"block_ids\":[-1],\"token_ids\":[1,2,3,4]}",
        "{\"block_size\":4,\"block_ids\":{},\"token_ids\":[]}"};
    for (size_t i = 0; i < sizeof(junk) / sizeof(*junk); i++) {
        assert_int_equal(kvr_sim_xfer_parse(junk[i], strlen(junk[i]), 4, 16, 100, &x, err,
                                            sizeof(err)),
                         -1);
        assert_true(strlen(err) > 0);
        assert_null(x.block_ids);
    }
}

static void test_escape(void **state)
{
    (void)state;
    char out[64], back[64];
    assert_int_equal(kvr_sim_xfer_escape("chatcmpl-ab_1.~", out, sizeof(out)), 0);
    assert_string_equal(out, "chatcmpl-ab_1.~");
    assert_int_equal(kvr_sim_xfer_escape("a b/c?%", out, sizeof(out)), 0);
    assert_string_equal(out, "a%20b%2Fc%3F%25");
    assert_int_equal(kvr_sim_xfer_unescape(out, back, sizeof(back)), 0);
    assert_string_equal(back, "a b/c?%");
    assert_int_equal(kvr_sim_xfer_escape("abc", out, 3), -1);
    assert_int_equal(kvr_sim_xfer_unescape("%zz", back, sizeof(back)), -1);
    assert_int_equal(kvr_sim_xfer_unescape("%4", back, sizeof(back)), -1);
    assert_int_equal(kvr_sim_xfer_unescape("a%00", back, sizeof(back)), -1);
    assert_int_equal(kvr_sim_xfer_unescape("abcd", back, 4), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_router_prefill_params),
        cmocka_unit_test(test_decode_params_and_bootstrap),
        cmocka_unit_test(test_bad_params),
        cmocka_unit_test(test_answer_round_trip),
        cmocka_unit_test(test_escape),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
