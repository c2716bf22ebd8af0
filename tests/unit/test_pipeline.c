/* pipeline policy: each scorer's arithmetic (load settling in proportion to the weights,
 * min-max queue, KV usage, weight, LMCache, neutral unknowns), the scorer weight syntax (a
 * list replaces the defaults), argmax with random ties, what it learns through its embedded
 * cache_aware instance, and the /debug/route rows. Fake workers, no loop. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "routing/policies.h"
#include "routing/scorers.h"
#include "util/rand.h"
#include "util/time.h"

#define NW 3

typedef struct fx {
    kvr_worker w[NW];
    char url[NW][32];
    kvr_worker *el[NW];
    double weights[NW];
    void *p;
} fx;

static const kvr_policy_ops *ops = &kvr_policy_pipeline;

static fx *make(const char *scorers)
{
    fx *f = calloc(1, sizeof(*f));
    for (size_t i = 0; i < NW; i++) {
        snprintf(f->url[i], sizeof(f->url[i]), "http://127.0.0.1:%zu", 9001 + i);
        f->w[i] = (kvr_worker){.url = f->url[i], .id = i, .healthy = 1, .queue = -1,
                               .running = -1, .kv_usage = -1, .kv_tokens = -1,
                               .lmcache_occupancy = -1};
        f->el[i] = &f->w[i];
        f->weights[i] = 1;
    }
    kvr_policy_cfg c;
    kvr_policy_cfg_default(&c);
    char err[256];
    if (scorers)
        assert_int_equal(kvr_scorers_parse(scorers, c.scorers, 1, err, sizeof(err)), 0);
    f->p = ops->create(&c, "m");
    assert_non_null(f->p);
    return f;
}

static void done(fx *f)
{
    ops->destroy(f->p);
    free(f);
}

static kvr_route_keys keys(fx *f, const char *session, const char *text)
{
    return (kvr_route_keys){.session = session, .session_len = session ? strlen(session) : 0,
                            .text = text, .text_len = text ? strlen(text) : 0,
                            .weights = f->weights};
}

static kvr_worker *pick(fx *f, const char *session, const char *text, const char **decision)
{
    kvr_route_keys k = keys(f, session, text);
    kvr_pick out = {.match = -1};
    assert_int_equal(ops->pick(f->p, f->el, NW, &k, &out), 0);
    if (decision)
        *decision = out.decision;
    return out.worker;
}

static void eval(fx *f, double (*v)[KVR_NSCORERS], const double *ratio, int session)
{
    kvr_scorers_eval(f->el, NW, f->weights, ratio, session, kvr_now_ms(), v);
}

static void test_names_and_syntax(void **state)
{
    (void)state;
    double w[KVR_NSCORERS], d[KVR_NSCORERS];
    char err[256], buf[256];
    kvr_scorers_default(d);
    kvr_scorers_format(d, buf, sizeof(buf));
    assert_string_equal(buf, "prefix=3,session=4,load=2,kv_usage=1,weight=1");
    for (int s = 0; s < KVR_NSCORERS; s++)
        assert_int_equal(kvr_scorer_find(kvr_scorer_name(s), strlen(kvr_scorer_name(s))), s);
    assert_int_equal(kvr_scorer_find("loa", 3), -1);
    /* A list replaces the defaults entirely. */
    memcpy(w, d, sizeof(w));
    assert_int_equal(kvr_scorers_parse("load=1", w, 1, err, sizeof(err)), 0);
    for (int s = 0; s < KVR_NSCORERS; s++)
        assert_true(w[s] == (s == KVR_SCORER_LOAD ? 1 : 0));
    /* Without replace (a later --scorer), it adds to what is there. */
    assert_int_equal(kvr_scorers_parse("weight=2.5,lmcache=0.5", w, 0, err, sizeof(err)), 0);
    assert_true(w[KVR_SCORER_LOAD] == 1 && w[KVR_SCORER_WEIGHT] == 2.5 &&
                w[KVR_SCORER_LMCACHE] == 0.5);
    kvr_scorers_format(w, buf, sizeof(buf));
    assert_string_equal(buf, "load=1,weight=2.5,lmcache=0.5");
    /* Refused, leaving the weights alone. */
    const char *bad[] = {"bogus=1", "load", "load=", "load=-1", "load=x", "load=1,", "=1",
                         "load=1e7", "load=nan"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(kvr_scorers_parse(bad[i], w, 1, err, sizeof(err)), -1);
        assert_true(w[KVR_SCORER_LOAD] == 1);
    }
    assert_int_equal(kvr_scorers_parse("", w, 1, err, sizeof(err)), 0);
    kvr_scorers_format(w, buf, sizeof(buf));
    assert_string_equal(buf, "none");
}

