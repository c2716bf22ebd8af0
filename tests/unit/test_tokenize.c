/* Token ids of a request (src/proxy/tokenize.c): the header list parser, the synchronous
 * sources (header, prompt ids, nothing to tokenize), and POST /tokenize against a worker played
 * by kvroute's own HTTP server on the same libuv loop (127.0.0.1, ephemeral port): the body the
 * worker sees, the answer, the cache and its LRU bound, deadlines, failures, cancel and free
 * with an operation in flight. Every wait is bounded. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "http/server.h"
#include "proxy/tokenize.h"
#include "upstream/upstream.h"
#include "util/buf.h"

/* ------------------------------------------------------------------------------------------ */
/* Fixture: worker server + upstream client + tokenizer on one loop                            */

typedef enum { WK_OK, WK_HOLD, WK_500, WK_BAD } worker_mode;

static struct {
    uv_loop_t loop;
    kvr_http_server *srv;
    int srv_closed;
    char url[64];
    kvr_upstream *up;
    kvr_tokenizer *tok;
    /* worker side */
    worker_mode mode;
    const char *reply; /* WK_OK body */
    kvr_buf big;       /* WK_OK body when reply is NULL */
    int nreq, gone; /* requests seen; held ones whose client left */
    char body[8192], path[64], ctype[64], auth[128];
    /* client side */
    int ncb;
    kvr_tokenize_source src;
    uint32_t ids[16];
    size_t n;
    uint64_t cb_ms;
} F;

static void held_gone(void *ud)
{
    F.gone++;
    kvr_http_resp_abort(ud);
}

static void handler(kvr_http_req *req, void *ud)
{
    (void)ud;
    size_t len;
    const char *b = kvr_http_req_body(req, &len);
    const char *ct = kvr_http_req_header(req, "content-type");
    const char *au = kvr_http_req_header(req, "authorization");
    F.nreq++;
    snprintf(F.body, sizeof(F.body), "%.*s", (int)len, b);
    snprintf(F.path, sizeof(F.path), "%s %s", kvr_http_req_method(req), kvr_http_req_path(req));
    snprintf(F.ctype, sizeof(F.ctype), "%s", ct ? ct : "");
    snprintf(F.auth, sizeof(F.auth), "%s", au ? au : "");
    switch (F.mode) {
    case WK_OK:
        kvr_http_resp_simple(req, 200, "application/json", NULL, 0, F.reply ? F.reply : F.big.data,
                             F.reply ? strlen(F.reply) : F.big.len);
        break;
    case WK_HOLD: { /* never answers: the client's deadline or departure ends it */
        kvr_http_req_cbs cbs = {NULL, held_gone};
        kvr_http_req_set_cbs(req, &cbs, req);
        break;
    }
    case WK_500:
        kvr_http_resp_simple(req, 500, "application/json", NULL, 0, "{\"error\":1}", 11);
        break;
    case WK_BAD:
        kvr_http_resp_simple(req, 200, "application/json", NULL, 0, "{\"tokens\":[1,2", 14);
        break;
    }
}

static int setup(void **state)
{
    (void)state;
    memset(&F, 0, sizeof(F));
    if (uv_loop_init(&F.loop))
        return -1;
    kvr_http_limits lim;
    kvr_http_limits_default(&lim);
    F.srv = kvr_http_server_new(&F.loop, &lim, handler, NULL);
    if (kvr_http_server_listen(F.srv, "127.0.0.1", 0))
        return -1;
    snprintf(F.url, sizeof(F.url), "http://127.0.0.1:%d/", kvr_http_server_port(F.srv));
    F.up = kvr_upstream_new(&F.loop, NULL);
    kvr_tokenize_cfg cfg = {.timeout_ms = 2000, .cache_entries = 16};
    F.tok = kvr_tokenizer_new(F.up, &cfg);
    F.reply = "{\"count\":3,\"max_model_len\":4096,\"tokens\":[11,22,33]}";
    return 0;
}

static void srv_closed(void *ud)
{
    (void)ud;
    F.srv_closed = 1;
}

static int teardown(void **state)
{
    (void)state;
    kvr_tokenizer_free(F.tok);
    kvr_upstream_close(F.up);
    kvr_http_server_close(F.srv, srv_closed, NULL);
    /* Bounded: a handle left open fails uv_loop_close instead of hanging the suite. */
    uint64_t deadline = uv_now(&F.loop) + 5000;
    while (uv_run(&F.loop, UV_RUN_NOWAIT) && uv_now(&F.loop) < deadline)
        usleep(1000), uv_update_time(&F.loop);
    kvr_buf_free(&F.big);
    return !F.srv_closed || uv_loop_close(&F.loop);
}

