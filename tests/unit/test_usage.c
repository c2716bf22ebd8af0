/* Usage reader of worker responses (src/proxy/usage.c): token usage and the Responses API id
 * from JSON bodies and SSE streams (OpenAI's and Anthropic's), whatever the read boundaries,
 * within the memory cap. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "proxy/usage.h"

/* Feeds `s` in reads of `step` bytes (0 = all at once), then finishes. */
static void scan(kvr_usage *u, int sse, size_t cap, int want_id, const char *s, size_t n,
                 size_t step)
{
    kvr_usage_init(u, sse, cap, want_id);
    for (size_t off = 0; off < n;) {
        size_t k = step && n - off > step ? step : n - off;
        kvr_usage_feed(u, s + off, k);
        off += k;
    }
    kvr_usage_finish(u);
}

static const char chat_sse[] =
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n"
    "data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,"
    "\"completion_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\r\n\r\n"
    "data: [DONE]\n\n";

static void test_sse_usage_any_split(void **state)
{
    (void)state;
    size_t n = strlen(chat_sse);
    for (size_t step = 0; step <= n; step++) {
        kvr_usage u;
        scan(&u, 1, 1u << 20, 0, chat_sse, n, step);
        assert_int_equal(u.found, 1);
        assert_int_equal(u.prompt, 12);
        assert_int_equal(u.completion, 3);
        assert_int_equal(u.cached, 8);
        assert_null(u.response_id);
        kvr_usage_free(&u);
    }
}

static void test_json_usage_and_response_id(void **state)
{
    (void)state;
    static const char body[] =
        "{\"id\":\"resp_7\",\"object\":\"response\",\"usage\":{\"prompt_tokens\":5,"
        "\"completion_tokens\":2}}";
    kvr_usage u;
    scan(&u, 0, 1u << 20, 1, body, strlen(body), 7);
    assert_int_equal(u.found, 1);
    assert_int_equal(u.prompt, 5);
    assert_int_equal(u.completion, 2);
    assert_int_equal(u.cached, 0);
    assert_string_equal(u.response_id, "resp_7");
    kvr_usage_free(&u);
    /* a body over the cap is not parsed; cap 0 turns scanning off */
    scan(&u, 0, 16, 1, body, strlen(body), 0);
    assert_int_equal(u.found, 0);
    assert_true(u.overflow);
    assert_null(u.response_id);
    kvr_usage_free(&u);
    scan(&u, 1, 0, 1, chat_sse, strlen(chat_sse), 0);
    assert_int_equal(u.found, 0);
    kvr_usage_free(&u);
}

static void test_sse_response_id(void **state)
{
    (void)state;
    static const char s[] =
        "event: response.created\n"
        "data: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"object\":"
        "\"response\"}}\n\n"
        "event: response.completed\n"
        "data: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\",\"usage\":"
        "{\"input_tokens\":4}}}\n\n";
    kvr_usage u;
    scan(&u, 1, 1u << 20, 1, s, strlen(s), 3);
    assert_string_equal(u.response_id, "resp_1");
    kvr_usage_free(&u);
    scan(&u, 1, 1u << 20, 0, s, strlen(s), 3);
    assert_null(u.response_id);
    kvr_usage_free(&u);
}

/* Found by fuzz/fuzz_sse.c (fuzz/corpus/sse/crash-overlong-line-tail): a line longer than the
 * cap was skipped only up to the end of the read that overflowed; when the line went on in a
 * later read, its tail was taken for a new line, so a tail starting with "data:" was parsed
 * (usage counted) when the same bytes in one read were not. */