static void test_load_scorer(void **state)
{
    (void)state;
    fx *f = make(NULL);
    double v[NW][KVR_NSCORERS];
    /* Idle: 1 everywhere (the largest in-flight / weight is 0). */
    eval(f, v, NULL, -1);
    for (int i = 0; i < NW; i++)
        assert_true(v[i][KVR_SCORER_LOAD] == 1);
    /* 1 − (in-flight / weight) ÷ the largest such value. */
    f->weights[0] = 3;
    f->w[0].inflight = 6; /* 2 per weight */
    f->w[1].inflight = 4; /* 4: the largest */
    f->w[2].inflight = 1;
    eval(f, v, NULL, -1);
    assert_float_equal(v[0][KVR_SCORER_LOAD], 0.5, 1e-12);
    assert_float_equal(v[1][KVR_SCORER_LOAD], 0, 1e-12);
    assert_float_equal(v[2][KVR_SCORER_LOAD], 0.75, 1e-12);
    /* weight: target weight / the largest. */
    assert_float_equal(v[0][KVR_SCORER_WEIGHT], 1, 1e-12);
    assert_float_equal(v[1][KVR_SCORER_WEIGHT], 1.0 / 3, 1e-12);
    done(f);
}

static void test_load_settles_by_weight(void **state)
{
    (void)state;
    kvr_rand_seed(7);
    fx *f = make("load=1");
    f->weights[0] = 3;
    f->weights[1] = 1;
    f->weights[2] = 2;
    /* 60 requests that all stay in flight settle 30:10:20. */
    for (int r = 0; r < 60; r++) {
        kvr_worker *w = pick(f, NULL, "same text for all of them", NULL);
        w->inflight++;
    }
    assert_int_equal(f->w[0].inflight, 30);
    assert_int_equal(f->w[1].inflight, 10);
    assert_int_equal(f->w[2].inflight, 20);
    done(f);
}

static void test_scraped_scorers(void **state)
{
    (void)state;
    fx *f = make(NULL);
    double v[NW][KVR_NSCORERS];
    /* Nothing scraped: every worker alike. */
    eval(f, v, NULL, -1);
    for (int i = 0; i < NW; i++) {
        assert_true(v[i][KVR_SCORER_QUEUE] == 1 && v[i][KVR_SCORER_KV_USAGE] == 1);
        assert_true(v[i][KVR_SCORER_LMCACHE] == 0.5);
    }
    /* queue: min-max, inverted; an unscraped worker gets the mean of the others. */
    f->w[0].queue = 2;
    f->w[1].queue = 10;
    eval(f, v, NULL, -1);
    assert_float_equal(v[0][KVR_SCORER_QUEUE], 1, 1e-12);
    assert_float_equal(v[1][KVR_SCORER_QUEUE], 0, 1e-12);
    assert_float_equal(v[2][KVR_SCORER_QUEUE], 0.5, 1e-12);
    /* kv_usage: 1 − usage. */
    f->w[0].kv_usage = 0.25;
    f->w[1].kv_usage = 0.75;
    eval(f, v, NULL, -1);
    assert_float_equal(v[0][KVR_SCORER_KV_USAGE], 0.75, 1e-12);
    assert_float_equal(v[1][KVR_SCORER_KV_USAGE], 0.25, 1e-12);
    assert_float_equal(v[2][KVR_SCORER_KV_USAGE], 0.5, 1e-12);
    /* lmcache: free capacity of a fresh answer; unavailable 0; no answer the mean of those
     * available. */
    uint64_t now = kvr_now_ms();
    f->w[0].lmcache_occupancy = 0.2;
    f->w[0].lmcache_available = 1;
    f->w[0].lmcache_fresh_until_ms = now + 60000;
    f->w[1].lmcache_occupancy = 0.1;
    f->w[1].lmcache_available = 0;
    f->w[1].lmcache_fresh_until_ms = now + 60000;
    eval(f, v, NULL, -1);
    assert_float_equal(v[0][KVR_SCORER_LMCACHE], 0.8, 1e-12);
    assert_float_equal(v[1][KVR_SCORER_LMCACHE], 0, 1e-12);
    assert_float_equal(v[2][KVR_SCORER_LMCACHE], 0.8, 1e-12);
    /* Equal queues: 1 for all. */
    f->w[0].queue = f->w[1].queue = f->w[2].queue = 3;
    eval(f, v, NULL, -1);
    for (int i = 0; i < NW; i++)
        assert_true(v[i][KVR_SCORER_QUEUE] == 1);
    /* prefix and session pass through. */
    double ratio[NW] = {0.5, 1.5, -1};
    eval(f, v, ratio, 2);
    assert_true(v[0][KVR_SCORER_PREFIX] == 0.5 && v[1][KVR_SCORER_PREFIX] == 1 &&
                v[2][KVR_SCORER_PREFIX] == 0);
    assert_true(v[0][KVR_SCORER_SESSION] == 0 && v[2][KVR_SCORER_SESSION] == 1);
    double ws[KVR_NSCORERS] = {0};
    ws[KVR_SCORER_PREFIX] = 2;
    ws[KVR_SCORER_SESSION] = 3;
    assert_float_equal(kvr_scorers_sum(v[2], ws), 3, 1e-12);
    assert_float_equal(kvr_scorers_sum(v[0], ws), 1, 1e-12);
    done(f);
}

