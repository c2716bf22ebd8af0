/* Circuit breaker: opens after N consecutive failures, one trial per cooldown in half_open,
 * cooldown doubling up to its cap and reset on close, 4xx/success resets the count, results of
 * non-trial requests ignored while half_open, client aborts free the trial slot. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "workers/breaker.h"

static const kvr_breaker_cfg cfg = {.failures = 3, .cooldown_ms = 100, .max_cooldown_ms = 350};

static void test_opens_after_consecutive_failures(void **state)
{
    (void)state;
    kvr_breaker b = {0};
    assert_true(kvr_breaker_admits(&b));
    assert_int_equal(kvr_breaker_on_result(&b, &cfg, 1, 0, 0), -1);
    assert_int_equal(kvr_breaker_on_result(&b, &cfg, 1, 0, 0), -1);
    assert_int_equal(kvr_breaker_on_result(&b, &cfg, 0, 0, 0), -1); /* a success resets */
    assert_int_equal(kvr_breaker_on_result(&b, &cfg, 1, 0, 0), -1);
    assert_int_equal(kvr_breaker_on_result(&b, &cfg, 1, 0, 0), -1);
    assert_int_equal(kvr_breaker_on_result(&b, &cfg, 1, 0, 10), KVR_BREAKER_OPEN);
    assert_false(kvr_breaker_admits(&b));
    assert_int_equal(b.open_until_ms, 110);
    assert_int_equal(kvr_breaker_tick(&b, 109), -1);
    assert_int_equal(kvr_breaker_tick(&b, 110), KVR_BREAKER_HALF_OPEN);
    assert_string_equal(kvr_breaker_state_name(b.state), "half_open");
}

static void test_half_open_one_trial(void **state)
{
    (void)state;
    kvr_breaker b = {0};
    for (int i = 0; i < 3; i++)
        kvr_breaker_on_result(&b, &cfg, 1, 0, 0);
    kvr_breaker_tick(&b, 100);
    assert_true(kvr_breaker_admits(&b));
    assert_int_equal(kvr_breaker_on_start(&b), 1);
    assert_false(kvr_breaker_admits(&b)); /* exactly one trial */
    assert_int_equal(kvr_breaker_on_start(&b), 0);
    /* an older request's success does not close it */
    assert_int_equal(kvr_breaker_on_result(&b, &cfg, 0, 0, 101), -1);
    /* the trial fails: open again for twice the cooldown */
    assert_int_equal(kvr_breaker_on_result(&b, &cfg, 1, 1, 120), KVR_BREAKER_OPEN);
    assert_int_equal(b.open_until_ms, 320);
    kvr_breaker_tick(&b, 320);
    kvr_breaker_on_start(&b);
    kvr_breaker_on_result(&b, &cfg, 1, 1, 330);
    assert_int_equal(b.open_until_ms, 330 + 350); /* 400 capped at 350 */
    kvr_breaker_tick(&b, 680);
    /* a client abort frees the slot; the next trial succeeds and closes it */
    assert_int_equal(kvr_breaker_on_start(&b), 1);
    kvr_breaker_on_abandon(&b, 1);
    assert_true(kvr_breaker_admits(&b));
    assert_int_equal(kvr_breaker_on_start(&b), 1);
    assert_int_equal(kvr_breaker_on_result(&b, &cfg, 0, 1, 700), KVR_BREAKER_CLOSED);
    assert_true(kvr_breaker_admits(&b));
    /* closed again: the next opening starts from the base cooldown */
    for (int i = 0; i < 3; i++)
        kvr_breaker_on_result(&b, &cfg, 1, 0, 800);
    assert_int_equal(b.open_until_ms, 900);
}

static void test_no_doubling_and_never(void **state)
{
    (void)state;
    kvr_breaker_cfg flat = {.failures = 1, .cooldown_ms = 50, .max_cooldown_ms = 50};
    kvr_breaker b = {0};
    assert_int_equal(kvr_breaker_on_result(&b, &flat, 1, 0, 0), KVR_BREAKER_OPEN);
    kvr_breaker_tick(&b, 50);
    kvr_breaker_on_start(&b);
    kvr_breaker_on_result(&b, &flat, 1, 1, 60);
    assert_int_equal(b.open_until_ms, 110);
    kvr_breaker_cfg never = {.failures = 0, .cooldown_ms = 50, .max_cooldown_ms = 50};
    kvr_breaker c = {0};
    for (int i = 0; i < 100; i++)
        assert_int_equal(kvr_breaker_on_result(&c, &never, 1, 0, 0), -1);
    assert_true(kvr_breaker_admits(&c));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_opens_after_consecutive_failures),
        cmocka_unit_test(test_half_open_one_trial),
        cmocka_unit_test(test_no_doubling_and_never),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