static void expired(uv_timer_t *t)
{
    *(int *)t->data = 1;
}

/* Runs the loop until *flag >= want or ms pass; returns 1 when reached. */
static int run_until(const int *flag, int want, uint64_t ms)
{
    int late = 0;
    uv_timer_t guard;
    uv_timer_init(&F.loop, &guard);
    guard.data = &late;
    uv_timer_start(&guard, expired, ms, 0);
    while (*flag < want && !late)
        uv_run(&F.loop, UV_RUN_ONCE);
    uv_close((uv_handle_t *)&guard, NULL);
    uv_run(&F.loop, UV_RUN_NOWAIT);
    return *flag >= want;
}

static void on_ids(void *ud, const uint32_t *ids, size_t n, kvr_tokenize_source src)
{
    (void)ud;
    F.ncb++;
    F.src = src;
    F.n = n;
    F.cb_ms = uv_now(&F.loop);
    assert_true(n == 0 || ids != NULL);
    assert_true(n > 0 || ids == NULL);
    for (size_t i = 0; i < n && i < 16; i++)
        F.ids[i] = ids[i];
}

static kvr_tokenize_req chat_req(const char *body, const char *key)
{
    return (kvr_tokenize_req){.chat = 1, .body = body, .body_len = strlen(body),
                              .cache_key = key, .cache_key_len = key ? strlen(key) : 0,
                              .worker_url = F.url, .model = "m1"};
}

/* Asks and waits for the answer; returns the source. */
static kvr_tokenize_source ask(const kvr_tokenize_req *r)
{
    int before = F.ncb;
    kvr_tokenize(F.tok, r, on_ids, NULL);
    assert_true(run_until(&F.ncb, before + 1, 5000));
    assert_int_equal(F.ncb, before + 1);
    return F.src;
}

/* ------------------------------------------------------------------------------------------ */
/* Parser and synchronous sources                                                              */

static void test_parse_ids(void **state)
{
    (void)state;
    uint32_t out[4];
#define P(s, max) kvr_tokenize_parse_ids(s, strlen(s), out, max)
    assert_int_equal(P("1,22,333", 4), 3);
    assert_int_equal(out[0], 1);
    assert_int_equal(out[1], 22);
    assert_int_equal(out[2], 333);
    assert_int_equal(P(" 7 ,\t8 , 9 ", 4), 3);
    assert_int_equal(out[2], 9);
    assert_int_equal(P("4294967295", 4), 1);
    assert_int_equal(out[0], 4294967295u);
    assert_int_equal(P("0", 4), 1);
    /* more ids than room: the count is the full count, only `max` are stored */
    out[2] = 777;
    assert_int_equal(P("5,6,7,8,9", 2), 5);
    assert_int_equal(out[0], 5);
    assert_int_equal(out[1], 6);
    assert_int_equal(out[2], 777);
    assert_int_equal(kvr_tokenize_parse_ids("1,2", 3, NULL, 0), 2);
    /* malformed */
    assert_int_equal(P("", 4), -1);
    assert_int_equal(P("   ", 4), -1);
    assert_int_equal(P("1,,2", 4), -1);
    assert_int_equal(P("1,2,", 4), -1);
    assert_int_equal(P(",1", 4), -1);
    assert_int_equal(P("1 2", 4), -1);
    assert_int_equal(P("-1", 4), -1);
    assert_int_equal(P("+1", 4), -1);
    assert_int_equal(P("0x10", 4), -1);
    assert_int_equal(P("12a", 4), -1);
    assert_int_equal(P("4294967296", 4), -1);
    assert_int_equal(P("1,99999999999999999999999", 4), -1);
    /* the length bounds the parse: bytes after it are not read */
    assert_int_equal(kvr_tokenize_parse_ids("12,34junk", 5, out, 4), 2);
    assert_int_equal(out[1], 34);
#undef P
}

static void test_source_names(void **state)
{
    (void)state;
    assert_string_equal(kvr_tokenize_source_name(KVR_TOK_HEADER), "header");
    assert_string_equal(kvr_tokenize_source_name(KVR_TOK_PROMPT), "prompt_ids");
    assert_string_equal(kvr_tokenize_source_name(KVR_TOK_CACHE), "cache");
    assert_string_equal(kvr_tokenize_source_name(KVR_TOK_WORKER), "worker");
    assert_string_equal(kvr_tokenize_source_name(KVR_TOK_TIMEOUT), "timeout");
    assert_string_equal(kvr_tokenize_source_name(KVR_TOK_FAILED), "failed");
    assert_string_equal(kvr_tokenize_source_name(KVR_TOK_NONE), "none");
}