static void test_fuzz_overlong_line_tail(void **state)
{
    (void)state;
    static const char minimized[] =
        "eve\"usage\":{\"cache\001\000\233\377\377\377[[[[[[[[[[[HHHH\000\000\000\031[[[\"usage\""
        "onse\337\301\002\000``\000\000data:{\"usage\":{\"\":{\"cons\":8}}}\nponse\n";
    size_t n = sizeof(minimized) - 1;
    assert_int_equal(n, 102);
    const char *tail = memmem(minimized, n, "data:", 5);
    assert_non_null(tail);
    size_t at = (size_t)(tail - minimized);
    static const size_t caps[] = {16, 64, 1u << 20};
    for (size_t c = 0; c < sizeof(caps) / sizeof(caps[0]); c++) {
        for (int want_id = 0; want_id <= 1; want_id++) {
            kvr_usage whole, split;
            scan(&whole, 1, caps[c], want_id, minimized, n, 0);
            kvr_usage_init(&split, 1, caps[c], want_id);
            kvr_usage_feed(&split, minimized, at); /* the read ends right before "data:" */
            kvr_usage_feed(&split, minimized + at, n - at);
            kvr_usage_finish(&split);
            assert_int_equal(split.found, whole.found);
            assert_int_equal(split.prompt, whole.prompt);
            assert_int_equal(split.cached, whole.cached);
            assert_int_equal(split.completion, whole.completion);
            /* the first line (95 bytes) is over the small caps, and no data line */
            assert_int_equal(whole.found, 0);
            kvr_usage_free(&whole);
            kvr_usage_free(&split);
        }
    }
    /* The plain case: after a counted event, a line of 100 x's over the 64-byte cap whose
     * bytes after the reads that overflowed look like a usage event. */
    static const char first[] = "data:{\"usage\":{\"prompt_tokens\":6}}\n";
    static const char rest[] = "data:{\"usage\":{\"prompt_tokens\":5}}\ndata: [DONE]\n";
    char xs[100];
    memset(xs, 'x', sizeof(xs));
    for (size_t cut = 1; cut <= sizeof(xs); cut++) {
        kvr_usage u;
        kvr_usage_init(&u, 1, 64, 0);
        kvr_usage_feed(&u, first, strlen(first));
        kvr_usage_feed(&u, xs, cut);
        kvr_usage_feed(&u, xs + cut, sizeof(xs) - cut);
        kvr_usage_feed(&u, rest, strlen(rest));
        kvr_usage_finish(&u);
        assert_int_equal(u.found, 1);
        assert_int_equal(u.prompt, 6); /* the overlong line's tail is not an event */
        kvr_usage_free(&u);
    }
}

/* Completion teaching reads the reply as the stream passes: text deltas joined, tool-call
 * fragments joined by index, whatever the read boundaries. */
static const char reply_sse[] =
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hel\"}}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo \\u00e9\"}}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c\","
    "\"function\":{\"name\":\"get\",\"arguments\":\"{\\\"a\\\"\"}}]}}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,"
    "\"function\":{\"arguments\":\":1}\"}}]},\"finish_reason\":\"tool_calls\"}]}\n\n"
    "data: [DONE]\n\n";

static void test_reply_chat_sse_any_split(void **state)
{
    (void)state;
    size_t n = strlen(reply_sse);
    for (size_t step = 0; step <= n; step += 7) {
        kvr_usage u;
        kvr_usage_init(&u, 1, 1u << 20, 0);
        kvr_usage_want_reply(&u, 1000);
        for (size_t off = 0; off < n;) {
            size_t k = step && n - off > step ? step : n - off;
            kvr_usage_feed(&u, reply_sse + off, k);
            off += k;
        }
        kvr_usage_finish(&u);
        json_t *m = kvr_usage_reply(&u, 0);
        assert_non_null(m);
        assert_string_equal(json_string_value(json_object_get(m, "role")), "assistant");
        assert_string_equal(json_string_value(json_object_get(m, "content")), "Hello \xc3\xa9");
        json_t *fn = json_object_get(json_array_get(json_object_get(m, "tool_calls"), 0),
                                     "function");
        assert_string_equal(json_string_value(json_object_get(fn, "name")), "get");
        assert_string_equal(json_string_value(json_object_get(fn, "arguments")), "{\"a\":1}");
        json_decref(m);
        kvr_usage_free(&u);
    }
}

/* `a` (read in place where it could be) and `b` (the tree's reading) read the same: counts,
 * reply bytes (with the NUL after them), done and over flags, and the reply object. Returns
 * a's reply object (caller decrefs), NULL when there is none. */
