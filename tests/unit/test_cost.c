/* cost policy: the formula ((pending + uncached) × seconds per token), the learned speed
 * (decayed milliseconds above the fastest first byte over the tokens they covered, equal until
 * measured),
 * pending prefill from prefill_start to prefill_end, the session's 2× slack, random ties, and
 * the /debug/route rows. Fake workers, no loop. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "routing/policies.h"
#include "routing/policy_cost.h"
#include "util/rand.h"

#define NW 3

typedef struct fx {
    kvr_worker w[NW];
    char url[NW][32];
    kvr_worker *el[NW];
    void *p;
} fx;

static const kvr_policy_ops *ops = &kvr_policy_cost;

static fx *make(void)
{
    fx *f = calloc(1, sizeof(*f));
    for (size_t i = 0; i < NW; i++) {
        snprintf(f->url[i], sizeof(f->url[i]), "http://127.0.0.1:%zu", 9001 + i);
        f->w[i] = (kvr_worker){.url = f->url[i], .id = i, .healthy = 1, .queue = -1,
                               .running = -1, .kv_usage = -1, .kv_tokens = -1,
                               .lmcache_occupancy = -1};
        f->el[i] = &f->w[i];
    }
    kvr_policy_cfg c;
    kvr_policy_cfg_default(&c);
    f->p = ops->create(&c, "m");
    assert_non_null(f->p);
    return f;
}

static void done(fx *f)
{
    ops->destroy(f->p);
    free(f);
}

static kvr_route_keys keys(const char *session, const char *text)
{
    return (kvr_route_keys){.session = session, .session_len = session ? strlen(session) : 0,
                            .text = text, .text_len = text ? strlen(text) : 0};
}

static kvr_pick pick(fx *f, const char *session, const char *text)
{
    kvr_route_keys k = keys(session, text);
    kvr_pick out = {.match = -1};
    assert_int_equal(ops->pick(f->p, f->el, NW, &k, &out), 0);
    return out;
}

/* A text of `n` bytes, distinct per seed. */
static char *text_n(size_t n, uint64_t seed)
{
    char *t = malloc(n + 1);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        t[i] = (char)('a' + (seed >> 59) % 26);
    }
    t[n] = 0;
    return t;
}

static void test_formula(void **state)
{
    (void)state;
    assert_true(kvr_cost_uncached(1000, 600) == 400);
    assert_true(kvr_cost_uncached(1000, 1000) == 1); /* the last token is always computed */
    assert_true(kvr_cost_uncached(10, 50) == 1);
    assert_float_equal(kvr_cost_predict(300, 100, 2e-5), 400 * 2e-5, 1e-15);
    /* The speed: milliseconds above the fastest first byte (the fixed part), over tokens. */
    kvr_prefill_rate r = {0};
    assert_true(kvr_prefill_rate_spt(&r) == 0);
    kvr_prefill_rate_observe(&r, 1, 2); /* one token in 2 ms: the floor */
    assert_true(kvr_prefill_rate_spt(&r) == 0);
    kvr_prefill_rate_observe(&r, 1000, 27); /* 25 ms above it for 1000 tokens */
    assert_float_equal(kvr_prefill_rate_spt(&r), 25 / 1000.95 / 1000, 1e-15);
    /* A worker serving mostly cache hits (a few tokens at the floor) does not look slow per
     * token: a plain ratio would say (2 × 20 + 27) / 1020 ms per token, 2.6 × the truth. */
    kvr_prefill_rate h = {0};
    for (int i = 0; i < 20; i++)
        kvr_prefill_rate_observe(&h, 1, 2);
    kvr_prefill_rate_observe(&h, 1000, 27);
    assert_true(kvr_prefill_rate_spt(&h) < 26e-6 && kvr_prefill_rate_spt(&h) > 24e-6);
    /* Long prefills weigh more than short ones: a ratio of sums, not a mean of ratios. */
    kvr_prefill_rate a = {0};
    kvr_prefill_rate_observe(&a, 1, 2);
    kvr_prefill_rate_observe(&a, 2000, 52);
    kvr_prefill_rate_observe(&a, 10, 3);
    double ms = (2 * 0.95 + 52) * 0.95 + 3, n = (0.95 + 1) * 0.95 + 1;
    double tok = (0.95 + 2000) * 0.95 + 10;
    assert_float_equal(kvr_prefill_rate_spt(&a), (ms - 2 * n) / 1000 / tok, 1e-15);
    /* After a change of speed the estimate follows. */
    for (int i = 0; i < 200; i++)
        kvr_prefill_rate_observe(&r, 1000, 102);
    assert_float_equal(kvr_prefill_rate_spt(&r), 100e-6, 1e-9);
}