/* Answers known at once: the callback runs inside kvr_tokenize, which returns NULL, and no
 * worker is asked. */
static void sync_case(const kvr_tokenize_req *r, kvr_tokenize_source want, size_t n)
{
    int before = F.ncb;
    assert_null(kvr_tokenize(F.tok, r, on_ids, NULL));
    assert_int_equal(F.ncb, before + 1);
    assert_int_equal(F.src, want);
    assert_int_equal(F.n, n);
}

static void test_sync_sources(void **state)
{
    (void)state;
    const char *chat = "{\"model\":\"x\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
    kvr_tokenize_req r = chat_req(chat, "k");
    r.header_ids = "5, 6 ,7";
    r.header_len = strlen(r.header_ids);
    sync_case(&r, KVR_TOK_HEADER, 3);
    assert_int_equal(F.ids[0], 5);
    assert_int_equal(F.ids[2], 7);
    r.header_ids = "5,x";
    r.header_len = 3;
    sync_case(&r, KVR_TOK_FAILED, 0); /* a bad header is not silently replaced */
    r.header_ids = "";
    r.header_len = 0;
    sync_case(&r, KVR_TOK_FAILED, 0);

    const char *ids = "{\"model\":\"x\",\"prompt\":[1, 2,3 ,4294967295]}";
    kvr_tokenize_req c = {.chat = 0, .body = ids, .body_len = strlen(ids),
                          .worker_url = F.url, .model = "m1"};
    sync_case(&c, KVR_TOK_PROMPT, 4);
    assert_int_equal(F.ids[1], 2);
    assert_int_equal(F.ids[3], 4294967295u);
    const char *batches[] = {"{\"prompt\":[[1,2],[3]]}", "{\"prompt\":[1,[2]]}",
                             "{\"prompt\":[\"a\",\"b\"]}", "{\"prompt\":[]}",
                             "{\"prompt\":[1,-2]}", "{\"prompt\":[4294967296]}",
                             "{\"prompt\":[1.5]}", "{\"prompt\":7}", "{\"model\":\"x\"}",
                             "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"};
    for (size_t i = 0; i < sizeof(batches) / sizeof(*batches); i++) {
        c.body = batches[i];
        c.body_len = strlen(batches[i]);
        sync_case(&c, KVR_TOK_NONE, 0);
    }
    /* chat without messages (a completions-style body sent as chat) */
    kvr_tokenize_req n = chat_req("{\"model\":\"x\",\"prompt\":\"hi\"}", "k");
    sync_case(&n, KVR_TOK_NONE, 0);
    n = chat_req("{}", NULL);
    sync_case(&n, KVR_TOK_NONE, 0);
    /* something to tokenize but no worker to ask */
    r = chat_req(chat, NULL);
    r.worker_url = NULL;
    sync_case(&r, KVR_TOK_NONE, 0);
    /* a URL the client cannot use */
    r.worker_url = "ftp://127.0.0.1:1";
    sync_case(&r, KVR_TOK_FAILED, 0);

    assert_int_equal(F.nreq, 0);
    kvr_tokenize_stats st;
    kvr_tokenize_stats_get(F.tok, &st);
    assert_int_equal(st.by_source[KVR_TOK_HEADER], 1);
    assert_int_equal(st.by_source[KVR_TOK_PROMPT], 1);
    assert_int_equal(st.by_source[KVR_TOK_FAILED], 3);
    assert_int_equal(st.by_source[KVR_TOK_NONE], 13);
    assert_int_equal(st.cache_entries, 0);
}

/* ------------------------------------------------------------------------------------------ */
/* /tokenize on a worker                                                                       */

