/* Routing keys: session key rules and the routing text's prefix property on real traces.
 * Data is found under $KVROUTE_DATA (default "data", tests run from the repo root) and, for the
 * not-shipped ShareGPT sample, $KVROUTE_SHARED_DATA (default "../shared/data"). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cmocka.h>
#include <jansson.h>

#include "routing/keys.h"

/* ---- helpers -------------------------------------------------------------------------- */

typedef struct hdrs {
    const char *const *kv; /* name, value, name, value, ..., NULL */
} hdrs;

static const char *get_hdr(void *ctx, const char *name, size_t *len)
{
    const hdrs *h = ctx;
    for (const char *const *p = h->kv; p && *p; p += 2)
        if (strcasecmp(p[0], name) == 0) {
            *len = strlen(p[1]);
            return p[1];
        }
    return NULL;
}

static json_t *parse(const char *s)
{
    json_error_t e;
    json_t *j = json_loads(s, 0, &e);
    if (!j)
        fail_msg("bad test JSON: %s: %s", e.text, s);
    return j;
}

/* Routing text of a JSON body given as text; caller frees the returned string (len in *n). */
static char *text_of(const char *body, kvr_route_kind kind, size_t *n)
{
    json_t *j = parse(body);
    kvr_buf b;
    kvr_buf_init(&b, 0);
    assert_true(kvr_route_text_build(j, kind, &b) >= 0);
    json_decref(j);
    *n = b.len;
    char *r = malloc(b.len + 1);
    memcpy(r, b.data ? b.data : "", b.len);
    r[b.len] = 0;
    kvr_buf_free(&b);
    return r;
}

static void assert_same_text(const char *a, const char *b, kvr_route_kind kind)
{
    size_t na, nb;
    char *ta = text_of(a, kind, &na), *tb = text_of(b, kind, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(ta, tb, na);
    free(ta);
    free(tb);
}

static void assert_diff_text(const char *a, const char *b, kvr_route_kind kind)
{
    size_t na, nb;
    char *ta = text_of(a, kind, &na), *tb = text_of(b, kind, &nb);
    assert_false(na == nb && memcmp(ta, tb, na) == 0);
    free(ta);
    free(tb);
}

static int is_prefix(const char *a, size_t na, const char *b, size_t nb)
{
    return na <= nb && memcmp(a, b, na) == 0;
}

/* Session key of a body + headers; returns 1/0 as kvr_session_key_build, key copied to out. */
static int session_of(const char *body, const char *const *kv, const char *spec, char *out,
                      size_t outsz)
{
    json_t *j = body ? parse(body) : NULL;
    kvr_session_sources src;
    if (spec)
        assert_int_equal(kvr_session_sources_parse(&src, spec, NULL, 0), 0);
    else
        kvr_session_sources_default(&src);
    hdrs h = {kv};
    kvr_buf b;
    kvr_buf_init(&b, 0);
    int rc = kvr_session_key_build(j, get_hdr, &h, &src, &b);
    assert_true(rc >= 0);
    assert_true(b.len < outsz);
    memcpy(out, b.data ? b.data : "", b.len);
    out[b.len] = 0;
    assert_int_equal(rc, b.len > 0);
    kvr_buf_free(&b);
    json_decref(j);
    return rc;
}

/* ---- trace replay: prefix property ----------------------------------------------------- */

static const char *data_dir(void)
{
    const char *d = getenv("KVROUTE_DATA");
    return d && *d ? d : "data";
}

static const char *shared_data_dir(void)
{
    const char *d = getenv("KVROUTE_SHARED_DATA");
    return d && *d ? d : "../shared/data";
}

typedef struct replay_counts {
    size_t conversations;
    size_t requests;
    size_t text_bytes;
} replay_counts;

/* Builds the routing text of `msgs` (a chat body with these messages) in two spellings of the
 * client's JSON (non-ASCII raw and \u-escaped) and checks they agree. Returns the text. */
static kvr_buf chat_text(json_t *msgs, int check_escaped)
{
    json_t *body = json_pack("{s:s, s:O}", "model", "m", "messages", msgs);
    kvr_buf t;
    kvr_buf_init(&t, 0);
    assert_int_equal(kvr_route_text_build(body, KVR_ROUTE_CHAT, &t), 0);
    if (check_escaped) {
        /* What two different clients would send for the same request. */
        char *raw = json_dumps(body, JSON_COMPACT);
        char *esc = json_dumps(body, JSON_ENSURE_ASCII | JSON_ESCAPE_SLASH | JSON_INDENT(1));
        json_t *jr = parse(raw), *je = parse(esc);
        kvr_buf a, b;
        kvr_buf_init(&a, 0);
        kvr_buf_init(&b, 0);
        kvr_route_text_build(jr, KVR_ROUTE_CHAT, &a);
        kvr_route_text_build(je, KVR_ROUTE_CHAT, &b);
        assert_int_equal(a.len, t.len);
        assert_int_equal(b.len, t.len);
        assert_memory_equal(a.data, t.data, t.len);
        assert_memory_equal(b.data, t.data, t.len);
        kvr_buf_free(&a);
        kvr_buf_free(&b);
        json_decref(jr);
        json_decref(je);
        free(raw);
        free(esc);
    }
    json_decref(body);
    return t;
}

/* One conversation: a request before every assistant turn (`is_request(m)` says which messages
 * are answered turns), plus the whole conversation; each text must be a byte prefix of the
 * next, and strictly shorter. */
static void replay_conversation(json_t *msgs, int (*is_turn)(const json_t *m), int check_escaped,
                                replay_counts *c)
{
    kvr_buf prev;
    kvr_buf_init(&prev, 0);
    int have_prev = 0;
    size_t n = json_array_size(msgs);
    for (size_t t = 1; t <= n; t++) {
        if (t < n && !is_turn(json_array_get(msgs, t)))
            continue;
        json_t *slice = json_array();
        for (size_t i = 0; i < t; i++)
            json_array_append(slice, json_array_get(msgs, i));
        kvr_buf cur = chat_text(slice, check_escaped);
        json_decref(slice);
        assert_true(cur.len > 0);
        if (have_prev) {
            if (!is_prefix(prev.data, prev.len, cur.data, cur.len))
                fail_msg("turn text (%zu bytes) is not a prefix of the next (%zu bytes)",
                         prev.len, cur.len);
            assert_true(cur.len > prev.len);
        }
        if (t < n) {
            c->requests++;
            c->text_bytes += cur.len;
        }
        kvr_buf_free(&prev);
        prev = cur;
        have_prev = 1;
    }
    kvr_buf_free(&prev);
    c->conversations++;
}

static int is_assistant(const json_t *m)
{
    const char *r = json_string_value(json_object_get(m, "role"));
    return r && strcmp(r, "assistant") == 0;
}

static int is_real_assistant(const json_t *m)
{
    return is_assistant(m) && !json_is_true(json_object_get(m, "is_demo"));
}

/* Calls fn on every JSON line of `path`; returns lines read, or -1 if the file is missing. */
static long each_line(const char *path, void (*fn)(json_t *, void *), void *ud)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char *line = NULL;
    size_t cap = 0;
    long n = 0;
    while (getline(&line, &cap, f) > 0) {
        json_error_t e;
        json_t *j = json_loads(line, 0, &e);
        if (!j)
            fail_msg("%s:%ld: %s", path, n + 1, e.text);
        fn(j, ud);
        json_decref(j);
        n++;
    }
    free(line);
    fclose(f);
    return n;
}