static json_t *assert_same_reading(const kvr_usage *a, const kvr_usage *b)
{
    assert_int_equal(a->found, b->found);
    assert_int_equal(a->prompt, b->prompt);
    assert_int_equal(a->completion, b->completion);
    assert_int_equal(a->cached, b->cached);
    assert_int_equal(a->has_cached, b->has_cached);
    assert_int_equal(a->reply_done, b->reply_done);
    assert_int_equal(a->reply_over, b->reply_over);
    assert_int_equal(a->reply.len, b->reply.len);
    if (a->reply.len)
        assert_memory_equal(a->reply.data, b->reply.data, a->reply.len + 1);
    json_t *ra = kvr_usage_reply(a, 0), *rb = kvr_usage_reply(b, 0);
    assert_true((ra == NULL) == (rb == NULL));
    assert_true(!ra || json_equal(ra, rb));
    json_decref(rb);
    return ra;
}

/* Token events are read in place (no tree); the rest through the tree. Both give what the
 * tree alone gives (kvr_usage_tree_only), for every read size, on events that take each way:
 * text deltas with escapes, a completion's text, tool-call fragments, usage null and object,
 * a long escaped delta, a whole message, not JSON. */
static void test_reply_in_place_equals_tree(void **state)
{
    (void)state;
    static const char *const streams[] = {
        "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"
        "data: {\"choices\":[{\"delta\":{\"content\":\"a\\n\\\"b\\\" \\u00e9\"},"
        "\"finish_reason\":null}],\"usage\":null}\n\n"
        "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":"
        "{\"name\":\"f\",\"arguments\":\"{}\"}}]}}]}\n\n"
        "data: {\"choices\":[{\"delta\":{\"content\":5,\"tool_calls\":[]},"
        "\"finish_reason\":\"stop\"}]}\n\n"
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":2}}\n\n"
        "data: [DONE]\n\n",
        "data: {\"choices\":[{\"text\":\"x\\ty\"},{\"text\":\"other\"}]}\n"
        "data: {\"choices\":[{\"delta\":null,\"text\":\"no\"}]}\n"
        "data: {\"object\":\"x\",\"choices\":[{\"message\":{\"content\":\"m\"}}]}\n",
        "data: {\"choices\":[{\"delta\":{\"content\":\"\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n"
        "\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n"
        "\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n"
        "\"}}],\"type\":\"t\"}\n"
        "data: {\"choices\":[{\"delta\":{\"content\":\"end\"},\"finish_reason\":\"length\"}]}\n",
    };
    for (size_t i = 0; i < sizeof(streams) / sizeof(streams[0]); i++) {
        size_t n = strlen(streams[i]);
        for (size_t step = 0; step <= n; step += 5) {
            kvr_usage u[2];
            for (int t = 0; t < 2; t++) {
                kvr_usage_tree_only = t;
                kvr_usage_init(&u[t], 1, 1u << 20, 0);
                kvr_usage_want_reply(&u[t], 1000);
                for (size_t off = 0; off < n;) {
                    size_t k = step && n - off > step ? step : n - off;
                    kvr_usage_feed(&u[t], streams[i] + off, k);
                    off += k;
                }
                kvr_usage_finish(&u[t]);
            }
            kvr_usage_tree_only = 0;
            json_t *a = assert_same_reading(&u[0], &u[1]);
            if (i == 0)
                assert_non_null(a);
            json_decref(a);
            kvr_usage_free(&u[0]);
            kvr_usage_free(&u[1]);
        }
    }
}

/* A JSON body is read in place too (no tree) when it is a plain chat or completions answer,
 * through the tree otherwise; either way exactly what the tree alone gives: usage counts and
 * cached tokens, the reply (escaped, over the cap, at the cap), done or not. */
