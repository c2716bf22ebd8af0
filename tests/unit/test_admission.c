/* Admission queue: bound, FIFO within a key, round robin across keys, a waiter that cannot
 * start keeps its place and holds its key's later ones, removal, oldest. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "proxy/admission.h"

typedef struct log {
    const char *order[64];
    size_t n, budget;
    const kvr_waiter *refuse; /* this one cannot start */
} log;

static int start(void *ud, kvr_waiter *w)
{
    log *l = ud;
    if (w == l->refuse || l->budget == 0)
        return 0;
    l->budget--;
    l->order[l->n++] = w->key;
    return 1;
}

static void test_fair_round_robin(void **state)
{
    (void)state;
    kvr_admission *q = kvr_admission_new(100);
    kvr_waiter a[6] = {0}, b[2] = {0};
    for (int i = 0; i < 6; i++) {
        a[i].key = "A";
        a[i].since_ms = (uint64_t)i;
        assert_int_equal(kvr_admission_push(q, &a[i]), 0);
    }
    for (int i = 0; i < 2; i++) {
        b[i].key = "B";
        b[i].since_ms = 10 + (uint64_t)i;
        assert_int_equal(kvr_admission_push(q, &b[i]), 0);
    }
    log l = {.budget = 4};
    assert_int_equal(kvr_admission_dispatch(q, start, &l), 4);
    /* A's burst came first, yet B gets every other turn */
    const char *want[] = {"A", "B", "A", "B"};
    for (int i = 0; i < 4; i++)
        assert_string_equal(l.order[i], want[i]);
    assert_int_equal(kvr_admission_depth(q), 4);
    assert_ptr_equal(kvr_admission_oldest(q), &a[2]);
    kvr_admission_free(q);
}

static void test_bound_remove_and_blocked_head(void **state)
{
    (void)state;
    kvr_admission *q = kvr_admission_new(2);
    kvr_waiter w[3] = {{.key = "k"}, {.key = "k"}, {.key = "k"}};
    assert_int_equal(kvr_admission_push(q, &w[0]), 0);
    assert_int_equal(kvr_admission_push(q, &w[1]), 0);
    assert_int_equal(kvr_admission_push(q, &w[2]), -1); /* full */
    log l = {.budget = 10, .refuse = &w[0]};
    assert_int_equal(kvr_admission_dispatch(q, start, &l), 0); /* FIFO: w[1] waits behind */
    assert_true(w[0].queued && w[1].queued);
    kvr_admission_remove(q, &w[0]);
    assert_false(w[0].queued);
    kvr_admission_remove(q, &w[0]); /* no-op */
    assert_int_equal(kvr_admission_depth(q), 1);
    assert_int_equal(kvr_admission_dispatch(q, start, &l), 1);
    assert_int_equal(kvr_admission_depth(q), 0);
    assert_null(kvr_admission_oldest(q));
    kvr_admission_set_max(q, 0);
    assert_int_equal(kvr_admission_push(q, &w[2]), -1);
    kvr_admission_free(q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fair_round_robin),
        cmocka_unit_test(test_bound_remove_and_blocked_head),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
