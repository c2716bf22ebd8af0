/* The access log: the line encoder (proxy/access_line.c) writes every field in order, null
 * for what is unknown, ttft from the headers for a plain answer and from the first byte for a
 * stream, the client's address without its port, JSON-escaped values; the sink
 * (obs/access_log.c) buffers lines until the loop turn ends, bounds its buffer (drops
 * counted) and reopens its file under its name after a rename. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>
#include <uv.h>

#include "obs/access_log.h"
#include "proxy/access_line.h"

static json_t *encode(const kvr_span_facts *f, uint64_t wall_ms, kvr_buf *b)
{
    kvr_buf_init(b, 0);
    assert_int_equal(kvr_access_line(b, f, wall_ms), 0);
    assert_true(b->len > 1 && b->data[b->len - 1] == '\n');
    assert_null(memchr(b->data, '\n', b->len - 1)); /* one line */
    json_error_t e;
    json_t *o = json_loadb(b->data, b->len, 0, &e);
    assert_non_null(o);
    return o;
}

static void test_line_fields(void **st)
{
    (void)st;
    kvr_span_facts f = {.route = "llama", .worker = "http://10.0.0.5:8000", .decision =
                            "prefix_match", .request_id = "req-1", .match = 0.8734,
                        .attempt = 2, .status = 200, .has_usage = 1, .prompt = 1200,
                        .cached = 1024, .completion = 87, .ttft_ms = 250.5, .headers_ms = 12.25,
                        .stream = 0, .client = "192.168.1.7:53211", .key = "team-a",
                        .start_mono_ns = 1000000000, .end_mono_ns = 1900500000};
    kvr_buf b;
    json_t *o = encode(&f, 1700000000123ull, &b);
    static const char *order[] = {"time", "request_id", "route", "worker", "decision", "match",
                                  "attempts", "status", "prompt_tokens", "cached_tokens",
                                  "completion_tokens", "ttft_ms", "total_ms", "client", "key"};
    const char *p = b.data;
    for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
        char k[40];
        snprintf(k, sizeof(k), "\"%s\":", order[i]);
        const char *q = strstr(p, k);
        assert_non_null(q);
        p = q;
    }
    assert_int_equal(json_object_size(o), 15);
    assert_string_equal(json_string_value(json_object_get(o, "time")),
                        "2023-11-14T22:13:20.123Z");
    assert_string_equal(json_string_value(json_object_get(o, "route")), "llama");
    assert_true(json_real_value(json_object_get(o, "match")) == 0.8734);
    assert_int_equal(json_integer_value(json_object_get(o, "attempts")), 2);
    assert_int_equal(json_integer_value(json_object_get(o, "cached_tokens")), 1024);
    assert_true(json_real_value(json_object_get(o, "ttft_ms")) == 12.25); /* headers */
    assert_true(json_real_value(json_object_get(o, "total_ms")) == 900.5);
    assert_string_equal(json_string_value(json_object_get(o, "client")), "192.168.1.7");
    assert_string_equal(json_string_value(json_object_get(o, "key")), "team-a");
    json_decref(o);
    kvr_buf_free(&b);
    /* a stream: TTFT is the first body byte's */
    f.stream = 1;
    o = encode(&f, 0, &b);
    assert_true(json_real_value(json_object_get(o, "ttft_ms")) == 250.5);
    assert_string_equal(json_string_value(json_object_get(o, "time")),
                        "1970-01-01T00:00:00.000Z");
    json_decref(o);
    kvr_buf_free(&b);
}