static void test_json_body_in_place_equals_tree(void **state)
{
    (void)state;
    static const char *const bodies[] = {
        "{\"id\":\"c\",\"object\":\"chat.completion\",\"choices\":[{\"index\":0,\"message\":"
        "{\"role\":\"assistant\",\"content\":\"Prefix \\\"caching\\\"\\nreuses \\u00e9 blocks.\"},"
        "\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":42,\"total_tokens\":51,"
        "\"completion_tokens\":9,\"prompt_tokens_details\":{\"cached_tokens\":32}}}",
        "{\"choices\":[{\"message\":{\"content\":\"abcdefghij\"}}],\"usage\":{\"prompt_tokens\":1}}",
        "{\"choices\":[{\"message\":{\"content\":\"a\\tbcdefghi\"}}]}",
        "{\"choices\":[{\"message\":{\"content\":\"a\\tbcdefghij\\t\"}}]}",
        "{\"choices\":[{\"message\":{\"content\":null,\"tool_calls\":[{\"id\":\"t\",\"type\":"
        "\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}}]}",
        "{\"choices\":[{\"message\":null,\"finish_reason\":\"stop\"}],\"usage\":{\"input_tokens\":3,"
        "\"output_tokens\":4,\"input_tokens_details\":{\"cached_tokens\":\"x\"}}}",
        "{\"choices\":[{\"text\":\"\",\"finish_reason\":\"length\"}],\"usage\":null}",
        "{\"choices\":[{\"delta\":{\"content\":\"d\"},\"text\":\"t\"}]}",
        "{\"choices\":[\"x\"],\"usage\":{\"prompt_tokens\":2.5,\"completion_tokens\":7}}",
        "{\"object\":\"response\",\"id\":\"r\",\"output\":[],\"usage\":{\"input_tokens\":5}}",
        "[1]",
        "{\"choices\":[{\"message\":{\"content\":\"cut",
    };
    for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
        static const size_t caps[] = {9, 10, 1000};
        for (size_t ci = 0; ci < 3; ci++) {
            size_t cap = caps[ci];
            kvr_usage u[2];
            for (int t = 0; t < 2; t++) {
                kvr_usage_tree_only = t;
                kvr_usage_init(&u[t], 0, 1u << 20, 0);
                kvr_usage_want_reply(&u[t], cap);
                kvr_usage_feed(&u[t], bodies[i], strlen(bodies[i]));
                kvr_usage_finish(&u[t]);
            }
            kvr_usage_tree_only = 0;
            json_t *a = assert_same_reading(&u[0], &u[1]);
            if (i == 0 && cap == 1000) { /* the usual answer: all of it read */
                assert_non_null(a);
                assert_string_equal(json_string_value(json_object_get(a, "content")),
                                    "Prefix \"caching\"\nreuses \xc3\xa9 blocks.");
                assert_int_equal(u[0].prompt, 42);
                assert_int_equal(u[0].cached, 32);
                assert_int_equal(u[0].completion, 9);
            }
            if (i == 2 && cap == 10) /* decoded, the text fits a cap its raw bytes do not */
                assert_int_equal(u[0].reply_over, 0);
            if (i == 3 && cap <= 10)
                assert_int_equal(u[0].reply_over, 1);
            json_decref(a);
            kvr_usage_free(&u[0]);
            kvr_usage_free(&u[1]);
        }
    }
}

/* Counts only (round_robin: no reply, no id): an answer ending in its usage object is read
 * from the end (usage.c usage_tail()); every other shape from the start. Both must read what
 * the tree reads. */
