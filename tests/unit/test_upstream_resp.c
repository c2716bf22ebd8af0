/* Unit tests of the native client's response parser (src/upstream/respparse.c): framing
 * (Content-Length, chunked with extensions and trailers, read to close), interim heads, HEAD,
 * keep-alive, the dry run, and malformed input. Each case is fed whole and one byte at a time,
 * which must give the same events' result. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "upstream/respparse.h"

typedef struct result {
    int status, end, heads, keep; /* end: 1 done, 2 error, 3 done with bytes after it */
    char hdrs[1024];
    char body[1024];
    size_t body_len;
} result;

/* Parses `msg` in reads of `step` bytes (0 = whole), then EOF when `eof` and not ended. */
static void parse(const char *msg, size_t step, int head_req, int eof, result *out)
{
    memset(out, 0, sizeof(*out));
    kvr_resp r;
    kvr_resp_init(&r);
    kvr_resp_reset(&r, head_req);
    size_t n = strlen(msg), pos = 0;
    while (pos < n && !out->end) {
        size_t len = step && n - pos > step ? step : n - pos;
        size_t off = 0;
        while (off < len && !out->end) {
            size_t used = 0, pl = 0;
            const char *piece = NULL;
            kvr_resp_ev ev = kvr_resp_feed(&r, msg + pos + off, len - off, &used, &piece, &pl);
            off += used;
            if (ev == KVR_RESP_HEAD) {
                out->heads++;
                out->status = r.status;
                size_t o = strlen(out->hdrs);
                for (size_t i = 0; i < r.nhdrs; i++)
                    o += (size_t)snprintf(out->hdrs + o, sizeof(out->hdrs) - o, "%.*s=[%.*s]\n",
                                          (int)r.hdrs[i].name_len, r.hdrs[i].name,
                                          (int)r.hdrs[i].value_len, r.hdrs[i].value);
            } else if (ev == KVR_RESP_BODY) {
                assert_true(out->body_len + pl < sizeof(out->body));
                memcpy(out->body + out->body_len, piece, pl);
                out->body_len += pl;
            } else if (ev == KVR_RESP_DONE) {
                out->end = pos + off < n ? 3 : 1;
                out->keep = kvr_resp_keep_alive(&r);
            } else if (ev == KVR_RESP_ERROR) {
                assert_non_null(r.err);
                out->end = 2;
            }
        }
        pos += len;
    }
    if (!out->end && eof) {
        out->end = kvr_resp_eof(&r) == KVR_RESP_DONE ? 1 : 2;
        out->keep = kvr_resp_keep_alive(&r);
    }
    kvr_resp_free(&r);
}

/* Whole and byte by byte agree; returns the whole-feed result. */
static result both(const char *msg, int head_req, int eof)
{
    result a, b;
    parse(msg, 0, head_req, eof, &a);
    parse(msg, 1, head_req, eof, &b);
    assert_int_equal(a.status, b.status);
    assert_int_equal(a.end, b.end);
    assert_int_equal(a.heads, b.heads);
    assert_int_equal(a.keep, b.keep);
    assert_string_equal(a.hdrs, b.hdrs);
    assert_int_equal(a.body_len, b.body_len);
    assert_memory_equal(a.body, b.body, a.body_len);
    return a;
}

static void test_content_length(void **state)
{
    (void)state;
    result r = both("HTTP/1.1 201 Created\r\nX-Test:  abc \r\nX-Empty:\r\nContent-Length: 5\r\n"
                    "\r\nhello", 0, 0);
    assert_int_equal(r.status, 201);
    assert_int_equal(r.end, 1);
    assert_int_equal(r.keep, 1);
    assert_string_equal(r.hdrs, "X-Test=[abc]\nX-Empty=[]\nContent-Length=[5]\n");
    assert_int_equal(r.body_len, 5);
    assert_memory_equal(r.body, "hello", 5);
}

static void test_chunked_extensions_trailers(void **state)
{
    (void)state;
    result r = both("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                    "5;name=value\r\nhello\r\n6 ; x\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n",
                    0, 0);
    assert_int_equal(r.end, 1);
    assert_int_equal(r.keep, 1);
    assert_int_equal(r.body_len, 11);
    assert_memory_equal(r.body, "hello world", 11);
    assert_null(strstr(r.hdrs, "X-Trailer"));
}

static void test_interim_heads_skipped(void **state)
{
    (void)state;
    result r = both("HTTP/1.1 100 Continue\r\nContent-Length: 3\r\n\r\n"
                    "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
                    "HTTP/1.1 200 OK\r\nX-Final: yes\r\nContent-Length: 2\r\n\r\nok", 0, 0);
    assert_int_equal(r.heads, 1);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.hdrs, "X-Final=[yes]\nContent-Length=[2]\n");
    assert_int_equal(r.body_len, 2);
    assert_int_equal(r.end, 1);
}

static void test_read_to_close(void **state)
{
    (void)state;
    result r = both("HTTP/1.0 200 OK\r\nX-V: 10\r\n\r\nto the close", 0, 1);
    assert_int_equal(r.end, 1);
    assert_int_equal(r.keep, 0);
    assert_int_equal(r.body_len, 12);
    /* a Content-Length body cut short by the close is an error */
    r = both("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", 0, 1);
    assert_int_equal(r.end, 2);
    /* a close before the head ended too */
    r = both("HTTP/1.1 200 OK\r\nContent-Le", 0, 1);
    assert_int_equal(r.end, 2);
    assert_int_equal(r.heads, 0);
    /* Connection: close with a length completes but is not kept */
    r = both("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", 0, 0);
    assert_int_equal(r.end, 1);
    assert_int_equal(r.keep, 0);
    /* HTTP/1.0 keep-alive is */
    r = both("HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok", 0, 0);
    assert_int_equal(r.end, 1);
    assert_int_equal(r.keep, 1);
}

