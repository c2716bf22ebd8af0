/* lmcache_aware policy: ranking by free capacity, then load, then chance; neutral workers (no
 * answer, failed, stale) at the median free capacity of the known ones (0.5 when none);
 * cache_available=false below neutral. Fake workers, no loop. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "routing/policies.h"
#include "util/rand.h"
#include "util/time.h"

#define NW 5
#define A 0
#define B 1
#define C 2
#define D 3
#define E 4

typedef struct fx {
    kvr_worker w[NW];
    char url[NW][32];
    void *p;
} fx;

static const kvr_policy_ops *ops = &kvr_policy_lmcache_aware;

static int setup(void **state)
{
    fx *f = calloc(1, sizeof(*f));
    for (size_t i = 0; i < NW; i++) {
        snprintf(f->url[i], sizeof(f->url[i]), "http://127.0.0.1:%zu", 9001 + i);
        f->w[i] = (kvr_worker){.url = f->url[i], .id = i, .healthy = 1, .queue = -1,
                               .running = -1, .kv_usage = -1, .kv_tokens = -1,
                               .lmcache_occupancy = -1};
    }
    kvr_policy_cfg c;
    kvr_policy_cfg_default(&c);
    f->p = ops->create(&c, "m");
    assert_non_null(f->p);
    kvr_rand_seed(42);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    ops->destroy(f->p);
    free(f);
    return 0;
}

/* A fresh answer, as the poller leaves it. */
static void answer(kvr_worker *w, double occupancy, int available)
{
    uint64_t now = kvr_now_ms();
    w->lmcache_occupancy = occupancy;
    w->lmcache_available = available;
    w->lmcache_ok_ms = now;
    w->lmcache_fresh_until_ms = now + 60000;
}

/* The same answer, older than the freshness window. */
static void stale(kvr_worker *w, double occupancy)
{
    answer(w, occupancy, 1);
    w->lmcache_fresh_until_ms = kvr_now_ms() - 1;
}

/* Picks among the workers whose indices are listed (-1 ends the list); returns the index. */
static int pick(fx *f, const int *which)
{
    kvr_worker *el[NW];
    size_t n = 0;
    for (; which[n] >= 0; n++)
        el[n] = &f->w[which[n]];
    kvr_pick out = {0};
    assert_int_equal(ops->pick(f->p, el, n, NULL, &out), 0);
    assert_string_equal(out.decision, "lmcache_aware");
    assert_true(out.match < 0);
    assert_non_null(out.worker);
    return (int)(out.worker - f->w);
}

static void test_most_free_capacity_wins(void **state)
{
    fx *f = *state;
    answer(&f->w[A], 0.9, 1);
    answer(&f->w[B], 0.2, 1);
    answer(&f->w[C], 0.5, 1);
    f->w[B].inflight = 50; /* load only breaks ties of free capacity */
    for (int i = 0; i < 50; i++)
        assert_int_equal(pick(f, (int[]){A, B, C, -1}), B);
    assert_int_equal(pick(f, (int[]){A, C, -1}), C);
}

static void test_equal_capacity_lower_load_then_random(void **state)
{
    fx *f = *state;
    answer(&f->w[A], 0.3, 1);
    answer(&f->w[B], 0.3, 1);
    answer(&f->w[C], 0.8, 1);
    f->w[A].inflight = 2;
    f->w[B].inflight = 1;
    assert_int_equal(pick(f, (int[]){A, B, C, -1}), B);
    f->w[A].inflight = 1;
    int got[NW] = {0};
    for (int i = 0; i < 2000; i++)
        got[pick(f, (int[]){C, A, B, -1})]++;
    assert_int_equal(got[C], 0);
    assert_true(got[A] > 800 && got[B] > 800); /* uniform, not by list order */
}

static void test_neutral_ranks_at_the_median(void **state)
{
    fx *f = *state;
    answer(&f->w[A], 0.2, 1); /* free 0.8 */
    answer(&f->w[B], 0.9, 1); /* free 0.1 */
    answer(&f->w[C], 0.5, 1); /* free 0.5 */
    /* D never answered. Known frees {0.1, 0.5, 0.8}: D stands at 0.5, below A. */
    assert_int_equal(pick(f, (int[]){A, B, C, D, -1}), A);
    /* The median is over the eligible set: {0.1, 0.5} → 0.3, below C (A's answer is not in
     * this set, so it does not lift D). */
    assert_int_equal(pick(f, (int[]){B, C, D, -1}), C);
    /* {0.1, 0.5, 0.5} → 0.5: D ties C and E at the top, and load decides. */
    answer(&f->w[E], 0.5, 1);
    f->w[C].inflight = f->w[E].inflight = 1;
    assert_int_equal(pick(f, (int[]){B, C, E, D, -1}), D);
    f->w[D].inflight = 2;
    int got[NW] = {0};
    for (int i = 0; i < 400; i++)
        got[pick(f, (int[]){B, C, E, D, -1})]++;
    assert_true(got[C] > 100 && got[E] > 100 && got[C] + got[E] == 400);
    /* Never excluded, even beside the worst known worker: {0.1} → 0.1, a tie with B. */
    f->w[B].inflight = 3;
    assert_int_equal(pick(f, (int[]){B, D, -1}), D);
}

