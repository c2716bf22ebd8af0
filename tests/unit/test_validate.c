/* What kvroute accepts before routing: body validation per endpoint (api/validate.h), the
 * endpoint table (paths, model-optional endpoints), the routing text of the input endpoints
 * (routing/keys.h) and the POST /workers body (api/workers_admin.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "api/validate.h"
#include "api/workers_admin.h"
#include "routing/keys.h"

static json_t *parse(const char *s)
{
    json_error_t e;
    json_t *j = json_loads(s, 0, &e);
    if (!j)
        fail_msg("bad test JSON: %s: %s", e.text, s);
    return j;
}

/* Validates `body` for `ep`: the status, and the offending field when refused. */
static void expect(kvr_endpoint ep, const char *body, int status, const char *param)
{
    json_t *j = parse(body);
    char msg[300] = "";
    const char *p = "unset";
    int st = kvr_api_validate(j, ep, msg, sizeof(msg), &p);
    json_decref(j);
    if (st != status)
        fail_msg("%s %s: got %d (%s), want %d", kvr_endpoint_path(ep), body, st, msg, status);
    if (status) {
        assert_true(msg[0] != '\0');
        if (param)
            assert_string_equal(p, param);
    }
}

static void test_endpoint_table(void **state)
{
    (void)state;
    for (int i = 0; i < KVR_EP_COUNT; i++) {
        kvr_endpoint ep;
        const char *path = kvr_endpoint_path((kvr_endpoint)i);
        assert_true(path[0] == '/');
        assert_int_equal(kvr_endpoint_find(path, &ep), 0);
        assert_int_equal(ep, i);
    }
    kvr_endpoint ep;
    assert_int_equal(kvr_endpoint_find("/v1/embeddings/", &ep), -1);
    assert_int_equal(kvr_endpoint_find("/v1/unknown", &ep), -1);
    assert_int_equal(kvr_endpoint_find("/rerank", &ep), 0);
    assert_int_equal(ep, KVR_EP_RERANK_BARE);
    assert_true(kvr_endpoint_generates(KVR_EP_CHAT) && kvr_endpoint_generates(KVR_EP_RESPONSES));
    assert_false(kvr_endpoint_generates(KVR_EP_EMBEDDINGS));
    assert_false(kvr_endpoint_fills_cache(KVR_EP_TOKENIZE));
    assert_true(kvr_endpoint_fills_cache(KVR_EP_EMBEDDINGS));
    assert_true(kvr_endpoint_model_optional(KVR_EP_DETOKENIZE));
    assert_false(kvr_endpoint_model_optional(KVR_EP_EMBEDDINGS));
}

