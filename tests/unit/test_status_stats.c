/* The /status figures: the one-second trend ring (obs/trend.c) keeps 15 minutes and forgets
 * older seconds, ranges sum only what is still in the ring; recent samples give nearest-rank
 * quantiles within a time window (obs/samples.c); the aggregate (obs/status_stats.c) reports
 * the hit rate, 30 trend points, decision counts, rates and TTFT quantiles. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "obs/samples.h"
#include "obs/status_stats.h"
#include "obs/trend.h"

static kvr_trend g_t;

static void add(uint64_t sec, uint64_t req, uint64_t err, uint64_t prompt, uint64_t cached)
{
    kvr_trend_sums s = {req, err, prompt, cached};
    kvr_trend_add(&g_t, sec, &s);
}

static void test_trend_sums_and_wraps(void **st)
{
    (void)st;
    kvr_trend_init(&g_t);
    add(1000, 1, 0, 100, 50);
    add(1000, 1, 1, 100, 30);
    add(1001, 2, 0, 10, 10);
    kvr_trend_sums s = kvr_trend_range(&g_t, 1001, 1000, 1001);
    assert_int_equal(s.requests, 4);
    assert_int_equal(s.errors, 1);
    assert_int_equal(s.prompt, 210);
    assert_int_equal(s.cached, 90);
    s = kvr_trend_range(&g_t, 1001, 1001, 1001);
    assert_int_equal(s.requests, 2);
    /* 900 s later the slot of second 1000 is reused: the old second is gone */
    add(1000 + KVR_TREND_SPAN_S, 5, 0, 0, 0);
    s = kvr_trend_range(&g_t, 1000 + KVR_TREND_SPAN_S, 0, 1000 + KVR_TREND_SPAN_S);
    assert_int_equal(s.requests, 5 + 2);
    /* a range asked as of a later time drops what fell out of the span */
    s = kvr_trend_range(&g_t, 1001 + KVR_TREND_SPAN_S, 0, 5000);
    assert_int_equal(s.requests, 5);
    /* a second the ring moved past is ignored */
    add(1001, 9, 0, 0, 0);
    s = kvr_trend_range(&g_t, 1001 + KVR_TREND_SPAN_S, 0, 5000);
    assert_int_equal(s.requests, 5);
    /* second 0 is a second like any other */
    kvr_trend_init(&g_t);
    add(0, 3, 0, 0, 0);
    assert_int_equal(kvr_trend_range(&g_t, 0, 0, 0).requests, 3);
    assert_int_equal(kvr_trend_range(&g_t, 5, 6, 4).requests, 0); /* empty range */
}

static void test_samples_quantiles(void **st)
{
    (void)st;
    kvr_samples *s = kvr_samples_new(100);
    assert_non_null(s);
    double q[] = {0.5, 0.99, 0, 1}, out[4] = {-1, -1, -1, -1};
    assert_int_equal(kvr_samples_quantiles(s, 0, q, out, 4), 0);
    assert_true(out[0] == -1);
    for (int i = 1; i <= 100; i++)
        kvr_samples_add(s, i, 1000 + (uint64_t)i);
    assert_int_equal(kvr_samples_quantiles(s, 0, q, out, 4), 100);
    assert_true(out[0] == 50 && out[1] == 99 && out[2] == 1 && out[3] == 100);
    /* only the samples taken since 1091: 91..100 */
    assert_int_equal(kvr_samples_quantiles(s, 1091, q, out, 2), 10);
    assert_true(out[0] == 95 && out[1] == 100);
    /* full: the oldest go first */
    for (int i = 0; i < 50; i++)
        kvr_samples_add(s, 1000, 5000);
    assert_int_equal(kvr_samples_quantiles(s, 0, q, out, 4), 100);
    assert_true(out[2] == 51 && out[3] == 1000);
    kvr_samples_free(s);
    assert_null(kvr_samples_new(0));
    kvr_samples_free(NULL);
}