static void test_counts_only_from_the_end_equal_tree(void **state)
{
    (void)state;
    static const char *const bodies[] = {
        /* the bench stub's answer (bench/overhead.sh) */
        "{\"id\":\"chatcmpl-bench0000000000\",\"object\":\"chat.completion\",\"created\":1700000000,"
        "\"model\":\"m\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":"
        "\"Prefix caching reuses KV blocks.\"},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\""
        ":42,\"total_tokens\":51,\"completion_tokens\":9}}",
        /* vLLM's, pretty-printed, with details */
        " {\n \"choices\": [],\n \"usage\" : {\"prompt_tokens\": 7, \"completion_tokens\": 2,"
        " \"prompt_tokens_details\": {\"cached_tokens\": 5}} \n } \n",
        "{\"usage\":{\"prompt_tokens\":1,\"prompt_tokens_details\":null}}",
        "{\"usage\":{\"input_tokens\":3,\"output_tokens\":4,\"input_tokens_details\":"
        "{\"cached_tokens\":1}}}",
        /* duplicates: the last one counts */
        "{\"usage\":{\"prompt_tokens\":1},\"usage\":{\"prompt_tokens\":2}}",
        /* not last, not an object, inside another object, a string holding braces */
        "{\"usage\":{\"prompt_tokens\":3},\"system_fingerprint\":\"x\"}",
        "{\"usage\":null}",
        "{\"x\":{\"usage\":{\"prompt_tokens\":4}}}",
        "{\"x\":{\"a\":1,\"usage\":{\"prompt_tokens\":4}}}",
        "{\"usage\":{\"prompt_tokens\":5,\"note\":\"}{\"}}",
        "{\"usage\":{\"prompt_tokens\":6,\"note\":\"\\\"usage\\\":{\"}}",
        "{\"k\":\"a\",\"usage\":{\"x\":\"}\",\"t\":1}}",
        "{\"response\":{\"usage\":{\"input_tokens\":8}}}",
        "{\"usage\":{\"prompt_tokens\":2.5,\"completion_tokens\":-7}}",
        "{\"musage\":{\"prompt_tokens\":9}}",
        "{\"a\":1,\"other\":{\"prompt_tokens\":9}}",
        "{\"usage\":{\"prompt_tokens\":1},\"other\":{\"prompt_tokens\":9}}",
        "[{\"usage\":{\"prompt_tokens\":9}}]",
        "{}",
        "}}",
    };
    for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
        kvr_usage u[2];
        for (int t = 0; t < 2; t++) {
            kvr_usage_tree_only = t;
            kvr_usage_init(&u[t], 0, 1u << 20, 0);
            kvr_usage_feed(&u[t], bodies[i], strlen(bodies[i]));
            kvr_usage_finish(&u[t]);
        }
        kvr_usage_tree_only = 0;
        json_decref(assert_same_reading(&u[0], &u[1]));
        if (i == 0) {
            assert_int_equal(u[0].found, 1);
            assert_int_equal(u[0].prompt, 42);
            assert_int_equal(u[0].completion, 9);
            assert_int_equal(u[0].has_cached, 0);
        }
        if (i == 1)
            assert_int_equal(u[0].cached, 5);
        if (i == 4)
            assert_int_equal(u[0].prompt, 2);
        kvr_usage_free(&u[0]);
        kvr_usage_free(&u[1]);
    }
    /* What the scan from the start never took: bytes that are no JSON text before a usage
     * object that ends the answer. The client receives them as sent; the counts are read. */
    const char *broken = "{\"choices\":[{\"message\":{\"content\":\"\x01\"}}],"
                         "\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":3}}";
    kvr_usage b;
    kvr_usage_init(&b, 0, 1u << 20, 0);
    kvr_usage_feed(&b, broken, strlen(broken));
    kvr_usage_finish(&b);
    assert_int_equal(b.found, 1);
    assert_int_equal(b.prompt, 11);
    kvr_usage_free(&b);
    /* The same whatever else is read (the reply for completion teaching, a response id):
     * the counts do not depend on the route's policy. Also for valid JSON nested deeper than
     * the scanner and the tree go. */
    char deep[5000];
    size_t dn = (size_t)snprintf(deep, sizeof(deep), "{\"choices\":[],\"a\":");
    for (int i = 0; i < 2100; i++)
        deep[dn++] = '[';
    for (int i = 0; i < 2100; i++)
        deep[dn++] = ']';
    dn += (size_t)snprintf(deep + dn, sizeof(deep) - dn,
                           ",\"usage\":{\"prompt_tokens\":27,\"completion_tokens\":19}}");
    const char *const odd[] = {broken, deep};
    const size_t oddlen[] = {strlen(broken), dn};
    for (int i = 0; i < 2; i++) {
        for (int want = 0; want < 3; want++) {
            kvr_usage_init(&b, 0, 1u << 20, want == 2);
            if (want == 1)
                kvr_usage_want_reply(&b, 4096);
            kvr_usage_feed(&b, odd[i], oddlen[i]);
            kvr_usage_finish(&b);
            assert_int_equal(b.found, 1);
            assert_int_equal(b.prompt, i ? 27 : 11);
            assert_int_equal(b.completion, i ? 19 : 3);
            kvr_usage_free(&b);
        }
    }
    /* ...but not a usage object that is itself no JSON */
    const char *bad_usage = "{\"usage\":{\"prompt_tokens\":1,,}}";
    kvr_usage_init(&b, 0, 1u << 20, 0);
    kvr_usage_feed(&b, bad_usage, strlen(bad_usage));
    kvr_usage_finish(&b);
    assert_int_equal(b.found, 0);
    kvr_usage_free(&b);
}