static void tau_line(json_t *j, void *ud)
{
    replay_conversation(json_object_get(j, "messages"), is_assistant, 1, ud);
}

static void swe_line(json_t *j, void *ud)
{
    replay_conversation(json_object_get(j, "messages"), is_real_assistant, 1, ud);
}

static void sharegpt_line(json_t *j, void *ud)
{
    json_t *msgs = json_array();
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(j, "conversations"), i, m) {
        const char *from = json_string_value(json_object_get(m, "from"));
        const char *role = from && !strcmp(from, "gpt") ? "assistant" : "user";
        json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", role, "content",
                                              json_object_get(m, "value")));
    }
    replay_conversation(msgs, is_assistant, 0, ud);
    json_decref(msgs);
}

static void test_prefix_tau_bench(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof(path), "%s/tau-bench-airline-gpt4o/trajectories.jsonl", data_dir());
    replay_counts c = {0};
    long n = each_line(path, tau_line, &c);
    if (n < 0)
        fail_msg("missing %s (set KVROUTE_DATA)", path);
    /* SOURCE.md: 140 conversations, 2,023 assistant turns = requests. */
    assert_int_equal(c.conversations, 140);
    assert_int_equal(c.requests, 2023);
    print_message("tau-bench: %zu conversations, %zu requests, %zu text bytes\n",
                  c.conversations, c.requests, c.text_bytes);
}

static void test_prefix_swe_agent(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof(path), "%s/swe-agent-trajectories/trajectories.jsonl", data_dir());
    replay_counts c = {0};
    long n = each_line(path, swe_line, &c);
    if (n < 0)
        fail_msg("missing %s (set KVROUTE_DATA)", path);
    /* SOURCE.md: 16 trajectories, 142 non-demo assistant turns = requests. */
    assert_int_equal(c.conversations, 16);
    assert_int_equal(c.requests, 142);
    print_message("swe-agent: %zu conversations, %zu requests, %zu text bytes\n",
                  c.conversations, c.requests, c.text_bytes);
}

static void test_prefix_sharegpt(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof(path), "%s/sharegpt-multiturn-sample/conversations.jsonl",
             shared_data_dir());
    replay_counts c = {0};
    long n = each_line(path, sharegpt_line, &c);
    if (n < 0) {
        print_message("skipped: %s absent (not shipped: licence unclear)\n", path);
        skip();
    }
    assert_int_equal(c.conversations, 275);
    print_message("sharegpt: %zu conversations, %zu requests, %zu text bytes\n",
                  c.conversations, c.requests, c.text_bytes);
}

