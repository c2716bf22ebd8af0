/* The body rewriter (proxy/body_edit.h) and the prefill/decode bodies and answers
 * (proxy/pd_body.h): members replaced, removed and appended with every other byte as the
 * client sent it; the vLLM prefill copy and decode body; SGLang's bootstrap; the prefill
 * answer's kv_transfer_params and usage. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "proxy/body_edit.h"
#include "proxy/pd_body.h"

/* `body` with edits `e` gives exactly `want`. */
static void check(const char *body, const kvr_body_edit *e, size_t n, const char *want)
{
    kvr_buf out;
    kvr_buf_init(&out, 0);
    assert_int_equal(kvr_body_edit_apply(body, strlen(body), e, n, &out), 0);
    assert_int_equal(out.len, strlen(want));
    assert_memory_equal(out.data, want, out.len);
    kvr_buf_free(&out);
}

#define SET(k, v) {k, v, sizeof(v) - 1, 0}
#define DROP(k) {k, NULL, 0, 0}

static void edits(void **state)
{
    (void)state;
    kvr_body_edit none[1] = {SET("unused", "0")};
    check("{ \"a\" : 1 ,\n \"b\":[1,{\"a\":2}] }", none, 0, "{ \"a\" : 1 ,\n \"b\":[1,{\"a\":2}] }");
    kvr_body_edit set[] = {SET("a", "\"x\"")};
    check("{ \"a\" : 1 , \"b\":2 }", set, 1, "{ \"a\" : \"x\" , \"b\":2 }");
    /* a nested member of the same name is not top-level: untouched */
    check("{\"b\":{\"a\":1},\"a\":2}", set, 1, "{\"b\":{\"a\":1},\"a\":\"x\"}");
    /* escaped key names match as decoded */
    check("{\"\\u0061\":1}", set, 1, "{\"\\u0061\":\"x\"}");
    kvr_body_edit drop[] = {DROP("a")};
    check("{ \"a\" : 1 , \"b\":2 }", drop, 1, "{ \"b\":2 }");
    check("{\"b\":2, \"a\":1, \"c\":3}", drop, 1, "{\"b\":2, \"c\":3}");
    check("{\"b\":2 , \"a\":1 }", drop, 1, "{\"b\":2 }");
    check("{\"a\":1}", drop, 1, "{}");
    check("{\"a\":1,\"a\":2,\"b\":3}", drop, 1, "{\"b\":3}");
    check("{}", drop, 1, "{}");
    kvr_body_edit add[] = {SET("z", "true"), SET("y", "null")};
    check("{\"a\":1 }", add, 2, "{\"a\":1,\"z\":true,\"y\":null }");
    check("{ }", add, 2, "{\"z\":true,\"y\":null }");
    check("{\"a\":1}", (kvr_body_edit[]){DROP("a"), SET("b", "2")}, 2, "{\"b\":2}");
    /* if_present: replaced, never appended */
    kvr_body_edit only[] = {{"m", "1", 1, 1}};
    check("{\"a\":1}", only, 1, "{\"a\":1}");
    check("{\"m\":5}", only, 1, "{\"m\":1}");
    /* the first edit of a key wins; it is appended once */
    check("{}", (kvr_body_edit[]){SET("k", "1"), SET("k", "2")}, 2, "{\"k\":1}");
    kvr_buf out;
    kvr_buf_init(&out, 0);
    assert_int_equal(kvr_body_edit_apply("[1]", 3, set, 1, &out), -1);
    kvr_buf_free(&out);
}

static void model_edit(void **state)
{
    (void)state;
    char *enc;
    kvr_body_edit e[1];
    assert_int_equal(kvr_body_edit_model("m", NULL, &enc, e), 0);
    assert_null(enc);
    assert_int_equal(kvr_body_edit_model("m", "m", &enc, e), 0);
    assert_int_equal(kvr_body_edit_model("meta/\"x\"", "pub", &enc, e), 1);
    check("{\"model\": \"pub\" ,\"a\":1}", e, 1, "{\"model\": \"meta/\\\"x\\\"\" ,\"a\":1}");
    /* replace only: a body without `model` (tokenize) stays as sent */
    check("{\"a\":1}", e, 1, "{\"a\":1}");
    free(enc);
}

