/* Percentiles (numpy "linear"), sample lists, time-weighted in-flight gauges, tallies. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>

#include "report.h"
#include "stats.h"

static void test_percentile_linear(void **state)
{
    (void)state;
    double v[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    /* numpy.percentile(range(1, 11), [0, 50, 90, 99, 100]) */
    assert_float_equal(kvr_bench_percentile_sorted(v, 10, 0), 1.0, 1e-12);
    assert_float_equal(kvr_bench_percentile_sorted(v, 10, 50), 5.5, 1e-12);
    assert_float_equal(kvr_bench_percentile_sorted(v, 10, 90), 9.1, 1e-12);
    assert_float_equal(kvr_bench_percentile_sorted(v, 10, 99), 9.91, 1e-12);
    assert_float_equal(kvr_bench_percentile_sorted(v, 10, 100), 10.0, 1e-12);
    double w[] = {15, 20, 35, 40, 50};
    assert_float_equal(kvr_bench_percentile_sorted(w, 5, 40), 29.0, 1e-12);
    /* Out-of-range q is clamped; one sample is every percentile; none is NAN. */
    assert_float_equal(kvr_bench_percentile_sorted(w, 5, 150), 50.0, 1e-12);
    assert_float_equal(kvr_bench_percentile_sorted(w, 5, -1), 15.0, 1e-12);
    assert_float_equal(kvr_bench_percentile_sorted(w, 1, 99), 15.0, 1e-12);
    assert_true(isnan(kvr_bench_percentile_sorted(w, 0, 50)));
}

static void test_samples(void **state)
{
    (void)state;
    kvr_bench_samples s = {0};
    assert_true(isnan(kvr_bench_samples_pct(&s, 50)));
    assert_true(isnan(kvr_bench_samples_mean(&s)));
    /* Unsorted input, more than the first allocation, NAN ignored. */
    for (int i = 1000; i >= 1; i--)
        assert_int_equal(kvr_bench_samples_add(&s, i), 0);
    assert_int_equal(kvr_bench_samples_add(&s, NAN), 0);
    assert_int_equal(s.n, 1000);
    assert_float_equal(kvr_bench_samples_pct(&s, 50), 500.5, 1e-9);
    assert_float_equal(kvr_bench_samples_pct(&s, 99), 990.01, 1e-9);
    assert_float_equal(kvr_bench_samples_mean(&s), 500.5, 1e-9);
    /* Adding after a query re-sorts. */
    kvr_bench_samples_add(&s, 0);
    assert_float_equal(kvr_bench_samples_pct(&s, 0), 0, 1e-12);
    kvr_bench_samples_free(&s);
    assert_null(s.v);
}

static void test_gauge(void **state)
{
    (void)state;
    const uint64_t S = 1000000000ull;
    kvr_bench_gauge g = {0};
    /* 0 for 1 s, 2 for 2 s, 1 for 1 s → area 5 over 4 s, mean 1.25, max 2. */
    kvr_bench_gauge_add(&g, 1, 1 * S);
    kvr_bench_gauge_add(&g, 1, 1 * S);
    kvr_bench_gauge_add(&g, -1, 3 * S);
    kvr_bench_gauge_add(&g, -1, 4 * S);
    assert_int_equal(g.cur, 0);
    assert_int_equal(g.max, 2);
    assert_float_equal(kvr_bench_gauge_mean(&g, 0, 4 * S), 1.25, 1e-9);
    /* The window may extend past the last change (value constant after it). */
    assert_float_equal(kvr_bench_gauge_mean(&g, 0, 5 * S), 1.0, 1e-9);
    kvr_bench_gauge_add(&g, 3, 5 * S);
    assert_float_equal(kvr_bench_gauge_mean(&g, 0, 6 * S), 8.0 / 6.0, 1e-9);
    assert_float_equal(kvr_bench_gauge_mean(&g, 6 * S, 6 * S), 0, 0);
}