/* ---- chat text rules ------------------------------------------------------------------- */

static void test_escaped_and_raw_same(void **state)
{
    (void)state;
    assert_same_text("{\"messages\":[{\"role\":\"user\",\"content\":\"caf\\u00e9 \\/ \\u4e2d\"}]}",
                     "{\"messages\":[{\"role\":\"user\",\"content\":\"café / 中\"}]}",
                     KVR_ROUTE_CHAT);
    assert_same_text("{\"prompt\":\"\\u0041BC\"}", "{\"prompt\":\"ABC\"}",
                     KVR_ROUTE_COMPLETIONS);
    /* Canonical JSON of tool parameters: key order and spelling do not matter. */
    assert_same_text(
        "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
        "{\"type\":\"object\",\"properties\":{\"\\u0061\":{\"type\":\"string\"}}}}}]}",
        "{\"tools\":[{\"function\":{\"parameters\":{\"properties\":{\"a\":{\"type\":\"string\"}},"
        "\"type\":\"object\"},\"name\":\"f\"},\"type\":\"function\"}]}",
        KVR_ROUTE_CHAT);
    char a[300], b[300];
    session_of("{\"user\":\"\\u00e9l\\u00e8ve\"}", NULL, NULL, a, sizeof(a));
    session_of("{\"user\":\"élève\"}", NULL, NULL, b, sizeof(b));
    assert_string_equal(a, b);
}

static void test_chat_content_forms(void **state)
{
    (void)state;
    /* A string and a single text part render the same in the engine, and here. */
    assert_same_text("{\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}]}",
                     "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
                     "\"text\":\"hello\"}]}]}",
                     KVR_ROUTE_CHAT);
    /* Absent, null and "" content are the same. */
    assert_same_text("{\"messages\":[{\"role\":\"assistant\",\"content\":null}]}",
                     "{\"messages\":[{\"role\":\"assistant\"}]}", KVR_ROUTE_CHAT);
    assert_same_text("{\"messages\":[{\"role\":\"assistant\",\"content\":\"\"}]}",
                     "{\"messages\":[{\"role\":\"assistant\"}]}", KVR_ROUTE_CHAT);
    /* Roles, names, tool calls and tool results all count. */
    assert_diff_text("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
                     "{\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]}", KVR_ROUTE_CHAT);
    assert_diff_text("{\"messages\":[{\"role\":\"user\",\"name\":\"a\",\"content\":\"x\"}]}",
                     "{\"messages\":[{\"role\":\"user\",\"name\":\"b\",\"content\":\"x\"}]}",
                     KVR_ROUTE_CHAT);
    assert_diff_text(
        "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"1\",\"type\":\"function\","
        "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}}]}]}",
        "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"1\",\"type\":\"function\","
        "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":2}\"}}]}]}",
        KVR_ROUTE_CHAT);
    assert_diff_text("{\"messages\":[{\"role\":\"tool\",\"tool_call_id\":\"a\",\"content\":\"x\"}]}",
                     "{\"messages\":[{\"role\":\"tool\",\"tool_call_id\":\"b\",\"content\":\"x\"}]}",
                     KVR_ROUTE_CHAT);
    /* Text stays readable: the content bytes appear as sent, in order. */
    size_t n;
    char *t = text_of("{\"messages\":[{\"role\":\"system\",\"content\":\"You are helpful.\"},"
                      "{\"role\":\"user\",\"content\":\"Hi there\"}]}",
                      KVR_ROUTE_CHAT, &n);
    char *s1 = memmem(t, n, "You are helpful.", 16), *s2 = memmem(t, n, "Hi there", 8);
    assert_non_null(s1);
    assert_non_null(s2);
    assert_true(s1 < s2);
    /* The text ends with the last message's terminator, nothing after. */
    assert_int_equal(t[n - 1], '\x1d');
    free(t);
}

static void test_nontext_parts_digest(void **state)
{
    (void)state;
    const char *img1 = "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":"
                       "\"what is this\"},{\"type\":\"image_url\",\"image_url\":{\"url\":"
                       "\"data:image/png;base64,AAAA\"}}]}]}";
    const char *img1b = "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":"
                        "\"what is this\"},{\"image_url\":{\"url\":\"data:image\\/png;base64,AAAA\"},"
                        "\"type\":\"image_url\"}]}]}";
    const char *img2 = "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":"
                       "\"what is this\"},{\"type\":\"image_url\",\"image_url\":{\"url\":"
                       "\"data:image/png;base64,BBBB\"}}]}]}";
    assert_same_text(img1, img1b, KVR_ROUTE_CHAT);
    assert_diff_text(img1, img2, KVR_ROUTE_CHAT);
    size_t n;
    char *t = text_of(img1, KVR_ROUTE_CHAT, &n);
    assert_null(memmem(t, n, "AAAA", 4));          /* the image bytes are not in the text */
    assert_non_null(memmem(t, n, "what is this", 12));
    free(t);
    /* Audio and files too. */
    assert_diff_text("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_audio\","
                     "\"input_audio\":{\"data\":\"AA\",\"format\":\"wav\"}}]}]}",
                     "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_audio\","
                     "\"input_audio\":{\"data\":\"AB\",\"format\":\"wav\"}}]}]}",
                     KVR_ROUTE_CHAT);
    assert_diff_text("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"file\","
                     "\"file\":{\"file_id\":\"f1\"}}]}]}",
                     "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"file\","
                     "\"file\":{\"file_id\":\"f2\"}}]}]}",
                     KVR_ROUTE_CHAT);
}