static void test_worker_chat_and_cache(void **state)
{
    (void)state;
    /* odd spacing and escapes: the worker must see the client's bytes, not a re-encoding */
    const char *msgs = "[ {\"role\": \"system\",\"content\":\"caf\\u00e9 \\/ x\"},"
                       "{\"role\":\"user\" , \"content\": [{\"type\":\"text\",\"text\":\"hi\"}]} ]";
    const char *tools = "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}]";
    char body[1024];
    snprintf(body, sizeof(body),
             "{\"model\":\"client-name\",\"stream\":true,\"tools\": %s,\"messages\" : %s,"
             "\"chat_template_kwargs\":{\"enable_thinking\": false}}",
             tools, msgs);
    kvr_tokenize_req r = chat_req(body, "routing text 1");
    r.api_key = "sk-w";

    kvr_tokenize_op *op = kvr_tokenize(F.tok, &r, on_ids, NULL);
    assert_non_null(op);
    assert_int_equal(F.ncb, 0); /* never before kvr_tokenize returns on this path */
    assert_true(run_until(&F.ncb, 1, 5000));
    assert_int_equal(F.src, KVR_TOK_WORKER);
    assert_int_equal(F.n, 3);
    assert_int_equal(F.ids[0], 11);
    assert_int_equal(F.ids[2], 33);

    assert_int_equal(F.nreq, 1);
    assert_string_equal(F.path, "POST /tokenize");
    assert_string_equal(F.ctype, "application/json");
    assert_string_equal(F.auth, "Bearer sk-w");
    assert_non_null(strstr(F.body, msgs));
    assert_non_null(strstr(F.body, tools));
    assert_non_null(strstr(F.body, "{\"enable_thinking\": false}"));
    json_error_t err;
    json_t *j = json_loads(F.body, 0, &err);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "model")), "m1");
    assert_true(json_is_true(json_object_get(j, "add_generation_prompt")));
    assert_int_equal(json_array_size(json_object_get(j, "messages")), 2);
    assert_null(json_object_get(j, "stream")); /* only what shapes the prompt */
    assert_int_equal(json_object_size(j), 5);
    json_decref(j);

    /* the same routing text again: from the cache, no request */
    assert_null(kvr_tokenize(F.tok, &r, on_ids, NULL));
    assert_int_equal(F.ncb, 2);
    assert_int_equal(F.src, KVR_TOK_CACHE);
    assert_int_equal(F.n, 3);
    assert_int_equal(F.ids[1], 22);
    assert_true(!run_until(&F.nreq, 2, 50));

    /* another model or another form of the same text is not the same prompt */
    r.model = "m2";
    assert_int_equal(ask(&r), KVR_TOK_WORKER);
    assert_int_equal(F.nreq, 2);
    /* a client that sets add_generation_prompt itself: its value, not ours */
    snprintf(body, sizeof(body), "{\"messages\":%s,\"add_generation_prompt\":false}", msgs);
    r = chat_req(body, "routing text 1");
    assert_int_equal(ask(&r), KVR_TOK_WORKER);
    j = json_loads(F.body, 0, &err);
    assert_true(json_is_false(json_object_get(j, "add_generation_prompt")));
    assert_null(json_object_get(j, "tools"));
    assert_string_equal(F.auth, "");
    json_decref(j);

    kvr_tokenize_stats st;
    kvr_tokenize_stats_get(F.tok, &st);
    assert_int_equal(st.by_source[KVR_TOK_WORKER], 3);
    assert_int_equal(st.by_source[KVR_TOK_CACHE], 1);
    assert_int_equal(st.cache_entries, 3);
    assert_true(st.cache_bytes >= 3 * 3 * sizeof(uint32_t));
}

static void test_worker_completion_form(void **state)
{
    (void)state;
    const char *body = "{\"model\":\"c\",\"prompt\":\"Once upon \\\"a\\\" time\",\"max_tokens\":5}";
    kvr_tokenize_req r = {.chat = 0, .body = body, .body_len = strlen(body),
                          .worker_url = F.url, .model = "m\"q"};
    assert_int_equal(ask(&r), KVR_TOK_WORKER);
    assert_int_equal(F.n, 3);
    assert_string_equal(F.body, "{\"model\":\"m\\\"q\",\"prompt\":\"Once upon \\\"a\\\" time\"}");
    /* no cache key: nothing cached, the worker is asked again */
    assert_int_equal(ask(&r), KVR_TOK_WORKER);
    assert_int_equal(F.nreq, 2);
    /* a member that changes the rendering goes along as sent */
    body = "{\"prompt\":\"x\",\"add_special_tokens\" : false,\"echo\":true}";
    r.body = body;
    r.body_len = strlen(body);
    r.model = NULL;
    assert_int_equal(ask(&r), KVR_TOK_WORKER);
    assert_string_equal(F.body, "{\"model\":\"\",\"add_special_tokens\":false,\"prompt\":\"x\"}");
}