static void test_tally_and_ratio(void **state)
{
    (void)state;
    kvr_bench_tally t = {0};
    for (int i = 0; i < 20; i++) {
        char name[16];
        snprintf(name, sizeof(name), "w%d", i % 10);
        assert_int_equal(kvr_bench_tally_add(&t, name, (uint64_t)i), i % 10);
    }
    assert_int_equal(t.n, 10);
    assert_int_equal(t.counts[3], 3 + 13);
    assert_int_equal(kvr_bench_tally_total(&t), 190);
    assert_int_equal(kvr_bench_tally_index(&t, "w9"), 9);
    kvr_bench_tally_free(&t);
    assert_int_equal(t.n, 0);
    assert_true(isnan(kvr_bench_ratio(1, 0)));
    assert_float_equal(kvr_bench_ratio(1, 4), 0.25, 0);
}

/* Summary: hit rate = Σcached/Σprompt over responses with usage; latency percentiles over
 * successful requests only; per-worker shares and load max/mean. */
static void test_summary(void **state)
{
    (void)state;
    kvr_bench_run run = {0};
    kvr_bench_record recs[4] = {
        {.error = -1, .worker = 0, .ttft_s = 0.1, .e2e_s = 1.0, .prompt_tokens = 100,
         .cached_tokens = 80, .completion_tokens = 10, .session_header = true},
        {.error = -1, .worker = 0, .ttft_s = 0.3, .e2e_s = 3.0, .prompt_tokens = 100,
         .cached_tokens = 0, .completion_tokens = 10},
        {.error = -1, .worker = 1, .ttft_s = 0.2, .e2e_s = 2.0, .prompt_tokens = 200,
         .cached_tokens = 160, .completion_tokens = 20},
        {.error = 0, .worker = -1, .ttft_s = NAN, .e2e_s = 9.0, .prompt_tokens = -1,
         .cached_tokens = -1, .completion_tokens = -1},
    };
    run.records = recs;
    run.nrecords = 4;
    run.planned = 5;
    run.elapsed_s = 2.0;
    run.start_ns = 0;
    run.end_ns = 2000000000ull;
    kvr_bench_tally_add(&run.errors, "http_503", 1);
    kvr_bench_tally_add(&run.workers, "http://a", 2);
    kvr_bench_tally_add(&run.workers, "http://b", 1);
    kvr_bench_tally_add(&run.decisions, "prefix_match", 3);
    kvr_bench_summary s;
    assert_int_equal(kvr_bench_summarize(&run, &s), 0);
    assert_int_equal(s.requests, 4);
    assert_int_equal(s.ok, 3);
    assert_int_equal(s.errors, 1);
    assert_int_equal(s.with_usage, 3);
    assert_int_equal(s.session_header, 1);
    assert_int_equal(s.prompt_tokens, 400);
    assert_int_equal(s.cached_tokens, 240);
    assert_float_equal(s.hit_rate, 0.6, 1e-12);
    assert_float_equal(s.ttft_p50, 0.2, 1e-12);
    assert_float_equal(s.e2e_p50, 2.0, 1e-12);
    assert_float_equal(s.e2e_p99, 2.98, 1e-12); /* the failed request's 9 s is not in it */
    assert_float_equal(s.output_tok_s, 20.0, 1e-12);
    assert_int_equal(s.nworkers, 2);
    assert_float_equal(s.workers[0].share, 2.0 / 3.0, 1e-12);
    assert_float_equal(s.load_max_over_mean, 2.0 / 1.5, 1e-12);
    json_t *j = kvr_bench_summary_json(&s, NULL);
    assert_non_null(j);
    assert_float_equal(json_real_value(json_object_get(j, "hit_rate")), 0.6, 1e-12);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "errors_by_kind"), "http_503")), 1);
    assert_true(json_is_object(json_object_get(json_object_get(j, "workers"), "http://b")));
    json_decref(j);
    kvr_bench_summary_free(&s);
    run.records = NULL;
    kvr_bench_run_free(&run);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_percentile_linear),
        cmocka_unit_test(test_samples),
        cmocka_unit_test(test_gauge),
        cmocka_unit_test(test_tally_and_ratio),
        cmocka_unit_test(test_summary),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
