/* W3C traceparent (obs/traceparent.c) and the trace decisions of obs/otlp.c: the spec's
 * example parses; shape, case, version and all-zero rules; formatting round-trips; a client's
 * sampled flag is followed; without one the sample ratio decides; attempts get fresh span ids
 * within the same trace. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "obs/otlp.h"
#include "obs/traceparent.h"
#include "util/time.h"

#define EXAMPLE "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

static int parse(const char *s, kvr_trace_parent *p)
{
    return kvr_traceparent_parse(s, strlen(s), p);
}

static void test_parse_valid(void **st)
{
    (void)st;
    kvr_trace_parent p;
    assert_int_equal(parse(EXAMPLE, &p), 0);
    assert_int_equal(p.trace_id[0], 0x0a);
    assert_int_equal(p.trace_id[15], 0x9c);
    assert_int_equal(p.span_id[0], 0xb7);
    assert_int_equal(p.span_id[7], 0x31);
    assert_int_equal(p.flags, 1);
    char out[KVR_TRACEPARENT_LEN + 1];
    kvr_traceparent_format(p.trace_id, p.span_id, p.flags, out);
    assert_string_equal(out, EXAMPLE);
    /* A later version may carry more fields: the first 55 bytes are read as version 00. */
    assert_int_equal(parse("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00-xyz", &p), 0);
    assert_int_equal(p.flags, 0);
    assert_int_equal(parse("cc-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", &p), 0);
}

static void test_parse_invalid(void **st)
{
    (void)st;
    kvr_trace_parent p;
    const char *bad[] = {
        "",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0",     /* short */
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-",   /* 00 has no more */
        "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",    /* uppercase */
        "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",    /* version ff */
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",    /* zero trace id */
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",    /* zero parent id */
        "00_0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",    /* separator */
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0g",    /* hex */
        "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01x",   /* later version, no '-' */
        "0-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01a",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        memset(&p, 0x5a, sizeof(p));
        assert_int_equal(parse(bad[i], &p), -1);
        assert_int_equal(p.flags, 0x5a); /* untouched on failure */
    }
    assert_int_equal(kvr_traceparent_parse(NULL, 0, &p), -1);
}

static void test_random_ids(void **st)
{
    (void)st;
    uint8_t a[16], b[16];
    kvr_trace_random_id(a, 16);
    kvr_trace_random_id(b, 16);
    assert_memory_not_equal(a, b, 16);
    static const uint8_t zero[16];
    assert_memory_not_equal(a, zero, 16);
}

/* A stand-in exporter: kvr_trace_begin only reads its sample ratio, and NULL means "off". */
static kvr_otlp *exporter(uv_loop_t *loop, kvr_upstream **up, kvr_metrics **m, double ratio)
{
    kvr_otlp_cfg c;
    kvr_otlp_cfg_default(&c);
    c.endpoint = "http://127.0.0.1:9/v1/traces";
    c.sample_ratio = ratio;
    kvr_upstream_opts o;
    kvr_upstream_opts_default(&o);
    *up = kvr_upstream_new(loop, &o);
    *m = kvr_metrics_new();
    return kvr_otlp_new(loop, *up, *m, &c);
}

static void shut(uv_loop_t *loop, kvr_otlp *o, kvr_upstream *up, kvr_metrics *m)
{
    kvr_otlp_close(o);
    kvr_upstream_close(up);
    uv_run(loop, UV_RUN_DEFAULT);
    uv_loop_close(loop);
    kvr_metrics_free(m);
}

static void test_trace_decisions(void **st)
{
    (void)st;
    uv_loop_t loop;
    uv_loop_init(&loop);
    kvr_upstream *up;
    kvr_metrics *m;
    kvr_req_trace t;
    assert_int_equal(kvr_trace_begin(NULL, &t, EXAMPLE, kvr_now_ns()), 0);
    assert_int_equal(t.on, 0);

    kvr_otlp *o = exporter(&loop, &up, &m, 0.0);
    /* The client's sampled flag wins over a ratio of 0 (parent-based sampling). */
    assert_int_equal(kvr_trace_begin(o, &t, EXAMPLE, kvr_now_ns()), 1);
    assert_true(t.on && t.sampled && t.has_parent);
    const char *tp = kvr_trace_attempt(&t);
    assert_int_equal(strlen(tp), KVR_TRACEPARENT_LEN);
    assert_memory_equal(tp, EXAMPLE, 36); /* same version and trace id */
    assert_memory_not_equal(tp + 36, EXAMPLE + 36, 16); /* our attempt span, not the client's */
    assert_string_equal(tp + 52, "-01");
    char first[KVR_TRACEPARENT_LEN + 1];
    strcpy(first, tp);
    assert_string_not_equal(kvr_trace_attempt(&t), first); /* every attempt its own span */
    /* Not sampled by the client: nothing recorded, the flag passed on. */
    kvr_trace_begin(o, &t, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00",
                    kvr_now_ns());
    assert_int_equal(t.sampled, 0);
    assert_string_equal(kvr_trace_attempt(&t) + 52, "-00");
    /* No (valid) parent: a new trace, sampled by the ratio (0 here). */
    assert_int_equal(kvr_trace_begin(o, &t, "garbage", kvr_now_ns()), 0);
    assert_int_equal(t.sampled, 0);
    assert_memory_not_equal(kvr_trace_attempt(&t) + 3, EXAMPLE + 3, 32);
    shut(&loop, o, up, m);

    uv_loop_init(&loop);
    o = exporter(&loop, &up, &m, 1.0);
    assert_int_equal(kvr_trace_begin(o, &t, NULL, kvr_now_ns()), 0);
    assert_true(t.sampled);
    assert_string_equal(kvr_trace_attempt(&t) + 52, "-01");
    /* The request's clock: an instant 1 ms after arrival is 1 ms after its wall time. */
    assert_true(kvr_trace_unix_ns(&t, t.start_mono_ns + 1000000) == t.start_unix_ns + 1000000);
    shut(&loop, o, up, m);

    uv_loop_init(&loop);
    o = exporter(&loop, &up, &m, 0.5);
    int sampled = 0;
    for (int i = 0; i < 2000; i++) {
        kvr_trace_begin(o, &t, NULL, kvr_now_ns());
        sampled += t.sampled;
    }
    assert_in_range(sampled, 800, 1200);
    shut(&loop, o, up, m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_valid),
        cmocka_unit_test(test_parse_invalid),
        cmocka_unit_test(test_random_ids),
        cmocka_unit_test(test_trace_decisions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