static void test_line_unknowns_and_escaping(void **st)
{
    (void)st;
    /* a request refused before routing: almost nothing is known */
    kvr_span_facts f = {.status = 401, .match = -1, .ttft_ms = -1, .headers_ms = -1,
                        .client = "[::1]:4000", .request_id = "a\"b\\c",
                        .start_mono_ns = 5, .end_mono_ns = 5};
    kvr_buf b;
    json_t *o = encode(&f, 1, &b);
    static const char *nulls[] = {"route", "worker", "decision", "match", "prompt_tokens",
                                  "cached_tokens", "completion_tokens", "ttft_ms", "key"};
    for (size_t i = 0; i < sizeof(nulls) / sizeof(nulls[0]); i++)
        assert_true(json_is_null(json_object_get(o, nulls[i])));
    assert_string_equal(json_string_value(json_object_get(o, "request_id")), "a\"b\\c");
    assert_string_equal(json_string_value(json_object_get(o, "client")), "::1");
    assert_int_equal(json_integer_value(json_object_get(o, "status")), 401);
    assert_int_equal(json_integer_value(json_object_get(o, "attempts")), 0);
    assert_true(json_real_value(json_object_get(o, "total_ms")) == 0);
    json_decref(o);
    kvr_buf_free(&b);
    /* bytes that are not UTF-8 become null rather than a broken line; no client at all */
    f.request_id = "\xff\xfe";
    f.client = NULL;
    o = encode(&f, 1, &b);
    assert_true(json_is_null(json_object_get(o, "request_id")));
    assert_true(json_is_null(json_object_get(o, "client")));
    json_decref(o);
    kvr_buf_free(&b);
    /* a full buffer: nothing appended */
    kvr_buf small;
    kvr_buf_init(&small, 10);
    assert_int_equal(kvr_access_line(&small, &f, 1), -1);
    assert_int_equal(small.len, 0);
    kvr_buf_free(&small);
}

static char *slurp(const char *path)
{
    FILE *fp = fopen(path, "r");
    if (!fp)
        return strdup("");
    static char buf[65536];
    size_t n = fread(buf, 1, sizeof(buf) - 1, fp);
    fclose(fp);
    buf[n] = '\0';
    return strdup(buf);
}

static void test_sink_buffers_bounds_and_reopens(void **st)
{
    (void)st;
    char dir[] = "/tmp/kvr-access-XXXXXX", path[128], rotated[128], err[256];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/access.log", dir);
    snprintf(rotated, sizeof(rotated), "%s/access.log.1", dir);
    uv_loop_t loop;
    uv_loop_init(&loop);
    kvr_access_log *l = kvr_access_log_open(&loop, path, 64, err, sizeof(err));
    assert_non_null(l);
    assert_int_equal(kvr_access_log_write(l, "{\"a\":1}\n", 8), 0);
    assert_int_equal(kvr_access_log_write(l, "{\"a\":2}\n", 8), 0);
    char *c = slurp(path);
    assert_string_equal(c, ""); /* held until the loop turn ends */
    free(c);
    uv_run(&loop, UV_RUN_NOWAIT);
    c = slurp(path);
    assert_string_equal(c, "{\"a\":1}\n{\"a\":2}\n");
    free(c);
    /* past the 64-byte buffer: dropped and counted */
    char big[80];
    memset(big, 'x', sizeof(big));
    big[79] = '\n';
    assert_int_equal(kvr_access_log_write(l, big, sizeof(big)), -1);
    assert_int_equal(kvr_access_log_dropped(l), 1);
    /* rotation: rename, reopen, the next lines land in a new file of the old name */
    assert_int_equal(kvr_access_log_write(l, "{\"a\":3}\n", 8), 0);
    assert_int_equal(rename(path, rotated), 0);
    assert_int_equal(kvr_access_log_reopen(l, err, sizeof(err)), 0); /* flushes a:3 first */
    assert_int_equal(kvr_access_log_write(l, "{\"a\":4}\n", 8), 0);
    kvr_access_log_close(l);
    uv_run(&loop, UV_RUN_DEFAULT);
    c = slurp(rotated);
    assert_string_equal(c, "{\"a\":1}\n{\"a\":2}\n{\"a\":3}\n");
    free(c);
    c = slurp(path);
    assert_string_equal(c, "{\"a\":4}\n");
    free(c);
    assert_int_equal(uv_loop_close(&loop), 0);
    /* an unwritable path is refused at open; NULL is a no-op everywhere */
    snprintf(path, sizeof(path), "%s/no/such/dir/x.log", dir);
    assert_null(kvr_access_log_open(&loop, path, 64, err, sizeof(err)));
    assert_non_null(strstr(err, "--access-log"));
    assert_int_equal(kvr_access_log_write(NULL, "x\n", 2), 0);
    kvr_access_log_close(NULL);
    unlink(rotated);
    snprintf(path, sizeof(path), "%s/access.log", dir);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_line_fields),
        cmocka_unit_test(test_line_unknowns_and_escaping),
        cmocka_unit_test(test_sink_buffers_bounds_and_reopens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