static void test_reply_json_forms_and_cap(void **state)
{
    (void)state;
    const char *chat = "{\"choices\":[{\"message\":{\"role\":\"assistant\",\"content\":\"ok\","
                       "\"tool_calls\":[]},\"finish_reason\":\"stop\"}]}";
    const char *cmpl = "{\"choices\":[{\"text\":\" world\",\"finish_reason\":\"length\"}]}";
    const char *resp = "{\"object\":\"response\",\"id\":\"resp_1\",\"output\":[{\"type\":"
                       "\"message\",\"content\":[{\"type\":\"output_text\",\"text\":\"yes\"}]}]}";
    kvr_usage u;
    scan(&u, 0, 1u << 20, 0, chat, strlen(chat), 0); /* not asked: nothing */
    assert_null(kvr_usage_reply(&u, 0));
    kvr_usage_free(&u);
    const char *bodies[] = {chat, cmpl, resp};
    const char *want[] = {"ok", " world", "yes"};
    for (int i = 0; i < 3; i++) {
        kvr_usage_init(&u, 0, 1u << 20, 0);
        kvr_usage_want_reply(&u, 100);
        kvr_usage_feed(&u, bodies[i], strlen(bodies[i]));
        kvr_usage_finish(&u);
        json_t *r = kvr_usage_reply(&u, i == 1);
        assert_non_null(r);
        const char *got = json_string_value(i == 1 ? r : json_object_get(r, "content"));
        assert_string_equal(got, want[i]);
        json_decref(r);
        kvr_usage_free(&u);
    }
    /* over the cap: no reply at all rather than a cut one */
    kvr_usage_init(&u, 0, 1u << 20, 0);
    kvr_usage_want_reply(&u, 1);
    kvr_usage_feed(&u, chat, strlen(chat));
    kvr_usage_finish(&u);
    assert_null(kvr_usage_reply(&u, 0));
    kvr_usage_free(&u);
    /* a stream cut before its last event: incomplete, not taught */
    kvr_usage_init(&u, 1, 1u << 20, 0);
    kvr_usage_want_reply(&u, 1000);
    kvr_usage_feed(&u, reply_sse, 60);
    kvr_usage_finish(&u);
    assert_null(kvr_usage_reply(&u, 0));
    kvr_usage_free(&u);
}

/* ---- Anthropic Messages ---------------------------------------------------------------- */

/* Anthropic's event sequence: message_start carries input and cache counts (output_tokens 1),
 * message_delta the final output_tokens (a total, which replaces message_start's). A text
 * block, then a tool_use block whose input arrives in input_json_delta fragments. */
static const char msg_sse[] =
    "event: message_start\n"
    "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\","
    "\"role\":\"assistant\",\"content\":[],\"usage\":{\"input_tokens\":20,"
    "\"cache_creation_input_tokens\":5,\"cache_read_input_tokens\":100,\"output_tokens\":1}}}\n\n"
    "event: content_block_start\n"
    "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\","
    "\"text\":\"\"}}\n\n"
    "event: ping\ndata: {\"type\": \"ping\"}\n\n"
    "event: content_block_delta\n"
    "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\","
    "\"text\":\"Let me \"}}\n\n"
    "event: content_block_delta\n"
    "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\","
    "\"text\":\"check \\u00e9\"}}\n\n"
    "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n"
    "event: content_block_start\n"
    "data: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":"
    "\"tool_use\",\"id\":\"toolu_1\",\"name\":\"get_weather\",\"input\":{}}}\n\n"
    "event: content_block_delta\n"
    "data: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":"
    "\"input_json_delta\",\"partial_json\":\"{\\\"city\\\": \"}}\n\n"
    "event: content_block_delta\n"
    "data: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":"
    "\"input_json_delta\",\"partial_json\":\"\\\"Paris\\\"}\"}}\n\n"
    "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\n"
    "event: message_delta\n"
    "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\","
    "\"stop_sequence\":null},\"usage\":{\"output_tokens\":42}}\n\n"
    "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