static void test_none_known_stands_at_half(void **state)
{
    fx *f = *state;
    /* Nothing known: everyone at 0.5, so load decides, then chance. */
    f->w[A].inflight = 1;
    assert_int_equal(pick(f, (int[]){A, B, -1}), B);
    f->w[A].inflight = 0;
    int got[NW] = {0};
    for (int i = 0; i < 1000; i++)
        got[pick(f, (int[]){A, B, C, -1})]++;
    assert_true(got[A] > 200 && got[B] > 200 && got[C] > 200);
    /* With one known worker the neutral ones stand at its free capacity: load decides. */
    answer(&f->w[C], 0.3, 1);
    f->w[C].inflight = 1;
    assert_int_equal(pick(f, (int[]){A, C, -1}), A);
}

static void test_unavailable_below_neutral(void **state)
{
    fx *f = *state;
    answer(&f->w[A], 0.0, 0); /* all free, but its cache says unavailable */
    answer(&f->w[B], 0.99, 1);
    /* below a known available worker with almost nothing free ... */
    assert_int_equal(pick(f, (int[]){A, B, -1}), B);
    /* ... and below a neutral one, however loaded */
    f->w[C].inflight = 100;
    assert_int_equal(pick(f, (int[]){A, C, -1}), C);
    /* among unavailable ones, free capacity still orders them */
    answer(&f->w[D], 0.5, 0);
    assert_int_equal(pick(f, (int[]){D, A, -1}), A);
    /* they do not move the median: B alone sets it (0.01), so neutral C ties B and the lower
     * load wins (with A's 1.0 counted, C would stand at 0.505 and win) */
    f->w[C].inflight = 1;
    assert_int_equal(pick(f, (int[]){A, B, C, -1}), B);
}

static void test_stale_and_failed_are_neutral(void **state)
{
    fx *f = *state;
    stale(&f->w[A], 0.0);     /* all free: the best by far if it counted */
    answer(&f->w[B], 0.6, 1); /* free 0.4 */
    answer(&f->w[C], 0.2, 1); /* free 0.8 */
    /* A stands at the median 0.6 */
    assert_int_equal(pick(f, (int[]){A, B, C, -1}), C);
    /* alone with B, at B's 0.4: a tie that load breaks */
    f->w[A].inflight = 5;
    assert_int_equal(pick(f, (int[]){A, B, -1}), B);
    answer(&f->w[D], 0.4, 1); /* free 0.6: known {0.4, 0.6}, A at 0.5 */
    assert_int_equal(pick(f, (int[]){A, B, D, -1}), D);
    f->w[D].inflight = 1; /* load never lifts a worker over more free capacity */
    assert_int_equal(pick(f, (int[]){A, B, D, -1}), D);
    /* a failed or malformed poll leaves occupancy -1: the same as never answered */
    answer(&f->w[E], 0.0, 1);
    f->w[E].lmcache_occupancy = -1;
    f->w[E].inflight = 5;
    assert_int_equal(pick(f, (int[]){E, B, -1}), B);
    f->w[E].inflight = 0;
    f->w[B].inflight = 1;
    assert_int_equal(pick(f, (int[]){E, B, -1}), E);
}

static void test_registered(void **state)
{
    (void)state;
    assert_ptr_equal(kvr_policy_find("lmcache_aware"), &kvr_policy_lmcache_aware);
    assert_non_null(strstr(kvr_policy_names(), "lmcache_aware"));
    assert_int_equal(ops->uses_keys, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_most_free_capacity_wins, setup, teardown),
        cmocka_unit_test_setup_teardown(test_equal_capacity_lower_load_then_random, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_neutral_ranks_at_the_median, setup, teardown),
        cmocka_unit_test_setup_teardown(test_none_known_stands_at_half, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unavailable_below_neutral, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stale_and_failed_are_neutral, setup, teardown),
        cmocka_unit_test_setup_teardown(test_registered, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