static void vllm_bodies(void **state)
{
    (void)state;
    kvr_body_edit e[KVR_PD_MAX_EDITS];
    size_t n = kvr_pd_vllm_prefill_edits(e);
    check("{\"model\":\"m\",\"messages\":[],\"stream\":true,\"stream_options\":{\"include_usage\":"
          "true},\"max_tokens\":50,\"min_tokens\":2,\"max_completion_tokens\":9,"
          "\"min_completion_tokens\":1}",
          e, n,
          "{\"model\":\"m\",\"messages\":[],\"stream\":false,\"max_tokens\":1,"
          "\"max_completion_tokens\":1,\"kv_transfer_params\":{\"do_remote_decode\":true,"
          "\"do_remote_prefill\":false,\"remote_engine_id\":null,\"remote_block_ids\":null,"
          "\"remote_host\":null,\"remote_port\":null}}");
    check("{\"prompt\":\"x\"}", e, n,
          "{\"prompt\":\"x\",\"stream\":false,\"max_tokens\":1,\"kv_transfer_params\":{"
          "\"do_remote_decode\":true,\"do_remote_prefill\":false,\"remote_engine_id\":null,"
          "\"remote_block_ids\":null,\"remote_host\":null,\"remote_port\":null}}");
    static const char kv[] = "{\"remote_block_ids\":[1,2]}";
    n = kvr_pd_vllm_decode_edits(kv, strlen(kv), e);
    check("{\"prompt\":\"x\", \"kv_transfer_params\":null}", e, n,
          "{\"prompt\":\"x\", \"kv_transfer_params\":{\"remote_block_ids\":[1,2]}}");
}

static void sglang_bootstrap(void **state)
{
    (void)state;
    kvr_pd_bootstrap bs;
    assert_int_equal(kvr_pd_bootstrap_init(&bs, "http://10.0.0.7:30000/x", 8998, UINT64_MAX), 0);
    assert_string_equal(bs.host, "10.0.0.7");
    assert_true(bs.room == (uint64_t)INT64_MAX);
    kvr_body_edit e[3];
    assert_int_equal(kvr_pd_sglang_edits(&bs, e), 3);
    check("{\"a\":1}", e, 3,
          "{\"a\":1,\"bootstrap_host\":\"10.0.0.7\",\"bootstrap_port\":8998,"
          "\"bootstrap_room\":9223372036854775807}");
    assert_int_equal(kvr_pd_bootstrap_init(&bs, "http://[::1]:9/", 1, 5), 0);
    assert_string_equal(bs.host, "[::1]");
    assert_int_equal(kvr_pd_bootstrap_init(&bs, "http://host", 1, 5), 0);
    assert_string_equal(bs.host, "host");
    assert_int_equal(kvr_pd_bootstrap_init(&bs, "http://:80", 1, 5), -1);
}

static void answers(void **state)
{
    (void)state;
    kvr_pd_answer a;
    static const char ok[] = "{\"id\":\"x\",\"kv_transfer_params\":{\"do_remote_prefill\":true,"
                             "\"remote_block_ids\":[3, 4]},\"usage\":{\"prompt_tokens\":40,"
                             "\"prompt_tokens_details\":{\"cached_tokens\":16}}}";
    assert_int_equal(kvr_pd_read_answer(ok, strlen(ok), &a), 0);
    assert_string_equal(a.kvtp, "{\"do_remote_prefill\":true,\"remote_block_ids\":[3,4]}");
    assert_int_equal(a.prompt, 40);
    assert_int_equal(a.cached, 16);
    kvr_pd_answer_free(&a);
    static const char none[] = "{\"kv_transfer_params\":null,\"usage\":{\"prompt_tokens\":-1}}";
    assert_int_equal(kvr_pd_read_answer(none, strlen(none), &a), 0);
    assert_null(a.kvtp);
    assert_int_equal(a.prompt, -1);
    kvr_pd_answer_free(&a);
    /* NixlConnector's fields with the wrong types: no usable parameters (a prefill failure) */
    static const char *const bad[] = {
        "{\"kv_transfer_params\":{\"remote_block_ids\":\"notalist\"}}",
        "{\"kv_transfer_params\":{\"remote_block_ids\":[1,-2]}}",
        "{\"kv_transfer_params\":{\"remote_block_ids\":[1,\"2\"]}}",
        "{\"kv_transfer_params\":{\"remote_host\":5}}",
        "{\"kv_transfer_params\":{\"remote_engine_id\":[]}}",
        "{\"kv_transfer_params\":{\"remote_port\":70000}}",
        "{\"kv_transfer_params\":{\"remote_port\":\"8000\"}}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        assert_int_equal(kvr_pd_read_answer(bad[i], strlen(bad[i]), &a), 0);
        assert_null(a.kvtp);
        kvr_pd_answer_free(&a);
    }
    static const char other[] = "{\"kv_transfer_params\":{\"remote_host\":null,"
                                "\"remote_port\":5600,\"lmcache_key\":{\"x\":1}}}";
    assert_int_equal(kvr_pd_read_answer(other, strlen(other), &a), 0);
    assert_non_null(a.kvtp); /* other connectors' fields pass as they are */
    kvr_pd_answer_free(&a);
    assert_int_equal(kvr_pd_read_answer("[]", 2, &a), -1);
    assert_int_equal(kvr_pd_read_answer("{\"a\":", 5, &a), -1);
    assert_int_equal(kvr_pd_read_answer("", 0, &a), -1);
    assert_null(a.kvtp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(edits),
        cmocka_unit_test(model_edit),
        cmocka_unit_test(vllm_bodies),
        cmocka_unit_test(sglang_bootstrap),
        cmocka_unit_test(answers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