static void check_msg_reply(json_t *m)
{
    assert_non_null(m);
    assert_string_equal(json_string_value(json_object_get(m, "role")), "assistant");
    json_t *c = json_object_get(m, "content");
    assert_int_equal(json_array_size(c), 2);
    json_t *t = json_array_get(c, 0), *tu = json_array_get(c, 1);
    assert_string_equal(json_string_value(json_object_get(t, "type")), "text");
    assert_string_equal(json_string_value(json_object_get(t, "text")), "Let me check \xc3\xa9");
    assert_string_equal(json_string_value(json_object_get(tu, "type")), "tool_use");
    assert_string_equal(json_string_value(json_object_get(tu, "name")), "get_weather");
    json_t *want = json_pack("{s:s}", "city", "Paris");
    assert_true(json_equal(json_object_get(tu, "input"), want));
    json_decref(want);
}

static void test_messages_sse_usage_and_reply_any_split(void **state)
{
    (void)state;
    size_t n = strlen(msg_sse);
    for (size_t step = 0; step <= n; step += 5) {
        kvr_usage u;
        kvr_usage_init(&u, 1, 1u << 20, 0);
        kvr_usage_messages(&u);
        kvr_usage_want_reply(&u, 1000);
        for (size_t off = 0; off < n;) {
            size_t k = step && n - off > step ? step : n - off;
            kvr_usage_feed(&u, msg_sse + off, k);
            off += k;
        }
        kvr_usage_finish(&u);
        assert_int_equal(u.found, 1);
        assert_int_equal(u.prompt, 125); /* input + cache read + cache creation */
        assert_int_equal(u.cached, 100);
        assert_int_equal(u.has_cached, 1);
        assert_int_equal(u.completion, 42); /* replaced, never 1 + 42 */
        json_t *m = kvr_usage_reply(&u, 0);
        check_msg_reply(m);
        json_decref(m);
        kvr_usage_free(&u);
    }
    /* without the reply asked, the usage lines alone are parsed, with the same counts */
    kvr_usage u;
    kvr_usage_init(&u, 1, 1u << 20, 0);
    kvr_usage_messages(&u);
    kvr_usage_feed(&u, msg_sse, n);
    kvr_usage_finish(&u);
    assert_int_equal(u.prompt, 125);
    assert_int_equal(u.completion, 42);
    assert_null(kvr_usage_reply(&u, 0));
    kvr_usage_free(&u);
}

/* A later event's value replaces an earlier one field by field; a field an event leaves out
 * keeps its value. */
static void test_messages_later_event_replaces(void **state)
{
    (void)state;
    static const char sse[] =
        "data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":7,"
        "\"cache_read_input_tokens\":3,\"output_tokens\":1}}}\n\n"
        "data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":9}}\n\n"
        "data: {\"type\":\"message_delta\",\"usage\":{\"input_tokens\":8,"
        "\"cache_read_input_tokens\":4,\"output_tokens\":10}}\n\n";
    kvr_usage u;
    kvr_usage_init(&u, 1, 1u << 20, 0);
    kvr_usage_messages(&u);
    kvr_usage_feed(&u, sse, strlen(sse));
    kvr_usage_finish(&u);
    assert_int_equal(u.prompt, 12);
    assert_int_equal(u.cached, 4);
    assert_int_equal(u.completion, 10);
    kvr_usage_free(&u);
    /* no cache_read_input_tokens: cached 0 and not reported */
    static const char body[] = "{\"type\":\"message\",\"content\":[],\"usage\":"
                               "{\"input_tokens\":5,\"output_tokens\":2}}";
    kvr_usage_init(&u, 0, 1u << 20, 0);
    kvr_usage_messages(&u);
    kvr_usage_feed(&u, body, strlen(body));
    kvr_usage_finish(&u);
    assert_int_equal(u.found, 1);
    assert_int_equal(u.prompt, 5);
    assert_int_equal(u.has_cached, 0);
    kvr_usage_free(&u);
}

