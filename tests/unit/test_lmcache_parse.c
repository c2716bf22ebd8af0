/* LMCache status answers: what kvr_lmcache_parse accepts as well-formed and what it calls
 * malformed (which makes the worker neutral). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "workers/lmcache.h"

static int parse(const char *s, double *occ, int *avail)
{
    *occ = -7;
    *avail = -7;
    return kvr_lmcache_parse(s, strlen(s), occ, avail);
}

static void test_well_formed(void **state)
{
    (void)state;
    double o;
    int a;
    assert_int_equal(parse("{\"occupancy\": 0.25, \"cache_available\": true}", &o, &a), 0);
    assert_true(o == 0.25 && a == 1);
    assert_int_equal(parse("{\"cache_available\":false,\"occupancy\":1}", &o, &a), 0);
    assert_true(o == 1 && a == 0);
    assert_int_equal(parse("{\"occupancy\":0,\"cache_available\":true,\"extra\":[1]}", &o, &a),
                     0);
    assert_true(o == 0 && a == 1);
    assert_int_equal(parse(" {\"occupancy\":1e-3,\"cache_available\":true}\n", &o, &a), 0);
    assert_true(o == 1e-3);
}

static void test_malformed(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "",
        "not json",
        "[0.5, true]",
        "0.5",
        "{\"occupancy\": 0.5}",
        "{\"cache_available\": true}",
        "{\"occupancy\": 1.5, \"cache_available\": true}",
        "{\"occupancy\": -0.1, \"cache_available\": true}",
        "{\"occupancy\": \"0.5\", \"cache_available\": true}",
        "{\"occupancy\": null, \"cache_available\": true}",
        "{\"occupancy\": 0.5, \"cache_available\": 1}",
        "{\"occupancy\": 0.5, \"cache_available\": \"true\"}",
        "{\"occupancy\": 0.5, \"cache_available\": true",
        "{\"occupancy\": 1e999, \"cache_available\": true}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        double o;
        int a;
        if (parse(bad[i], &o, &a) != -1)
            fail_msg("accepted: %s", bad[i]);
        assert_true(o == -7 && a == -7); /* nothing written */
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_well_formed),
        cmocka_unit_test(test_malformed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
