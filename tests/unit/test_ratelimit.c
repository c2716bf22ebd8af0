/* Per-key rate limits: requests per minute over a sliding window, tokens with settlement,
 * headers' values, keys without limits, a request bigger than the whole budget. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "proxy/ratelimit.h"

static void test_requests_per_minute(void **state)
{
    (void)state;
    kvr_rate_limit_spec s[] = {{.key = "alice", .requests_per_minute = 10}};
    kvr_ratelimits *rl = kvr_ratelimits_new(s, 1);
    kvr_ratelimit_info i;
    uint64_t t = 1000000;
    for (int k = 0; k < 10; k++) {
        assert_int_equal(kvr_ratelimit_take(rl, "alice", 5, t + (uint64_t)k * 1000, &i), 0);
        assert_int_equal(i.remaining_requests, (uint64_t)(9 - k));
        assert_int_equal(i.limit_requests, 10);
    }
    assert_int_equal(kvr_ratelimit_take(rl, "alice", 5, t + 10000, &i), 1);
    assert_int_equal(i.retry_after_s, 50); /* the first request leaves the minute at t+60 s */
    assert_int_equal(i.remaining_requests, 0);
    assert_int_equal(kvr_ratelimit_take(rl, "alice", 5, t + 60000, &i), 0);
    /* other keys are not limited and get no headers */
    assert_int_equal(kvr_ratelimit_take(rl, "bob", 5, t, &i), 0);
    assert_false(i.limited);
    assert_int_equal(kvr_ratelimit_take(rl, NULL, 5, t, &i), 0);
    kvr_ratelimits_free(rl);
}

static void test_tokens_settled(void **state)
{
    (void)state;
    kvr_rate_limit_spec s[] = {{.key = "k", .tokens_per_minute = 100}};
    kvr_ratelimits *rl = kvr_ratelimits_new(s, 1);
    kvr_ratelimit_info i;
    assert_int_equal(kvr_ratelimit_take(rl, "k", 500, 0, &i), 0); /* too big, window empty */
    assert_int_equal(kvr_ratelimit_take(rl, "k", 10, 1000, &i), 1);
    kvr_ratelimit_settle(rl, "k", -450, 1000); /* it really cost 50 */
    assert_int_equal(kvr_ratelimit_take(rl, "k", 40, 2000, &i), 0);
    assert_int_equal(i.remaining_tokens, 10);
    assert_int_equal(kvr_ratelimit_take(rl, "k", 20, 3000, &i), 1);
    assert_true(i.retry_after_s >= 1);
    kvr_ratelimits_free(rl);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_requests_per_minute),
        cmocka_unit_test(test_tokens_settled),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