static void test_tools_sorted(void **state)
{
    (void)state;
    const char *ab = "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"alpha\","
                     "\"description\":\"A\",\"parameters\":{\"type\":\"object\"}}},"
                     "{\"type\":\"function\",\"function\":{\"name\":\"beta\",\"description\":\"B\","
                     "\"parameters\":{\"type\":\"object\"}}}],"
                     "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
    const char *ba = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                     "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"beta\","
                     "\"description\":\"B\",\"parameters\":{\"type\":\"object\"}}},"
                     "{\"type\":\"function\",\"function\":{\"name\":\"alpha\",\"description\":\"A\","
                     "\"parameters\":{\"type\":\"object\"}}}]}";
    assert_same_text(ab, ba, KVR_ROUTE_CHAT);
    size_t n;
    char *t = text_of(ab, KVR_ROUTE_CHAT, &n);
    char *a = memmem(t, n, "alpha", 5), *b = memmem(t, n, "beta", 4), *h = memmem(t, n, "hi", 2);
    assert_true(a && b && h && a < b && b < h); /* sorted, and before the messages */
    free(t);
    /* Descriptions and parameters count. */
    assert_diff_text("{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
                     "\"parameters\":{\"type\":\"object\"}}}]}",
                     "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
                     "\"parameters\":{\"type\":\"string\"}}}]}",
                     KVR_ROUTE_CHAT);
}

/* ---- completions ---------------------------------------------------------------------- */

static void test_completions_forms(void **state)
{
    (void)state;
    size_t n;
    char *t = text_of("{\"prompt\":\"Once upon a time\"}", KVR_ROUTE_COMPLETIONS, &n);
    assert_int_equal(n, 16);
    assert_memory_equal(t, "Once upon a time", 16); /* a string prompt is its own bytes */
    free(t);
    /* A one-element batch is the element; a batch keeps every element, in order. */
    assert_same_text("{\"prompt\":[\"abc\"]}", "{\"prompt\":\"abc\"}", KVR_ROUTE_COMPLETIONS);
    t = text_of("{\"prompt\":[\"first prompt\",\"second prompt\"]}", KVR_ROUTE_COMPLETIONS, &n);
    assert_true(n > 24 && memcmp(t, "first prompt", 12) == 0);
    assert_non_null(memmem(t, n, "second prompt", 13));
    free(t);
    assert_diff_text("{\"prompt\":[\"a\",\"b\"]}", "{\"prompt\":[\"a\",\"c\"]}",
                     KVR_ROUTE_COMPLETIONS);
    /* Token ids as decimal ids, never a count. */
    t = text_of("{\"prompt\":[1,22,333]}", KVR_ROUTE_COMPLETIONS, &n);
    assert_non_null(memmem(t, n, "1 22 333 ", 9));
    free(t);
    assert_diff_text("{\"prompt\":[1,2,3]}", "{\"prompt\":[1,2,4]}", KVR_ROUTE_COMPLETIONS);
    size_t n1, n2, n3;
    char *t1 = text_of("{\"prompt\":[1,2]}", KVR_ROUTE_COMPLETIONS, &n1);
    char *t2 = text_of("{\"prompt\":[1,2,3]}", KVR_ROUTE_COMPLETIONS, &n2);
    char *t3 = text_of("{\"prompt\":[1,23]}", KVR_ROUTE_COMPLETIONS, &n3);
    assert_true(is_prefix(t1, n1, t2, n2));   /* growing token prompts keep the prefix */
    assert_false(is_prefix(t1, n1, t3, n3));  /* [1,2] is not a prefix of [1,23] */
    free(t1);
    free(t2);
    free(t3);
    /* Token prompts do not collide with the text of their digits. */
    assert_diff_text("{\"prompt\":[1,2]}", "{\"prompt\":\"1 2 \"}", KVR_ROUTE_COMPLETIONS);
    /* Batches of token arrays keep every id of every element. */
    t = text_of("{\"prompt\":[[1,2],[3,4]]}", KVR_ROUTE_COMPLETIONS, &n);
    assert_non_null(memmem(t, n, "1 2 ", 4));
    assert_non_null(memmem(t, n, "3 4 ", 4));
    free(t);
    assert_diff_text("{\"prompt\":[[1,2],[3,4]]}", "{\"prompt\":[[1,2],[3,5]]}",
                     KVR_ROUTE_COMPLETIONS);
    assert_same_text("{\"prompt\":[[7,8,9]]}", "{\"prompt\":[7,8,9]}", KVR_ROUTE_COMPLETIONS);
    /* Nothing to route on. */
    t = text_of("{\"prompt\":[]}", KVR_ROUTE_COMPLETIONS, &n);
    assert_int_equal(n, 0);
    free(t);
    t = text_of("{\"model\":\"m\"}", KVR_ROUTE_COMPLETIONS, &n);
    assert_int_equal(n, 0);
    free(t);
}

