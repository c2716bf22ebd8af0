/* SSE parser: events split at every byte boundary come out whole and identical; stream chunk
 * digestion finds first content, usage, errors and [DONE]. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "replay.h"
#include "sse.h"

typedef struct {
    char log[8192];
    size_t len;
    int count;
    int stop_after; /* return 1 from the callback after this many events (0 = never) */
} collect_t;

static int collect_cb(void *ud, const char *event, const char *data, size_t len)
{
    collect_t *c = ud;
    assert_int_equal(strlen(data), len); /* data is NUL-terminated with no embedded NUL here */
    c->len += (size_t)snprintf(c->log + c->len, sizeof(c->log) - c->len, "[%s|%s]", event, data);
    c->count++;
    return c->stop_after && c->count >= c->stop_after ? 1 : 0;
}

/* Every line-ending style, comments, multi-line data, an event name, a field without a colon,
 * an unknown field, an event without data (not dispatched) and an OpenAI-like chunk. */
static const char STREAM[] =
    ": keep-alive comment\n"
    "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n"
    "data: one\r\ndata: two\r\n\r\n"
    "event: error\rdata:no-space\r\r"
    "id: 7\nretry: 10\n\n"
    "data\n\n"
    "foo: bar\ndata:  two spaces\n\n"
    "data: [DONE]\n\n";

static const char EXPECTED[] =
    "[|{\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}]"
    "[|one\ntwo]"
    "[error|no-space]"
    "[|]"
    "[| two spaces]"
    "[|[DONE]]";

static void feed_split(const char *s, size_t n, size_t cut1, size_t cut2, collect_t *c)
{
    kvr_sse p;
    kvr_sse_init(&p, 4096, collect_cb, c);
    assert_int_equal(kvr_sse_feed(&p, s, cut1), 0);
    assert_int_equal(kvr_sse_feed(&p, s + cut1, cut2 - cut1), 0);
    assert_int_equal(kvr_sse_feed(&p, s + cut2, n - cut2), 0);
    kvr_sse_free(&p);
}

static void test_whole(void **state)
{
    (void)state;
    collect_t c = {0};
    feed_split(STREAM, strlen(STREAM), 0, 0, &c);
    assert_string_equal(c.log, EXPECTED);
    assert_int_equal(c.count, 6);
}

static void test_every_split(void **state)
{
    (void)state;
    size_t n = strlen(STREAM);
    /* Every pair of cut points, so an event is split in up to three pieces anywhere, including
     * between a CR and its LF. */
    for (size_t i = 0; i <= n; i++)
        for (size_t j = i; j <= n; j++) {
            collect_t c = {0};
            feed_split(STREAM, n, i, j, &c);
            if (strcmp(c.log, EXPECTED) != 0)
                fail_msg("cuts at %zu,%zu gave %s", i, j, c.log);
        }
}

static void test_byte_by_byte(void **state)
{
    (void)state;
    collect_t c = {0};
    kvr_sse p;
    kvr_sse_init(&p, 4096, collect_cb, &c);
    for (size_t i = 0; STREAM[i]; i++)
        assert_int_equal(kvr_sse_feed(&p, STREAM + i, 1), 0);
    assert_string_equal(c.log, EXPECTED);
    assert_int_equal(p.events, 6);
    kvr_sse_free(&p);
}

static void test_unterminated_event_dropped(void **state)
{
    (void)state;
    collect_t c = {0};
    kvr_sse p;
    kvr_sse_init(&p, 0, collect_cb, &c);
    assert_int_equal(kvr_sse_feed(&p, "data: a\n\ndata: partial", 23), 0);
    assert_int_equal(c.count, 1);
    kvr_sse_free(&p);
}

static void test_cap(void **state)
{
    (void)state;
    collect_t c = {0};
    kvr_sse p;
    kvr_sse_init(&p, 16, collect_cb, &c);
    /* A line longer than the cap, in one piece and in several. */
    assert_int_equal(kvr_sse_feed(&p, "data: 0123456789abcdefghij\n", 27), -1);
    kvr_sse_free(&p);
    kvr_sse_init(&p, 16, collect_cb, &c);
    assert_int_equal(kvr_sse_feed(&p, "data: 0123456", 13), 0);
    assert_int_equal(kvr_sse_feed(&p, "789abcdefghij", 13), -1);
    kvr_sse_free(&p);
    /* Many short data lines adding up past the cap. */
    kvr_sse_init(&p, 16, collect_cb, &c);
    assert_int_equal(kvr_sse_feed(&p, "data: 012345\ndata: 012345\ndata: 012345\n", 39), -1);
    kvr_sse_free(&p);
}

static void test_callback_stops(void **state)
{
    (void)state;
    collect_t c = {.stop_after = 2};
    kvr_sse p;
    kvr_sse_init(&p, 0, collect_cb, &c);
    assert_int_equal(kvr_sse_feed(&p, STREAM, strlen(STREAM)), 1);
    assert_int_equal(c.count, 2);
    kvr_sse_free(&p);
}

static void test_stream_digest(void **state)
{
    (void)state;
    kvr_bench_stream s;
    kvr_bench_stream_init(&s);
    const char *role = "{\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}";
    const char *c1 = "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}";
    const char *c2 = "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\" there\"}}],\"usage\": null}";
    const char *u = "{\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":7,"
                    "\"prompt_tokens_details\":{\"cached_tokens\":64}}}";
    assert_false(kvr_bench_stream_event(&s, role, strlen(role)));
    assert_false(s.first_content);
    assert_true(kvr_bench_stream_event(&s, c1, strlen(c1)));
    assert_false(kvr_bench_stream_event(&s, c2, strlen(c2)));
    assert_false(s.usage);
    assert_false(kvr_bench_stream_event(&s, u, strlen(u)));
    assert_true(s.usage);
    assert_int_equal(s.prompt_tokens, 100);
    assert_int_equal(s.cached_tokens, 64);
    assert_int_equal(s.completion_tokens, 7);
    assert_false(s.done);
    kvr_bench_stream_event(&s, "[DONE]", 6);
    assert_true(s.done);
    assert_false(s.error);
    assert_false(s.bad_json);
}

static void test_stream_tool_calls_and_errors(void **state)
{
    (void)state;
    kvr_bench_stream s;
    kvr_bench_stream_init(&s);
    const char *tc = "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"name\":\"f\"}}]}}]}";
    assert_true(kvr_bench_stream_event(&s, tc, strlen(tc)));
    /* Usage without details: cached counts as 0, not unknown. */
    const char *u = "{\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1}}";
    kvr_bench_stream_event(&s, u, strlen(u));
    assert_true(s.usage);
    assert_int_equal(s.cached_tokens, 0);
    const char *e = "{\"error\":{\"message\":\"boom\",\"type\":\"server_error\"}}";
    kvr_bench_stream_event(&s, e, strlen(e));
    assert_true(s.error);
    kvr_bench_stream_event(&s, "{not json", 9);
    /* After the first content only usage/error chunks are parsed, so this is not noticed… */
    kvr_bench_stream_init(&s);
    kvr_bench_stream_event(&s, "{not json", 9);
    assert_true(s.bad_json); /* …but before it, it is. */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_whole),
        cmocka_unit_test(test_every_split),
        cmocka_unit_test(test_byte_by_byte),
        cmocka_unit_test(test_unterminated_event_dropped),
        cmocka_unit_test(test_cap),
        cmocka_unit_test(test_callback_stops),
        cmocka_unit_test(test_stream_digest),
        cmocka_unit_test(test_stream_tool_calls_and_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