static void test_head_and_no_content(void **state)
{
    (void)state;
    result r = both("HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n", 1, 0);
    assert_int_equal(r.end, 1);
    assert_int_equal(r.body_len, 0);
    assert_int_equal(r.keep, 1);
    r = both("HTTP/1.1 204 No Content\r\nX-E: 1\r\n\r\n", 0, 0);
    assert_int_equal(r.end, 1);
    assert_int_equal(r.status, 204);
    assert_int_equal(r.body_len, 0);
}

static void test_malformed(void **state)
{
    (void)state;
    static const char *bad[] = {
        "HTTP/1.1 2OO OK\r\nContent-Length: 2\r\n\r\nok",                  /* status line */
        "FOO BAR BAZ\r\n\r\n",                                              /* not HTTP */
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nx\r\n", /* chunk size */
        "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
        "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n",
        "HTTP/1.1 200 OK\r\nX\001Y: 1\r\n\r\n",
        "HTTP/1.1 200 OK\r\nX: a\001b\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        result r = both(bad[i], 0, 1);
        if (r.end != 2)
            fail_msg("case %zu: end %d, not an error", i, r.end);
    }
    /* bytes after the end of a Content-Length body */
    result r = both("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA", 0, 0);
    assert_int_equal(r.end, 3);
}

/* The dry run at the head sees what the rest of the same read holds. */
static void test_check_rest(void **state)
{
    (void)state;
    static const struct {
        const char *msg;
        int bad;
    } cases[] = {
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 1},
        {"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA", 1},
        {"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", 0},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", 0},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\no", 0},
        {"HTTP/1.0 200 OK\r\n\r\nanything at all", 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kvr_resp r;
        kvr_resp_init(&r);
        kvr_resp_reset(&r, 0);
        const char *m = cases[i].msg;
        size_t used = 0, pl = 0;
        const char *piece = NULL;
        assert_int_equal(kvr_resp_feed(&r, m, strlen(m), &used, &piece, &pl), KVR_RESP_HEAD);
        const char *why = NULL;
        int rc = kvr_resp_check_rest(&r, m + used, strlen(m) - used, &why);
        if ((rc < 0) != cases[i].bad)
            fail_msg("case %zu: check_rest %d", i, rc);
        if (rc < 0)
            assert_non_null(why);
        /* the parser itself is untouched: the real parse still gives the body */
        if (!cases[i].bad && strstr(m, "ok")) {
            kvr_resp_ev ev = kvr_resp_feed(&r, m + used, strlen(m) - used, &used, &piece, &pl);
            assert_int_equal(ev, KVR_RESP_BODY);
        }
        kvr_resp_free(&r);
    }
}

/* The usual head, whole in one read, is read by the fast path; fed a byte at a time (and with
 * the fast path off) http_parser reads it: every outcome must be the same. */
static void test_fast_path_agrees(void **state)
{
    (void)state;
    static const char *const msgs[] = {
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 5\r\n\r\nhello",
        "HTTP/1.1 200 OK\r\nContent-Length:  5 \r\nConnection: close\r\n\r\nhello",
        "HTTP/1.1 503 Busy\r\nConnection: keep-alive\r\nContent-Length: 2\r\nX-E:\r\n\r\n{}",
        "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: Upgrade\r\n\r\nhello",
        "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloEXTRA",
        "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
        "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nBad Name: 1\r\n\r\nhello",
        "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX: a\r\n b\r\n\r\nhello",
        "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort",
        /* Connection lists http_parser reads its own way (the CI fuzz crash of stop 32: the
         * fast path read ",close" as close, http_parser as keep-alive) */
        "HTTP/1.1 201 Created\r\nContent-Length: 3\r\nConnection:,close\r\n\r\nabc",
        "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\t\r\n\r\nabc",
        "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: a, /x, close\r\n\r\nabc",
        "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: keep-alive,,close\r\n\r\nabc",
        "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: te , close \r\n\r\nabc",
    };
    for (size_t i = 0; i < sizeof(msgs) / sizeof(*msgs); i++) {
        result fast = both(msgs[i], 0, 1), slow;
        kvr_resp_fast_path(0);
        parse(msgs[i], 0, 0, 1, &slow);
        kvr_resp_fast_path(1);
        assert_int_equal(fast.status, slow.status);
        assert_int_equal(fast.end, slow.end);
        assert_int_equal(fast.keep, slow.keep);
        assert_string_equal(fast.hdrs, slow.hdrs);
        assert_int_equal(fast.body_len, slow.body_len);
    }
    result r = both(msgs[13], 0, 1);
    assert_int_equal(r.keep, 0); /* a list of tokens naming close */
    r = both(msgs[9], 0, 1);
    assert_int_equal(r.keep, 1); /* http_parser reads ",close" as no close */
    r = both(msgs[1], 0, 1);
    assert_int_equal(r.end, 1);
    assert_int_equal(r.keep, 0); /* Connection: close */
    r = both(msgs[0], 0, 1);
    assert_int_equal(r.keep, 1);
    assert_int_equal(r.body_len, 5);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_content_length),
        cmocka_unit_test(test_chunked_extensions_trailers),
        cmocka_unit_test(test_interim_heads_skipped),
        cmocka_unit_test(test_read_to_close),
        cmocka_unit_test(test_head_and_no_content),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_check_rest),
        cmocka_unit_test(test_fast_path_agrees),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