static void test_validate_inputs(void **state)
{
    (void)state;
    /* embeddings (and pooling, classify): input in any prompt form, or chat messages */
    expect(KVR_EP_EMBEDDINGS, "{\"model\":\"m\",\"input\":\"x\"}", 0, NULL);
    expect(KVR_EP_EMBEDDINGS, "{\"model\":\"m\",\"input\":[\"a\",\"b\"]}", 0, NULL);
    expect(KVR_EP_EMBEDDINGS, "{\"model\":\"m\",\"input\":[1,2,3]}", 0, NULL);
    expect(KVR_EP_EMBEDDINGS, "{\"model\":\"m\",\"input\":[[1,2],[3]]}", 0, NULL);
    expect(KVR_EP_POOLING, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\"}]}", 0, NULL);
    expect(KVR_EP_EMBEDDINGS, "{\"input\":\"x\"}", 400, "model");
    expect(KVR_EP_EMBEDDINGS, "{\"model\":\"m\"}", 400, "input");
    expect(KVR_EP_EMBEDDINGS, "{\"model\":\"m\",\"input\":[]}", 400, "input");
    expect(KVR_EP_EMBEDDINGS, "{\"model\":\"m\",\"input\":{\"a\":1}}", 400, "input");
    expect(KVR_EP_CLASSIFY, "{\"model\":\"m\",\"input\":[\"a\",1]}", 400, "input");
    expect(KVR_EP_EMBEDDINGS, "{\"model\":\"m\",\"messages\":[1]}", 400, "messages");
    /* tokenize and detokenize: model optional but a string when given */
    expect(KVR_EP_TOKENIZE, "{\"prompt\":\"hi\"}", 0, NULL);
    expect(KVR_EP_TOKENIZE, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", 0, NULL);
    expect(KVR_EP_TOKENIZE, "{\"model\":7,\"prompt\":\"hi\"}", 400, "model");
    expect(KVR_EP_TOKENIZE, "{}", 400, "prompt");
    expect(KVR_EP_DETOKENIZE, "{\"tokens\":[1,2]}", 0, NULL);
    expect(KVR_EP_DETOKENIZE, "{\"tokens\":[]}", 0, NULL);
    expect(KVR_EP_DETOKENIZE, "{\"tokens\":[-1]}", 400, "tokens");
    expect(KVR_EP_DETOKENIZE, "{\"tokens\":\"1 2\"}", 400, "tokens");
    expect(KVR_EP_DETOKENIZE, "{}", 400, "tokens");
    /* rerank: query and documents; score: its texts when present */
    expect(KVR_EP_RERANK, "{\"model\":\"m\",\"query\":\"q\",\"documents\":[\"a\"]}", 0, NULL);
    expect(KVR_EP_RERANK_BARE, "{\"model\":\"m\",\"documents\":[\"a\"]}", 400, "query");
    expect(KVR_EP_RERANK, "{\"model\":\"m\",\"query\":\"q\"}", 400, "documents");
    expect(KVR_EP_RERANK, "{\"model\":\"m\",\"query\":1,\"documents\":[]}", 400, "query");
    expect(KVR_EP_SCORE, "{\"model\":\"m\",\"text_1\":\"a\",\"text_2\":[\"b\"]}", 0, NULL);
    expect(KVR_EP_SCORE, "{\"model\":\"m\"}", 0, NULL);
    expect(KVR_EP_SCORE, "{\"model\":\"m\",\"text_2\":true}", 400, "text_2");
    /* what every endpoint checks */
    expect(KVR_EP_SCORE, "[1]", 400, NULL);
    expect(KVR_EP_EMBEDDINGS, "{\"model\":\"m\",\"input\":\"x\",\"stream\":1}", 400, "stream");
    /* chat, completions and responses keep their rules */
    expect(KVR_EP_CHAT, "{\"model\":\"m\",\"messages\":[]}", 400, "messages");
    expect(KVR_EP_COMPLETIONS, "{\"model\":\"m\",\"prompt\":[[]]}", 400, "prompt");
    expect(KVR_EP_RESPONSES, "{\"model\":\"m\"}", 0, NULL);
    expect(KVR_EP_RESPONSES, "{\"input\":\"x\"}", 400, "model");
}

static char *text_of(const char *body, kvr_endpoint ep, size_t *n)
{
    json_t *j = parse(body);
    kvr_buf b;
    kvr_buf_init(&b, 0);
    assert_int_equal(kvr_route_text_build(j, ep, &b), 0);
    json_decref(j);
    *n = b.len;
    char *r = malloc(b.len + 1);
    memcpy(r, b.data ? b.data : "", b.len);
    r[b.len] = 0;
    kvr_buf_free(&b);
    return r;
}

static void assert_prefix(const char *a, kvr_endpoint ea, const char *b, kvr_endpoint eb)
{
    size_t na, nb;
    char *ta = text_of(a, ea, &na), *tb = text_of(b, eb, &nb);
    assert_true(na > 0 && na <= nb);
    assert_memory_equal(ta, tb, na);
    free(ta);
    free(tb);
}

static void test_input_text(void **state)
{
    (void)state;
    size_t n;
    /* the input text as a completions prompt: same string, same text */
    char *t = text_of("{\"model\":\"m\",\"input\":\"hello world\"}", KVR_EP_EMBEDDINGS, &n);
    assert_int_equal(n, 11);
    assert_memory_equal(t, "hello world", 11);
    free(t);
    char *c = text_of("{\"model\":\"m\",\"prompt\":[\"a\",[1,2]]}", KVR_EP_COMPLETIONS, &n);
    size_t n2;
    t = text_of("{\"model\":\"m\",\"input\":[\"a\",[1,2]]}", KVR_EP_POOLING, &n2);
    assert_int_equal(n, n2);
    assert_memory_equal(c, t, n);
    free(c);
    free(t);
    /* a longer document shares the shorter one's prefix; a batch starts with its first */
    assert_prefix("{\"input\":\"a shared system preamble\"}", KVR_EP_EMBEDDINGS,
                  "{\"input\":[\"a shared system preamble and more\",\"x\"]}", KVR_EP_EMBEDDINGS);
    /* rerank: the query leads, so requests reranking for one query share a prefix */
    assert_prefix("{\"query\":\"what is kv caching\"}", KVR_EP_RERANK,
                  "{\"query\":\"what is kv caching\",\"documents\":[\"a\",\"b\"]}",
                  KVR_EP_RERANK_BARE);
    t = text_of("{\"query\":\"q\",\"documents\":[\"a\",\"b\"]}", KVR_EP_RERANK, &n);
    assert_int_equal(n, 5);
    assert_memory_equal(t, "q\x1e" "a\x1e" "b", 5);
    free(t);
    t = text_of("{\"text_1\":\"x\",\"text_2\":\"y\"}", KVR_EP_SCORE, &n);
    assert_int_equal(n, 3);
    assert_memory_equal(t, "x\x1ey", 3);
    free(t);
    /* tokenize: a prompt as completions, messages as chat (so it shares chat's prefix) */
    const char *msgs = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi there\"}]}";
    c = text_of(msgs, KVR_EP_CHAT, &n);
    t = text_of(msgs, KVR_EP_TOKENIZE, &n2);
    assert_int_equal(n, n2);
    assert_memory_equal(c, t, n);
    free(c);
    free(t);
    assert_prefix("{\"tokens\":[1,2]}", KVR_EP_DETOKENIZE, "{\"prompt\":[1,2,3]}",
                  KVR_EP_COMPLETIONS);
    /* nothing to route by: empty, never an error */
    t = text_of("{\"model\":\"m\"}", KVR_EP_CLASSIFY, &n);
    assert_int_equal(n, 0);
    free(t);
}

static int parse_worker(const char *body, kvr_api_worker *aw)
{
    json_t *j = parse(body);
    char msg[300] = "";
    int st = kvr_admin_worker_parse(j, aw, msg, sizeof(msg));
    json_decref(j);
    if (st)
        assert_true(msg[0] != '\0');
    return st;
}

static void test_worker_body(void **state)
{
    (void)state;
    kvr_api_worker aw;
    assert_int_equal(parse_worker("{\"url\":\"http://127.0.0.1:9001\"}", &aw), 0);
    assert_string_equal(aw.url, "http://127.0.0.1:9001");
    assert_string_equal(aw.name, aw.url);
    assert_true(aw.weight == 1.0);
    assert_int_equal(aw.role, KVR_ROLE_BOTH);
    assert_false(aw.routes_set);
    kvr_api_worker_free(&aw);
    assert_int_equal(parse_worker("{\"url\":\"http://h:1/\",\"name\":\"w\",\"weight\":2.5,"
                                  "\"routes\":[\"a\",\"b\"],\"role\":\"prefill\"}", &aw), 0);
    assert_string_equal(aw.name, "w");
    assert_true(aw.weight == 2.5);
    assert_int_equal(aw.role, KVR_ROLE_PREFILL);
    assert_true(aw.routes_set);
    assert_int_equal(aw.nroutes, 2);
    assert_string_equal(aw.routes[1], "b");
    kvr_api_worker_free(&aw);
    assert_int_equal(parse_worker("{\"url\":\"http://h:1\",\"routes\":[]}", &aw), 0);
    assert_true(aw.routes_set);
    assert_int_equal(aw.nroutes, 0);
    kvr_api_worker_free(&aw);
    const char *bad[] = {
        "[]", "{}", "{\"url\":5}", "{\"url\":\"https://h:1\"}", "{\"url\":\"http://h:0\"}",
        "{\"url\":\"http://h:1\",\"name\":\"\"}", "{\"url\":\"http://h:1\",\"name\":\"a\\nb\"}",
        "{\"url\":\"http://h:1\",\"weight\":0}", "{\"url\":\"http://h:1\",\"weight\":\"2\"}",
        "{\"url\":\"http://h:1\",\"role\":\"leader\"}", "{\"url\":\"http://h:1\",\"routes\":\"a\"}",
        "{\"url\":\"http://h:1\",\"routes\":[\"\"]}", "{\"url\":\"http://h:1\",\"routes\":[1]}",
        "{\"url\":\"http://h:1\",\"api_key\":\"k\"}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (parse_worker(bad[i], &aw) != 400)
            fail_msg("accepted %s", bad[i]);
        assert_null(aw.url); /* nothing left to free */
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_endpoint_table),
        cmocka_unit_test(test_validate_inputs),
        cmocka_unit_test(test_input_text),
        cmocka_unit_test(test_worker_body),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