static void test_repeat_goes_where_cached(void **state)
{
    (void)state;
    kvr_rand_seed(11);
    fx *f = make();
    char *p = text_n(8000, 1);
    kvr_pick out = pick(f, NULL, p);
    assert_string_equal(out.decision, "min_cost");
    assert_true(out.match == 0 && out.prefill_tokens == 2000); /* 8000 bytes / 4 */
    kvr_route_keys k = keys(NULL, p);
    ops->teach(f->p, f->el[1], &k);
    for (int i = 0; i < 10; i++) {
        out = pick(f, NULL, p);
        assert_ptr_equal(out.worker, f->el[1]);
        assert_true(out.match == 1 && out.prefill_tokens == 1);
    }
    /* Even busy with other prefill, it stays cheaper than computing 2000 tokens again. */
    assert_true(ops->prefill_start(f->p, f->el[1], 1500) == 0);
    assert_ptr_equal(pick(f, NULL, p).worker, f->el[1]);
    /* Not with more pending than the whole prompt. */
    assert_true(ops->prefill_start(f->p, f->el[1], 600) == 1500);
    assert_ptr_not_equal(pick(f, NULL, p).worker, f->el[1]);
    ops->prefill_end(f->p, f->el[1], 600, 1500, -1);
    ops->prefill_end(f->p, f->el[1], 1500, 0, -1);
    assert_ptr_equal(pick(f, NULL, p).worker, f->el[1]);
    free(p);
    done(f);
}

static void test_distinct_prompts_spread(void **state)
{
    (void)state;
    kvr_rand_seed(12);
    fx *f = make();
    /* Equal prompts sent while nothing answered: each pick sees the pending prefill of the
     * earlier ones and the fleet fills evenly. */
    int count[NW] = {0};
    for (int i = 0; i < 30; i++) {
        char *t = text_n(4000, 100 + (uint64_t)i);
        kvr_pick out = pick(f, NULL, t);
        ops->prefill_start(f->p, out.worker, out.prefill_tokens);
        count[out.worker->id]++;
        free(t);
    }
    for (int i = 0; i < NW; i++)
        assert_int_equal(count[i], 10);
    /* Idle and equal: ties are random, never list order. */
    fx *g = make();
    int seen[NW] = {0};
    for (int i = 0; i < 60; i++)
        seen[pick(g, NULL, "one short prompt").worker->id]++;
    for (int i = 0; i < NW; i++)
        assert_true(seen[i] > 5);
    done(g);
    done(f);
}

/* One attempt on `w`: sent with `tokens`, first streamed byte after `ms`. */
static void measure(fx *f, kvr_worker *w, double tokens, double ms)
{
    double ahead = ops->prefill_start(f->p, w, tokens);
    ops->prefill_end(f->p, w, tokens, ahead, ms);
}

