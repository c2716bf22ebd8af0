/* kvroute-sim data parallelism: which rank X-data-parallel-rank (or round robin) picks, and
 * vLLM's per-rank KV-event endpoints (port + rank, _dp<rank> suffix). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "dp.h"
#include "kvevents.h"

static void test_header_names_the_rank(void **state)
{
    (void)state;
    kvr_sim_dp d = {.nranks = 4};
    char err[200];
    assert_int_equal(kvr_sim_dp_pick(&d, "2", err, sizeof(err)), 2);
    assert_int_equal(kvr_sim_dp_pick(&d, " 3 ", err, sizeof(err)), 3);
    assert_int_equal(kvr_sim_dp_pick(&d, "+0", err, sizeof(err)), 0);
    assert_int_equal(kvr_sim_dp_pick(&d, "-0", err, sizeof(err)), 0);
    /* a header never moves the round-robin cursor */
    assert_int_equal(d.next, 0);
}

static void test_round_robin_without_header(void **state)
{
    (void)state;
    kvr_sim_dp d = {.nranks = 3};
    char err[200];
    long got[7];
    for (int i = 0; i < 7; i++)
        got[i] = kvr_sim_dp_pick(&d, i == 3 ? "0" : NULL, err, sizeof(err));
    long want[7] = {0, 1, 2, 0, 0, 1, 2};
    assert_memory_equal(got, want, sizeof(got));
}

static void test_bad_values_are_refused(void **state)
{
    (void)state;
    kvr_sim_dp d = {.nranks = 2};
    char err[200];
    const char *bad[] = {"2", "-1", "", " ", "1.0", "one", "0x1", "99999999999999999999999"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        err[0] = 0;
        assert_int_equal(kvr_sim_dp_pick(&d, bad[i], err, sizeof(err)), -1);
        assert_non_null(strstr(err, "X-data-parallel-rank"));
    }
    kvr_sim_dp_pick(&d, "5", err, sizeof(err));
    assert_non_null(strstr(err, "out of range"));
    kvr_sim_dp_pick(&d, "x", err, sizeof(err));
    assert_non_null(strstr(err, "integer"));
    assert_int_equal(d.next, 0);
}

static void test_single_rank(void **state)
{
    (void)state;
    kvr_sim_dp d = {.nranks = 1};
    char err[200];
    for (int i = 0; i < 3; i++)
        assert_int_equal(kvr_sim_dp_pick(&d, NULL, err, sizeof(err)), 0);
    assert_int_equal(kvr_sim_dp_pick(&d, "1", err, sizeof(err)), -1);
}

static void test_offset_endpoint(void **state)
{
    (void)state;
    char out[64];
    assert_int_equal(kvr_sim_events_offset_endpoint("tcp://*:5557", 0, out, sizeof(out)), 0);
    assert_string_equal(out, "tcp://*:5557");
    assert_int_equal(kvr_sim_events_offset_endpoint("tcp://*:5557", 3, out, sizeof(out)), 0);
    assert_string_equal(out, "tcp://*:5560");
    assert_int_equal(kvr_sim_events_offset_endpoint("tcp://127.0.0.1:6000", 1, out, sizeof(out)),
                     0);
    assert_string_equal(out, "tcp://127.0.0.1:6001");
    assert_int_equal(kvr_sim_events_offset_endpoint("inproc://ev", 2, out, sizeof(out)), 0);
    assert_string_equal(out, "inproc://ev_dp2");
    assert_int_equal(kvr_sim_events_offset_endpoint("ipc:///tmp/ev", 1, out, sizeof(out)), 0);
    assert_string_equal(out, "ipc:///tmp/ev_dp1");
    assert_int_equal(kvr_sim_events_offset_endpoint("tcp://*:65535", 1, out, sizeof(out)), -1);
    assert_int_equal(kvr_sim_events_offset_endpoint("tcp://host", 1, out, sizeof(out)), -1);
    assert_int_equal(kvr_sim_events_offset_endpoint("tcp://*:55x", 1, out, sizeof(out)), -1);
    assert_int_equal(kvr_sim_events_offset_endpoint("udp://*:5557", 1, out, sizeof(out)), -1);
    assert_int_equal(kvr_sim_events_offset_endpoint("tcp://*:5557", 1, out, 8), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_header_names_the_rank),
        cmocka_unit_test(test_round_robin_without_header),
        cmocka_unit_test(test_bad_values_are_refused),
        cmocka_unit_test(test_single_rank),
        cmocka_unit_test(test_offset_endpoint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