/* ---- responses ------------------------------------------------------------------------ */

static void test_responses(void **state)
{
    (void)state;
    /* A string input is a user message. */
    assert_same_text("{\"input\":\"hello\"}",
                     "{\"input\":[{\"role\":\"user\",\"content\":\"hello\"}]}",
                     KVR_ROUTE_RESPONSES);
    assert_same_text("{\"input\":[{\"type\":\"message\",\"role\":\"user\",\"content\":"
                     "[{\"type\":\"input_text\",\"text\":\"hello\"}]}]}",
                     "{\"input\":\"hello\"}", KVR_ROUTE_RESPONSES);
    /* Instructions, then tools, then input. */
    size_t n;
    char *t = text_of("{\"input\":\"question\",\"tools\":[{\"type\":\"function\",\"name\":"
                      "\"lookup\",\"parameters\":{}}],\"instructions\":\"be brief\"}",
                      KVR_ROUTE_RESPONSES, &n);
    char *i = memmem(t, n, "be brief", 8), *tl = memmem(t, n, "lookup", 6),
         *q = memmem(t, n, "question", 8);
    assert_true(i && tl && q && i < tl && tl < q);
    free(t);
    /* Growing item lists keep the prefix. */
    const char *turn1 = "{\"instructions\":\"sys\",\"input\":[{\"role\":\"user\",\"content\":\"q1\"}]}";
    const char *turn2 =
        "{\"instructions\":\"sys\",\"input\":[{\"role\":\"user\",\"content\":\"q1\"},"
        "{\"type\":\"message\",\"role\":\"assistant\",\"id\":\"msg_1\",\"content\":[{\"type\":"
        "\"output_text\",\"text\":\"a1\"}]},{\"type\":\"function_call\",\"call_id\":\"c1\","
        "\"name\":\"f\",\"arguments\":\"{}\"},{\"type\":\"function_call_output\",\"call_id\":"
        "\"c1\",\"output\":\"42\"},{\"type\":\"reasoning\",\"summary\":[]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"input_image\",\"image_url\":\"data:x\"}]}]}";
    size_t n1, n2;
    char *t1 = text_of(turn1, KVR_ROUTE_RESPONSES, &n1), *t2 = text_of(turn2, KVR_ROUTE_RESPONSES, &n2);
    assert_true(n2 > n1 && is_prefix(t1, n1, t2, n2));
    assert_non_null(memmem(t2, n2, "a1", 2));
    assert_non_null(memmem(t2, n2, "42", 2));
    free(t1);
    free(t2);
    /* previous_response_id and the id in the worker's answer. */
    json_t *b = parse("{\"previous_response_id\":\"resp_abc\",\"input\":\"x\"}");
    size_t len = 0;
    const char *id = kvr_route_previous_response_id(b, &len);
    assert_non_null(id);
    assert_int_equal(len, 8);
    assert_memory_equal(id, "resp_abc", 8);
    json_decref(b);
    b = parse("{\"previous_response_id\":\"\",\"input\":\"x\"}");
    assert_null(kvr_route_previous_response_id(b, &len));
    json_decref(b);
    b = parse("{\"id\":\"resp_1\",\"object\":\"response\",\"output\":[]}");
    id = kvr_route_response_id(b, &len);
    assert_true(id && len == 6 && !memcmp(id, "resp_1", 6));
    json_decref(b);
    b = parse("{\"type\":\"response.created\",\"response\":{\"id\":\"resp_2\",\"object\":"
              "\"response\"}}");
    id = kvr_route_response_id(b, &len);
    assert_true(id && len == 6 && !memcmp(id, "resp_2", 6));
    json_decref(b);
    b = parse("{\"type\":\"response.output_text.delta\",\"delta\":\"x\",\"item_id\":\"msg_1\"}");
    assert_null(kvr_route_response_id(b, &len));
    json_decref(b);
}

/* ---- session key ---------------------------------------------------------------------- */