static void test_cache_lru(void **state)
{
    (void)state;
    kvr_tokenize_cfg cfg = {.timeout_ms = 2000, .cache_entries = 2};
    kvr_tokenizer_set_cfg(F.tok, &cfg);
    const char *body = "{\"messages\":[]}";
    kvr_tokenize_req a = chat_req(body, "A"), b = chat_req(body, "B"), c = chat_req(body, "C");
    assert_int_equal(ask(&a), KVR_TOK_WORKER);
    assert_int_equal(ask(&b), KVR_TOK_WORKER);
    assert_int_equal(ask(&a), KVR_TOK_CACHE); /* A is now the most recent */
    assert_int_equal(ask(&c), KVR_TOK_WORKER); /* evicts B */
    assert_int_equal(ask(&a), KVR_TOK_CACHE);
    assert_int_equal(ask(&c), KVR_TOK_CACHE);
    assert_int_equal(ask(&b), KVR_TOK_WORKER);
    assert_int_equal(F.nreq, 4);
    kvr_tokenize_stats st;
    kvr_tokenize_stats_get(F.tok, &st);
    assert_int_equal(st.cache_entries, 2);
    /* a smaller cache drops the oldest at once: B (newest) stays */
    cfg.cache_entries = 1;
    kvr_tokenizer_set_cfg(F.tok, &cfg);
    kvr_tokenize_stats_get(F.tok, &st);
    assert_int_equal(st.cache_entries, 1);
    assert_int_equal(ask(&b), KVR_TOK_CACHE);
    assert_int_equal(ask(&c), KVR_TOK_WORKER);
    /* 0 turns the cache off and empties it */
    cfg.cache_entries = 0;
    kvr_tokenizer_set_cfg(F.tok, &cfg);
    kvr_tokenize_stats_get(F.tok, &st);
    assert_int_equal(st.cache_entries, 0);
    assert_int_equal(ask(&c), KVR_TOK_WORKER);
    assert_int_equal(ask(&c), KVR_TOK_WORKER);
}

static void test_too_long_not_cached(void **state)
{
    (void)state;
    size_t n = KVR_TOKENIZE_MAX_IDS + 1;
    kvr_buf_init(&F.big, 0);
    kvr_buf_puts(&F.big, "{\"tokens\":[");
    for (size_t i = 0; i < n; i++)
        kvr_buf_printf(&F.big, "%s%zu", i ? "," : "", i % 100000);
    kvr_buf_puts(&F.big, "]}");
    F.reply = NULL;
    kvr_tokenize_req r = chat_req("{\"messages\":[]}", "long");
    assert_int_equal(ask(&r), KVR_TOK_WORKER);
    assert_int_equal(F.n, n); /* used */
    assert_int_equal(F.ids[5], 5);
    assert_int_equal(ask(&r), KVR_TOK_WORKER); /* not cached */
    kvr_tokenize_stats st;
    kvr_tokenize_stats_get(F.tok, &st);
    assert_int_equal(st.cache_entries, 0);
}

static void test_failures(void **state)
{
    (void)state;
    kvr_tokenize_req r = chat_req("{\"messages\":[]}", "f");
    F.mode = WK_500;
    assert_int_equal(ask(&r), KVR_TOK_FAILED);
    assert_int_equal(F.n, 0);
    F.mode = WK_BAD;
    assert_int_equal(ask(&r), KVR_TOK_FAILED);
    F.mode = WK_OK;
    const char *bad[] = {"{\"count\":1}", "{\"tokens\":[1,-1]}", "{\"tokens\":[1,\"2\"]}",
                         "{\"tokens\":[4294967296]}", "[1,2]", "", "{\"tokens\":{}}"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        F.reply = bad[i];
        assert_int_equal(ask(&r), KVR_TOK_FAILED);
    }
    /* a reply past the 8 MiB cap */
    F.reply = NULL;
    kvr_buf_init(&F.big, 0);
    kvr_buf_puts(&F.big, "{\"tokens\":[1],\"pad\":\"");
    for (int i = 0; i < 9 * 1024; i++)
        kvr_buf_printf(&F.big, "%01024d", 0);
    kvr_buf_puts(&F.big, "\"}");
    assert_int_equal(ask(&r), KVR_TOK_FAILED);
    /* nobody listening */
    r.worker_url = "http://127.0.0.1:1";
    assert_int_equal(ask(&r), KVR_TOK_FAILED);
    kvr_tokenize_stats st;
    kvr_tokenize_stats_get(F.tok, &st);
    assert_int_equal(st.cache_entries, 0);
    assert_int_equal(st.by_source[KVR_TOK_FAILED], 11);
}