static void test_weight_and_ties(void **state)
{
    (void)state;
    kvr_rand_seed(3);
    fx *f = make("weight=1");
    f->weights[1] = 3;
    for (int r = 0; r < 20; r++) {
        const char *d;
        assert_ptr_equal(pick(f, NULL, "x", &d), f->el[1]);
        assert_string_equal(d, "pipeline");
    }
    /* Equal sums: every worker is picked sometimes, never by list order alone. */
    f->weights[1] = 1;
    int seen[NW] = {0};
    for (int r = 0; r < 90; r++)
        seen[pick(f, NULL, "x", NULL)->id]++;
    for (int i = 0; i < NW; i++)
        assert_true(seen[i] > 10);
    done(f);
}

static void test_learns_through_cache_aware(void **state)
{
    (void)state;
    kvr_rand_seed(5);
    fx *f = make(NULL);
    char text[600];
    memset(text, 'q', sizeof(text) - 1);
    text[sizeof(text) - 1] = 0;
    kvr_route_keys k = keys(f, "sess-1", text);
    /* Picking teaches nothing; teach() binds the session and the prefix to worker 2. */
    kvr_pick out = {0};
    assert_int_equal(ops->pick(f->p, f->el, NW, &k, &out), 0);
    assert_true(out.match == 0);
    ops->teach(f->p, f->el[2], &k);
    for (int r = 0; r < 10; r++) {
        assert_int_equal(ops->pick(f->p, f->el, NW, &k, &out), 0);
        assert_ptr_equal(out.worker, f->el[2]);
        assert_true(out.match == 1 && out.chosen_match == 1);
        assert_string_equal(out.index, "approximate");
    }
    /* The session outweighs load: worker 2 busy (load 0 there, 1 elsewhere: −2) still wins
     * with session 4 + prefix 3. */
    f->w[2].inflight = 5;
    assert_int_equal(ops->pick(f->p, f->el, NW, &k, &out), 0);
    assert_ptr_equal(out.worker, f->el[2]);
    /* /debug/route rows: every scorer and the weighted sum. */
    kvr_explain_row rows[NW];
    assert_int_equal(ops->explain(f->p, f->el, NW, &k, rows, &out), 0);
    for (int i = 0; i < NW; i++) {
        assert_int_equal(rows[i].scored, 1);
        assert_ptr_equal(rows[i].worker, f->el[i]);
        assert_int_equal(rows[i].inflight, f->w[i].inflight);
    }
    assert_true(rows[2].session_owner && rows[2].scorers[KVR_SCORER_SESSION] == 1);
    assert_true(rows[2].scorers[KVR_SCORER_PREFIX] == 1 && rows[2].scorers[KVR_SCORER_LOAD] == 0);
    assert_float_equal(rows[2].score, 4 + 3 + 0 + 1 + 1, 1e-12);
    assert_float_equal(rows[0].score, 0 + 0 + 2 + 1 + 1, 1e-12);
    /* Forgetting the worker drops its session and prefix. */
    ops->forget_worker(f->p, f->el[2]);
    f->w[2].inflight = 0;
    assert_int_equal(ops->explain(f->p, f->el, NW, &k, rows, &out), 0);
    assert_true(out.match == 0 && !rows[2].session_owner);
    kvr_policy_stats st;
    ops->stats(f->p, &st);
    assert_int_equal(st.sessions, 0);
    done(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_and_syntax),
        cmocka_unit_test(test_load_scorer),
        cmocka_unit_test(test_load_settles_by_weight),
        cmocka_unit_test(test_scraped_scorers),
        cmocka_unit_test(test_weight_and_ties),
        cmocka_unit_test(test_learns_through_cache_aware),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