static void test_session_sources_order(void **state)
{
    (void)state;
    char k[300];
    const char *h1[] = {"X-Session-Id", "hs", "x-user-id", "hu", NULL};
    assert_int_equal(session_of("{\"session_id\":\"bs\"}", h1, NULL, k, sizeof(k)), 1);
    assert_string_equal(k, "hs"); /* headers first, x-session-id before x-user-id */
    const char *h2[] = {"x-user-id", "hu", NULL};
    session_of("{\"session_params\":{\"session_id\":\"sp\"}}", h2, NULL, k, sizeof(k));
    assert_string_equal(k, "hu");
    session_of("{\"session_params\":{\"session_id\":\"sp\"},\"user\":\"u\"}", NULL, NULL, k,
               sizeof(k));
    assert_string_equal(k, "sp");
    session_of("{\"conversation_id\":\"c\",\"user\":\"u\"}", NULL, NULL, k, sizeof(k));
    assert_string_equal(k, "c");
    session_of("{\"user_id\":\"uid\"}", NULL, NULL, k, sizeof(k));
    assert_string_equal(k, "uid");
    /* Anthropic's metadata.user_id: after prompt_cache_key, before user. */
    session_of("{\"metadata\":{\"user_id\":\"mu\"},\"user\":\"u\"}", NULL, NULL, k, sizeof(k));
    assert_string_equal(k, "mu");
    session_of("{\"metadata\":{\"user_id\":\"mu\"},\"prompt_cache_key\":\"pk\"}", NULL, NULL,
               k, sizeof(k));
    assert_string_equal(k, "pk");
    const char *h6[] = {"x-claude-code-session-id", "cc", NULL};
    session_of("{\"metadata\":{\"user_id\":\"mu\"}}", h6, NULL, k, sizeof(k));
    assert_string_equal(k, "cc");
    /* Per-request ids are never session keys. */
    const char *h3[] = {"x-request-id", "r1", "x-trace-id", "t1", "x-correlation-id", "c1", NULL};
    assert_int_equal(session_of("{\"model\":\"m\"}", h3, NULL, k, sizeof(k)), 0);
    /* An empty value means no session: the next source decides. */
    const char *h4[] = {"x-session-id", "", NULL};
    session_of("{\"user\":\"u\"}", h4, NULL, k, sizeof(k));
    assert_string_equal(k, "u");
    assert_int_equal(session_of("{\"user\":\"\",\"session_id\":null}", NULL, NULL, k, sizeof(k)), 0);
    /* Header values are used as sent (no percent-decoding, no trimming). */
    const char *h5[] = {"x-session-id", "a%20b ", NULL};
    session_of(NULL, h5, NULL, k, sizeof(k));
    assert_string_equal(k, "a%20b ");
    /* session-1 and session-12 are different keys (equality, never prefixes). */
    char k2[300];
    session_of("{\"session_id\":\"session-1\"}", NULL, NULL, k, sizeof(k));
    session_of("{\"session_id\":\"session-12\"}", NULL, NULL, k2, sizeof(k2));
    assert_string_not_equal(k, k2);
}

static void test_session_values(void **state)
{
    (void)state;
    char k[300];
    /* Non-string body values count by their canonical JSON text. */
    session_of("{\"user\":42}", NULL, NULL, k, sizeof(k));
    assert_string_equal(k, "42");
    session_of("{\"session_id\":{\"b\":1,\"a\":[true,null]}}", NULL, NULL, k, sizeof(k));
    assert_string_equal(k, "{\"a\":[true,null],\"b\":1}");
    session_of("{\"session_id\":false}", NULL, NULL, k, sizeof(k));
    assert_string_equal(k, "false");
    /* Up to 256 bytes as is; longer ones become their 32-hex-digit XXH3-128 digest. */
    char body[700], id[600];
    memset(id, 'a', 256);
    id[256] = 0;
    snprintf(body, sizeof(body), "{\"session_id\":\"%s\"}", id);
    session_of(body, NULL, NULL, k, sizeof(k));
    assert_string_equal(k, id);
    memset(id, 'a', 500);
    id[500] = 0;
    snprintf(body, sizeof(body), "{\"session_id\":\"%s\"}", id);
    session_of(body, NULL, NULL, k, sizeof(k));
    assert_int_equal(strlen(k), 32);
    assert_int_equal(strspn(k, "0123456789abcdef"), 32);
    char k2[300];
    id[499] = 'b';
    snprintf(body, sizeof(body), "{\"session_id\":\"%s\"}", id);
    session_of(body, NULL, NULL, k2, sizeof(k2));
    assert_string_not_equal(k, k2); /* distinct long ids stay distinct */
    const char *h[] = {"x-session-id", id, NULL};
    char k3[300];
    session_of(NULL, h, NULL, k3, sizeof(k3));
    assert_string_equal(k2, k3);    /* same bytes from a header, same digest */
}