static void test_messages_json_reply_and_bad_streams(void **state)
{
    (void)state;
    static const char body[] =
        "{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":["
        "{\"type\":\"thinking\",\"thinking\":\"hmm\",\"signature\":\"s\"},"
        "{\"type\":\"text\",\"text\":\"Let me check \\u00e9\"},{\"type\":\"tool_use\","
        "\"id\":\"toolu_1\",\"name\":\"get_weather\",\"input\":{\"city\":\"Paris\"}}],"
        "\"stop_reason\":\"tool_use\",\"usage\":{\"input_tokens\":20,"
        "\"cache_creation_input_tokens\":5,\"cache_read_input_tokens\":100,\"output_tokens\":42}}";
    kvr_usage u;
    kvr_usage_init(&u, 0, 1u << 20, 0);
    kvr_usage_messages(&u);
    kvr_usage_want_reply(&u, 1000);
    kvr_usage_feed(&u, body, strlen(body));
    kvr_usage_finish(&u);
    assert_int_equal(u.prompt, 125);
    assert_int_equal(u.cached, 100);
    json_t *m = kvr_usage_reply(&u, 0);
    check_msg_reply(m); /* the thinking block is not taught */
    json_decref(m);
    kvr_usage_free(&u);
    /* a delta for a block that is not the last one started, a tool input that is not JSON, a
     * stream without its end: no reply */
    const char *bad[] = {
        "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":"
        "\"text\",\"text\":\"\"}}\n\ndata: {\"type\":\"content_block_delta\",\"index\":3,"
        "\"delta\":{\"type\":\"text_delta\",\"text\":\"x\"}}\n\n"
        "data: {\"type\":\"message_stop\"}\n\n",
        "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":"
        "\"tool_use\",\"name\":\"f\",\"input\":{}}}\n\ndata: {\"type\":\"content_block_delta\","
        "\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"a\"}}\n\n"
        "data: {\"type\":\"message_stop\"}\n\n",
        "data: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":"
        "\"text\",\"text\":\"\"}}\n\ndata: {\"type\":\"message_stop\"}\n\n",
        "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":"
        "\"text\",\"text\":\"partial\"}}\n\n",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        kvr_usage_init(&u, 1, 1u << 20, 0);
        kvr_usage_messages(&u);
        kvr_usage_want_reply(&u, 1000);
        kvr_usage_feed(&u, bad[i], strlen(bad[i]));
        kvr_usage_finish(&u);
        assert_null(kvr_usage_reply(&u, 0));
        kvr_usage_free(&u);
    }
    /* over the cap: nothing rather than a cut reply */
    kvr_usage_init(&u, 1, 1u << 20, 0);
    kvr_usage_messages(&u);
    kvr_usage_want_reply(&u, 8);
    kvr_usage_feed(&u, msg_sse, strlen(msg_sse));
    kvr_usage_finish(&u);
    assert_null(kvr_usage_reply(&u, 0));
    assert_int_equal(u.completion, 42);
    kvr_usage_free(&u);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sse_usage_any_split),
        cmocka_unit_test(test_json_usage_and_response_id),
        cmocka_unit_test(test_sse_response_id),
        cmocka_unit_test(test_fuzz_overlong_line_tail),
        cmocka_unit_test(test_reply_chat_sse_any_split),
        cmocka_unit_test(test_reply_json_forms_and_cap),
        cmocka_unit_test(test_reply_in_place_equals_tree),
        cmocka_unit_test(test_json_body_in_place_equals_tree),
        cmocka_unit_test(test_counts_only_from_the_end_equal_tree),
        cmocka_unit_test(test_messages_sse_usage_and_reply_any_split),
        cmocka_unit_test(test_messages_later_event_replaces),
        cmocka_unit_test(test_messages_json_reply_and_bad_streams),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