static void test_stats_json(void **st)
{
    (void)st;
    uint64_t t0 = 10000000; /* ms */
    kvr_status_stats *s = kvr_status_stats_new(16, t0);
    assert_non_null(s);
    json_t *o = json_object();
    kvr_status_stats_json(s, t0, 1700000000.5, o);
    assert_true(json_real_value(json_object_get(o, "hit_rate")) == 0);
    assert_true(json_is_null(json_object_get(json_object_get(o, "ttft_ms"), "p50")));
    assert_int_equal(json_array_size(json_object_get(o, "hit_rate_trend")),
                     KVR_STATUS_TREND_POINTS);
    json_decref(o);

    kvr_status_stats_tokens(s, t0 + 500, 1000, 750);
    kvr_status_stats_tokens(s, t0 + 600, -5, -1); /* counts as nothing */
    kvr_status_stats_request(s, t0 + 500, 200);
    kvr_status_stats_request(s, t0 + 1500, 502);
    kvr_status_stats_request(s, t0 + 1500, 404);
    kvr_status_stats_request(s, t0 + 1700, 200);
    kvr_status_stats_ttft(s, t0 + 100, 10);
    kvr_status_stats_ttft(s, t0 + 100, 30);
    kvr_status_stats_ttft(s, t0 + 100, -1); /* unknown: ignored */
    kvr_status_stats_decision(s, "prefix_match");
    kvr_status_stats_decision(s, "prefix_match");
    kvr_status_stats_decision(s, "session_id_match");
    kvr_status_stats_decision(s, NULL);
    o = json_object();
    kvr_status_stats_json(s, t0 + 1900, 1700000001.9, o);
    assert_true(json_real_value(json_object_get(o, "hit_rate")) == 0.75);
    assert_int_equal(json_integer_value(json_object_get(o, "prompt_tokens")), 1000);
    assert_int_equal(json_integer_value(json_object_get(o, "cached_tokens")), 750);
    /* 4 requests over the 2 seconds since start, 1 of them 5xx */
    assert_true(json_real_value(json_object_get(o, "requests_per_s")) == 2.0);
    assert_true(json_real_value(json_object_get(o, "error_rate")) == 0.25);
    json_t *dec = json_object_get(o, "decisions");
    assert_int_equal(json_object_size(dec), 2);
    assert_int_equal(json_integer_value(json_object_get(dec, "prefix_match")), 2);
    json_t *tt = json_object_get(o, "ttft_ms");
    assert_true(json_real_value(json_object_get(tt, "p50")) == 10);
    assert_true(json_real_value(json_object_get(tt, "p99")) == 30);
    assert_int_equal(json_integer_value(json_object_get(tt, "samples")), 2);
    json_t *trend = json_object_get(o, "hit_rate_trend");
    json_t *last = json_array_get(trend, KVR_STATUS_TREND_POINTS - 1);
    assert_true(json_real_value(json_object_get(last, "hit_rate")) == 0.75);
    assert_int_equal(json_integer_value(json_object_get(last, "prompt_tokens")), 1000);
    /* the last point starts 29 s before now; points are 30 s apart, oldest first */
    assert_int_equal(json_integer_value(json_object_get(last, "time")), 1700000001 - 29);
    json_t *first = json_array_get(trend, 0);
    assert_true(json_is_null(json_object_get(first, "hit_rate")));
    assert_int_equal(json_integer_value(json_object_get(first, "time")),
                     1700000001 - 29 - 30 * (KVR_STATUS_TREND_POINTS - 1));
    json_decref(o);

    /* 15 minutes later the tokens have left the trend but not the totals; the rates and
     * TTFTs are of recent requests only */
    o = json_object();
    kvr_status_stats_json(s, t0 + 1900 + 900000, 1700000901.9, o);
    assert_true(json_real_value(json_object_get(o, "hit_rate")) == 0.75);
    trend = json_object_get(o, "hit_rate_trend");
    for (size_t i = 0; i < json_array_size(trend); i++)
        assert_true(json_is_null(json_object_get(json_array_get(trend, i), "hit_rate")));
    assert_true(json_real_value(json_object_get(o, "requests_per_s")) == 0);
    assert_true(json_real_value(json_object_get(o, "error_rate")) == 0);
    assert_true(json_is_null(json_object_get(json_object_get(o, "ttft_ms"), "p50")));
    json_decref(o);
    kvr_status_stats_free(s);
}

static void test_stats_decision_labels_bounded(void **st)
{
    (void)st;
    kvr_status_stats *s = kvr_status_stats_new(1, 0);
    char label[16];
    for (int i = 0; i < KVR_STATUS_MAX_DECISIONS + 10; i++) {
        snprintf(label, sizeof(label), "d%d", i);
        kvr_status_stats_decision(s, label);
    }
    char long_label[100];
    memset(long_label, 'x', sizeof(long_label) - 1);
    long_label[99] = '\0';
    kvr_status_stats_decision(s, long_label);
    json_t *o = json_object();
    kvr_status_stats_json(s, 0, 0, o);
    assert_int_equal(json_object_size(json_object_get(o, "decisions")),
                     KVR_STATUS_MAX_DECISIONS);
    json_decref(o);
    kvr_status_stats_free(s);
    /* NULL stats: every recorder is a no-op */
    kvr_status_stats_request(NULL, 0, 500);
    kvr_status_stats_tokens(NULL, 0, 1, 1);
    kvr_status_stats_ttft(NULL, 0, 1);
    kvr_status_stats_decision(NULL, "x");
    kvr_status_stats_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trend_sums_and_wraps),
        cmocka_unit_test(test_samples_quantiles),
        cmocka_unit_test(test_stats_json),
        cmocka_unit_test(test_stats_decision_labels_bounded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