static void test_session_sources_config(void **state)
{
    (void)state;
    kvr_session_sources s;
    char err[200];
    assert_int_equal(kvr_session_sources_parse(&s, " header:X-Tenant , body:metadata.conv ", err,
                                               sizeof(err)),
                     0);
    assert_int_equal(s.n, 2);
    assert_true(s.src[0].header);
    assert_string_equal(s.src[0].name, "x-tenant");
    assert_false(s.src[1].header);
    assert_string_equal(s.src[1].name, "metadata.conv");
    char k[300];
    const char *h[] = {"x-session-id", "ignored", NULL};
    session_of("{\"metadata\":{\"conv\":\"c9\"}}", h, "header:x-tenant,body:metadata.conv", k,
               sizeof(k));
    assert_string_equal(k, "c9");
    assert_int_equal(kvr_session_sources_parse(&s, "header:x-request-id", err, sizeof(err)), -1);
    assert_non_null(strstr(err, "x-request-id"));
    assert_int_equal(kvr_session_sources_parse(&s, "header:X-Trace-Id", err, sizeof(err)), -1);
    assert_int_equal(kvr_session_sources_parse(&s, "cookie:x", err, sizeof(err)), -1);
    assert_int_equal(kvr_session_sources_parse(&s, "body:a..b", err, sizeof(err)), -1);
    kvr_session_sources_default(&s);
    assert_int_equal(s.n, 13);
}

/* ---- completion teaching -------------------------------------------------------------- */

/* Turn 1's text + its reply is exactly the head of turn 2's text, tool calls included; a
 * completions string prompt continues with the completion's bytes; token prompts do not. */
/* A reply of text alone is appended without a tree: the same bytes as through the tree, for
 * chat, Responses and completions, including multi-byte UTF-8, control bytes, the record
 * separators themselves and an empty reply; invalid UTF-8 (a reply cut mid-character) appends
 * nothing, as jansson refuses it. A capped text is cut the same way. */
static void test_reply_text_same_as_tree(void **state)
{
    (void)state;
    static const char *const replies[] = {"", "Prefix caching reuses KV blocks.",
                                          "caf\\u00e9 \\u2603 \\ud83d\\ude00",
                                          "tab\\tnl\\n rs\\u001e us\\u001f nul\\u0000 end"};
    static const int kinds[] = {KVR_ROUTE_CHAT, KVR_ROUTE_RESPONSES, KVR_ROUTE_COMPLETIONS};
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
        for (size_t i = 0; i < sizeof(replies) / sizeof(replies[0]); i++) {
            for (size_t cap = 0; cap <= 40; cap += 40) {
                char js[256];
                snprintf(js, sizeof(js), "\"%s\"", replies[i]);
                json_error_t err;
                json_t *str = json_loads(js, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
                assert_non_null(str);
                json_t *reply = kinds[k] == KVR_ROUTE_COMPLETIONS
                                    ? json_incref(str)
                                    : json_pack("{s:s,s:O}", "role", "assistant", "content", str);
                kvr_buf a, b;
                kvr_buf_init(&a, cap);
                kvr_buf_init(&b, cap);
                kvr_buf_append(&a, "Once", 4);
                kvr_buf_append(&b, "Once", 4);
                int ra = kvr_route_text_append_reply(&a, (kvr_route_kind)kinds[k], reply);
                int rb = kvr_route_text_append_reply_text(&b, (kvr_route_kind)kinds[k],
                                                          json_string_value(str),
                                                          json_string_length(str));
                assert_int_equal(ra, rb);
                assert_int_equal(a.len, b.len);
                assert_memory_equal(a.data, b.data, a.len);
                kvr_buf_free(&a);
                kvr_buf_free(&b);
                json_decref(reply);
                json_decref(str);
            }
        }
    }
    kvr_buf b;
    kvr_buf_init(&b, 0);
    kvr_buf_append(&b, "x", 1);
    assert_int_equal(kvr_route_text_append_reply_text(&b, KVR_ROUTE_CHAT, "caf\xc3", 4), 0);
    assert_int_equal(kvr_route_text_append_reply_text(&b, KVR_ROUTE_CHAT, "\xed\xa0\x80", 3), 0);
    assert_int_equal(kvr_route_text_append_reply_text(&b, KVR_ROUTE_MESSAGES, "ok", 2), 0);
    assert_int_equal(b.len, 1);
    kvr_buf_free(&b);
}

static void test_reply_appended_as_next_turn_frames_it(void **state)
{
    (void)state;
    const char *t1 = "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
                     "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
    const char *t2 = "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
                     "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
                     "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"x\","
                     "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
                     "{\"role\":\"tool\",\"tool_call_id\":\"x\",\"content\":\"42\"}]}";
    json_t *reply = parse("{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"function\":"
                          "{\"name\":\"f\",\"arguments\":\"{}\"}}]}");
    json_t *j1 = parse(t1);
    kvr_buf b;
    kvr_buf_init(&b, 0);
    assert_int_equal(kvr_route_text_build(j1, KVR_ROUTE_CHAT, &b), 0);
    assert_int_equal(kvr_route_text_append_reply(&b, KVR_ROUTE_CHAT, reply), 1);
    size_t n2;
    char *next = text_of(t2, KVR_ROUTE_CHAT, &n2);
    assert_true(b.len < n2);
    assert_memory_equal(b.data, next, b.len);
    free(next);
    kvr_buf_free(&b);
    json_decref(j1);
    json_decref(reply);
    /* completions: string prompts only */
    json_t *c1 = parse("{\"prompt\":\"Once upon\"}"), *c2 = parse("{\"prompt\":[1,2]}");
    json_t *more = json_string(" a time");
    kvr_buf_init(&b, 0);
    kvr_route_text_build(c1, KVR_ROUTE_COMPLETIONS, &b);
    assert_int_equal(kvr_route_text_append_reply(&b, KVR_ROUTE_COMPLETIONS, more), 1);
    assert_int_equal(b.len, strlen("Once upon a time"));
    assert_memory_equal(b.data, "Once upon a time", b.len);
    kvr_buf_free(&b);
    kvr_buf_init(&b, 0);
    kvr_route_text_build(c2, KVR_ROUTE_COMPLETIONS, &b);
    size_t before = b.len;
    assert_int_equal(kvr_route_text_append_reply(&b, KVR_ROUTE_COMPLETIONS, more), 0);
    assert_int_equal(b.len, before);
    kvr_buf_free(&b);
    json_decref(c1);
    json_decref(c2);
    json_decref(more);
}