static void test_timeout(void **state)
{
    (void)state;
    kvr_tokenize_cfg cfg = {.timeout_ms = 100, .cache_entries = 16};
    kvr_tokenizer_set_cfg(F.tok, &cfg);
    F.mode = WK_HOLD;
    kvr_tokenize_req r = chat_req("{\"messages\":[]}", "t");
    uint64_t t0 = uv_now(&F.loop);
    assert_int_equal(ask(&r), KVR_TOK_TIMEOUT);
    assert_int_equal(F.n, 0);
    uint64_t took = F.cb_ms - t0;
    assert_true(took >= 95 && took < 1500);
    /* the attempt was dropped: the worker sees the client leave */
    assert_true(run_until(&F.gone, 1, 5000));
    /* a late answer is not cached: a worker that answers now is asked */
    F.mode = WK_OK;
    assert_int_equal(ask(&r), KVR_TOK_WORKER);
}

static void test_cancel(void **state)
{
    (void)state;
    kvr_tokenize_req r = chat_req("{\"messages\":[]}", "c");
    /* cancelled before the request left */
    kvr_tokenize_op *op = kvr_tokenize(F.tok, &r, on_ids, NULL);
    assert_non_null(op);
    kvr_tokenize_cancel(op);
    /* cancelled while the worker holds it */
    F.mode = WK_HOLD;
    op = kvr_tokenize(F.tok, &r, on_ids, NULL);
    assert_true(run_until(&F.nreq, 1, 5000));
    kvr_tokenize_cancel(op);
    assert_true(run_until(&F.gone, 1, 5000));
    assert_true(!run_until(&F.ncb, 1, 300)); /* past the timeout: still no callback */
    assert_int_equal(F.nreq, 1);
    kvr_tokenize_cancel(NULL);
    kvr_tokenize_stats st;
    kvr_tokenize_stats_get(F.tok, &st);
    for (int s = 0; s < KVR_TOK_NSOURCES; s++)
        assert_int_equal(st.by_source[s], 0);
}

static int cancels_in_cb;
static void cancel_own(void *ud, const uint32_t *ids, size_t n, kvr_tokenize_source src)
{
    on_ids(ud, ids, n, src);
    kvr_tokenize_cancel(*(kvr_tokenize_op **)ud); /* already ended: a no-op */
    cancels_in_cb++;
}

static void test_cancel_inside_callback(void **state)
{
    (void)state;
    kvr_tokenize_req r = chat_req("{\"messages\":[]}", NULL);
    kvr_tokenize_op *op = NULL;
    op = kvr_tokenize(F.tok, &r, cancel_own, &op);
    assert_non_null(op);
    assert_true(run_until(&F.ncb, 1, 5000));
    assert_int_equal(cancels_in_cb, 1);
    assert_int_equal(F.src, KVR_TOK_WORKER);
}

static void test_free_in_flight(void **state)
{
    (void)state;
    F.mode = WK_HOLD;
    kvr_tokenize_req r = chat_req("{\"messages\":[]}", "x");
    for (int i = 0; i < 3; i++)
        assert_non_null(kvr_tokenize(F.tok, &r, on_ids, NULL));
    assert_true(run_until(&F.nreq, 3, 5000));
    F.mode = WK_OK;
    kvr_tokenize_req done = chat_req("{\"messages\":[]}", "cached");
    assert_int_equal(ask(&done), KVR_TOK_WORKER);
    int before = F.ncb;
    kvr_tokenizer_free(F.tok); /* 3 ops in flight, 1 cache entry */
    F.tok = NULL;
    assert_true(run_until(&F.gone, 3, 5000));
    assert_int_equal(F.ncb, before);
    kvr_tokenizer_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_ids),
        cmocka_unit_test(test_source_names),
        cmocka_unit_test_setup_teardown(test_sync_sources, setup, teardown),
        cmocka_unit_test_setup_teardown(test_worker_chat_and_cache, setup, teardown),
        cmocka_unit_test_setup_teardown(test_worker_completion_form, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cache_lru, setup, teardown),
        cmocka_unit_test_setup_teardown(test_too_long_not_cached, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failures, setup, teardown),
        cmocka_unit_test_setup_teardown(test_timeout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cancel, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cancel_inside_callback, setup, teardown),
        cmocka_unit_test_setup_teardown(test_free_in_flight, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
