/* Rate sweeps: rate lists, automatic rates, the saturation test, window summaries in model time
 * (TTFT, ITL, goodput, per-worker busy share). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>

#include "report.h"
#include "stats.h"
#include "sweep.h"

static void test_parse_rates(void **state)
{
    (void)state;
    double r[4];
    assert_int_equal(kvr_bench_sweep_parse_rates("1,2.5,0.25", r, 4), 3);
    assert_float_equal(r[0], 1, 1e-12);
    assert_float_equal(r[1], 2.5, 1e-12);
    assert_float_equal(r[2], 0.25, 1e-12);
    assert_int_equal(kvr_bench_sweep_parse_rates("3", r, 4), 1);
    const char *bad[] = {"", "1,", ",1", "1,,2", "0", "-1", "nan", "inf", "1x", "1;2", "1,2,3,4,5"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(kvr_bench_sweep_parse_rates(bad[i], r, 4), -1);
    assert_int_equal(kvr_bench_sweep_parse_rates(NULL, r, 4), -1);
}

static void test_auto_rates(void **state)
{
    (void)state;
    double r[6];
    kvr_bench_sweep_auto_rates(10, 6, r);
    assert_float_equal(r[0], 1, 1e-9);
    assert_float_equal(r[5], 12, 1e-9);
    for (int i = 1; i < 6; i++)
        assert_true(r[i] > r[i - 1]);
    kvr_bench_sweep_auto_rates(2, 2, r);
    assert_float_equal(r[0], 0.2, 1e-9);
    assert_float_equal(r[1], 2.4, 1e-9);
}

static void test_saturated(void **state)
{
    (void)state;
    kvr_bench_summary s = {0};
    assert_true(kvr_bench_sweep_saturated(&s)); /* nothing finished */
    s.requests = 100;
    s.goodput = 0.95;
    assert_false(kvr_bench_sweep_saturated(&s));
    s.goodput = 0.89;
    assert_true(kvr_bench_sweep_saturated(&s));
    s.goodput = 1;
    s.errors = 6;
    assert_true(kvr_bench_sweep_saturated(&s));
}

static kvr_bench_record rec(double start, double ttft, double e2e, int64_t tokens, int worker)
{
    kvr_bench_record r = {0};
    r.error = -1;
    r.worker = worker;
    r.start_s = start;
    r.ttft_s = ttft;
    r.e2e_s = e2e;
    r.prompt_tokens = 100;
    r.cached_tokens = 50;
    r.completion_tokens = tokens;
    return r;
}

/* Wall times at time scale 0.1: every reported time is ten times the wall time. */
static void test_window_model_time_and_goodput(void **state)
{
    (void)state;
    kvr_bench_record recs[4] = {
        rec(0.0, 0.010, 0.100, 10, 0),  /* TTFT 0.1 s, ITL (0.09/9)*10 = 0.1 s: good */
        rec(0.1, 0.300, 0.310, 2, 1),   /* TTFT 3 s: misses the TTFT SLO */
        rec(0.2, 0.020, 0.920, 10, 1),  /* ITL (0.9/9)*10 = 1 s: misses the ITL SLO */
        rec(0.3, 0.001, 0.001, 1, 0),   /* one token: TTFT only, good */
    };
    kvr_bench_run run = {0};
    run.records = recs;
    run.nrecords = 4;
    run.model_per_wall = 10;
    run.slo_ttft_s = 2;
    run.slo_itl_s = 0.15;
    char *names[] = {"a", "b"};
    uint64_t counts[] = {2, 2};
    run.workers.names = names;
    run.workers.counts = counts;
    run.workers.n = 2;
    kvr_bench_gauge g[2] = {0};
    kvr_bench_gauge_add(&g[0], 1, 1000000000ull);  /* a busy from 1 s to 1.5 s */
    kvr_bench_gauge_add(&g[0], -1, 1500000000ull);
    kvr_bench_gauge_add(&g[1], 1, 1000000000ull);  /* b busy from 1 s to the end */
    run.inflight = g;
    run.inflight_cap = 2;
    kvr_bench_window w = {.from = 0, .to = 4, .start_ns = 1000000000ull, .end_ns = 2000000000ull};
    kvr_bench_summary s;
    assert_int_equal(kvr_bench_summarize_window(&run, &w, &s), 0);
    assert_int_equal(s.requests, 4);
    assert_int_equal(s.ok, 4);
    assert_int_equal(s.good, 2);
    assert_float_equal(s.goodput, 0.5, 1e-12);
    assert_float_equal(s.elapsed_s, 10, 1e-9); /* one wall second */
    assert_float_equal(s.wall_s, 1, 1e-9);
    assert_true(s.ttft_p50 <= s.ttft_p90 && s.ttft_p90 <= s.ttft_p99);
    assert_float_equal(s.ttft_p99, 0.2 + 0.97 * 2.8, 1e-9); /* TTFTs 0.01, 0.1, 0.2, 3 */
    assert_float_equal(s.itl_p50, 0.1, 1e-9); /* ITLs 0.1, 0.1, 1 */
    assert_float_equal(s.itl_p90, 0.82, 1e-9);
    /* Offered: 4 sends over 0.3 wall s = 3 model s; achieved: 4 over 0 to 1.12 wall s. */
    assert_float_equal(s.offered_rps, 4 / 3.0, 1e-9);
    assert_float_equal(s.achieved_rps, 4 / 11.2, 1e-9);
    assert_int_equal(s.nworkers, 2);
    assert_int_equal(s.workers[0].requests, 2);
    assert_float_equal(s.workers[0].busy_share, 0.5, 1e-9);
    assert_float_equal(s.workers[1].busy_share, 1.0, 1e-9);
    kvr_bench_summary_free(&s);
    /* A failed request counts against goodput and has no ITL. */
    recs[0].error = 0;
    assert_true(isnan(kvr_bench_record_itl(&recs[0])));
    assert_int_equal(kvr_bench_summarize_window(&run, &w, &s), 0);
    assert_int_equal(s.good, 1);
    assert_float_equal(s.goodput, 0.25, 1e-12);
    kvr_bench_summary_free(&s);
}

static void test_gauge_busy(void **state)
{
    (void)state;
    kvr_bench_gauge g = {0};
    assert_float_equal(kvr_bench_gauge_busy_until(&g, 5000000000ull), 0, 1e-12);
    kvr_bench_gauge_add(&g, 1, 1000000000ull);
    kvr_bench_gauge_add(&g, 1, 2000000000ull);  /* two in flight: still busy once */
    kvr_bench_gauge_add(&g, -2, 3000000000ull);
    kvr_bench_gauge_add(&g, 1, 4000000000ull);
    assert_float_equal(kvr_bench_gauge_busy_until(&g, 3500000000ull), 2, 1e-9);
    assert_float_equal(kvr_bench_gauge_busy_until(&g, 4500000000ull), 2.5, 1e-9);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_rates),
        cmocka_unit_test(test_auto_rates),
        cmocka_unit_test(test_saturated),
        cmocka_unit_test(test_window_model_time_and_goodput),
        cmocka_unit_test(test_gauge_busy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