/* ---- limits --------------------------------------------------------------------------- */

static void test_text_cap_keeps_prefix(void **state)
{
    (void)state;
    json_t *b1 = parse("{\"messages\":[{\"role\":\"system\",\"content\":\"0123456789abcdef\"},"
                       "{\"role\":\"user\",\"content\":\"first question\"}]}");
    json_t *b2 = parse("{\"messages\":[{\"role\":\"system\",\"content\":\"0123456789abcdef\"},"
                       "{\"role\":\"user\",\"content\":\"first question\"},"
                       "{\"role\":\"assistant\",\"content\":\"answer\"},"
                       "{\"role\":\"user\",\"content\":\"second\"}]}");
    kvr_buf full1, full2;
    kvr_buf_init(&full1, 0);
    kvr_buf_init(&full2, 0);
    assert_int_equal(kvr_route_text_build(b1, KVR_ROUTE_CHAT, &full1), 0);
    assert_int_equal(kvr_route_text_build(b2, KVR_ROUTE_CHAT, &full2), 0);
    for (size_t cap = 1; cap < full2.len + 2; cap++) {
        kvr_buf c1, c2;
        kvr_buf_init(&c1, cap);
        kvr_buf_init(&c2, cap);
        int r1 = kvr_route_text_build(b1, KVR_ROUTE_CHAT, &c1);
        int r2 = kvr_route_text_build(b2, KVR_ROUTE_CHAT, &c2);
        assert_int_equal(r1, full1.len > cap ? 1 : 0);
        assert_int_equal(r2, full2.len > cap ? 1 : 0);
        assert_true(c1.len <= cap && c2.len <= cap);
        assert_true(is_prefix(c1.data, c1.len, full1.data, full1.len));
        assert_true(is_prefix(c1.data, c1.len, c2.data, c2.len)); /* still a prefix */
        kvr_buf_free(&c1);
        kvr_buf_free(&c2);
    }
    kvr_buf_free(&full1);
    kvr_buf_free(&full2);
    json_decref(b1);
    json_decref(b2);
}

static void test_malformed_never_crash(void **state)
{
    (void)state;
    const char *bodies[] = {
        "[]", "{\"messages\":7}", "{\"messages\":[1,\"x\",null,{\"role\":5,\"content\":{}}]}",
        "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[5,{\"function\":3}]}]}",
        "{\"tools\":[1,{\"function\":{\"name\":7}},{\"type\":\"web_search\"}]}",
        "{\"prompt\":{\"a\":1}}", "{\"prompt\":[[1,\"x\"],2.5,null]}", "{\"prompt\":[1,\"x\"]}",
        "{\"input\":[null,5,{\"type\":\"message\"},{\"type\":\"function_call_output\"}]}",
        "{\"instructions\":[{\"type\":\"input_text\",\"text\":\"x\"}],\"input\":{}}",
    };
    for (size_t i = 0; i < sizeof(bodies) / sizeof(*bodies); i++) {
        for (int kind = 0; kind < 3; kind++) {
            size_t n;
            free(text_of(bodies[i], (kvr_route_kind)kind, &n));
        }
        char k[300];
        session_of(bodies[i], NULL, NULL, k, sizeof(k));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefix_tau_bench),
        cmocka_unit_test(test_prefix_swe_agent),
        cmocka_unit_test(test_prefix_sharegpt),
        cmocka_unit_test(test_escaped_and_raw_same),
        cmocka_unit_test(test_chat_content_forms),
        cmocka_unit_test(test_nontext_parts_digest),
        cmocka_unit_test(test_tools_sorted),
        cmocka_unit_test(test_completions_forms),
        cmocka_unit_test(test_responses),
        cmocka_unit_test(test_session_sources_order),
        cmocka_unit_test(test_session_values),
        cmocka_unit_test(test_session_sources_config),
        cmocka_unit_test(test_text_cap_keeps_prefix),
        cmocka_unit_test(test_reply_appended_as_next_turn_frames_it),
        cmocka_unit_test(test_reply_text_same_as_tree),
        cmocka_unit_test(test_malformed_never_crash),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