static void test_learned_speed(void **state)
{
    (void)state;
    kvr_rand_seed(13);
    fx *f = make();
    char *t = text_n(4000, 7);
    /* Worker 0 measured 4× slower than worker 1 (same 2 ms floor); worker 2 unmeasured counts
     * at their mean. */
    measure(f, f->el[0], 1, 2);
    measure(f, f->el[0], 1000, 102);
    measure(f, f->el[1], 1, 2);
    measure(f, f->el[1], 1000, 27);
    double s0 = 100 / 1000.95 / 1000, s1 = 25 / 1000.95 / 1000;
    kvr_route_keys k = keys(NULL, t);
    kvr_explain_row rows[NW];
    kvr_pick out = {0};
    assert_int_equal(ops->explain(f->p, f->el, NW, &k, rows, &out), 0);
    assert_float_equal(rows[0].seconds_per_token, s0, 1e-15);
    assert_float_equal(rows[1].seconds_per_token, s1, 1e-15);
    assert_float_equal(rows[2].seconds_per_token, (s0 + s1) / 2, 1e-15);
    for (int i = 0; i < NW; i++) {
        assert_int_equal(rows[i].scored, 2);
        assert_true(rows[i].prefill_uncached == 1000 && rows[i].prefill_pending == 0);
        assert_float_equal(rows[i].score, 1000 * rows[i].seconds_per_token, 1e-12);
    }
    assert_ptr_equal(out.worker, f->el[1]);
    /* The fast one takes work until its pending prefill outweighs the speed difference:
     * (p + 1000) × s1 > 1000 × (s0 + s1) / 2 from p > 1500. */
    ops->prefill_start(f->p, f->el[1], 1000);
    assert_ptr_equal(pick(f, NULL, t).worker, f->el[1]);
    ops->prefill_start(f->p, f->el[1], 600);
    assert_ptr_equal(pick(f, NULL, t).worker, f->el[2]);
    /* A first byte that says nothing about prefill (ms < 0) clears pending, learns nothing. */
    ops->prefill_end(f->p, f->el[1], 600, 1000, -1);
    ops->prefill_end(f->p, f->el[1], 1000, 0, -1);
    assert_int_equal(ops->explain(f->p, f->el, NW, &k, rows, &out), 0);
    assert_true(rows[1].prefill_pending == 0);
    assert_float_equal(rows[1].seconds_per_token, s1, 1e-15);
    /* The pending prefill ahead counts in the sample: 2000 tokens 100 ms above the floor. */
    fx *g = make();
    measure(g, g->el[0], 1, 2);
    ops->prefill_start(g->p, g->el[0], 1000);
    double a = ops->prefill_start(g->p, g->el[0], 1000);
    assert_true(a == 1000);
    ops->prefill_end(g->p, g->el[0], 1000, a, 102);
    assert_int_equal(ops->explain(g->p, g->el, NW, &k, rows, &out), 0);
    assert_float_equal(rows[0].seconds_per_token, 100 / 2000.95 / 1000, 1e-15);
    assert_true(rows[0].prefill_pending == 1000);
    /* Forgetting a worker measures it afresh (its pending attempts are still out). */
    ops->forget_worker(g->p, g->el[0]);
    assert_int_equal(ops->explain(g->p, g->el, NW, &k, rows, &out), 0);
    assert_float_equal(rows[0].seconds_per_token, KVR_COST_DEFAULT_SPT, 1e-15);
    assert_true(rows[0].prefill_pending == 1000);
    done(g);
    free(t);
    done(f);
}

static void test_session_slack(void **state)
{
    (void)state;
    kvr_rand_seed(14);
    fx *f = make();
    char *t = text_n(4000, 9);
    kvr_route_keys k = keys("conv-1", "a different first turn, long enough for a block or so");
    ops->teach(f->p, f->el[2], &k);
    /* Nothing cached for this text anywhere: the session's worker costs the same. */
    kvr_pick out = pick(f, "conv-1", t);
    assert_ptr_equal(out.worker, f->el[2]);
    assert_string_equal(out.decision, "session_id_match");
    /* Up to 2× the least it keeps the session ... */
    ops->prefill_start(f->p, f->el[2], 1000);
    out = pick(f, "conv-1", t);
    assert_string_equal(out.decision, "session_id_match");
    /* ... not beyond. */
    ops->prefill_start(f->p, f->el[2], 1);
    out = pick(f, "conv-1", t);
    assert_string_equal(out.decision, "min_cost");
    assert_ptr_not_equal(out.worker, f->el[2]);
    free(t);
    done(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_formula),
        cmocka_unit_test(test_repeat_goes_where_cached),
        cmocka_unit_test(test_distinct_prompts_spread),
        cmocka_unit_test(test_learned_speed),
        cmocka_unit_test(test_session_slack),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
