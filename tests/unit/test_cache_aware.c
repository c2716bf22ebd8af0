/* cache_aware policy: every decision label, the overload gate's two thresholds, the match
 * threshold, random tie-breaks, learning only through teach(), worker removal, accessors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "routing/policies.h"
#include "routing/policy_cache_aware.h"
#include "util/rand.h"

#define NW 4

typedef struct fx {
    kvr_worker w[NW];
    char url[NW][32];
    kvr_worker *el[NW];
    void *p;
} fx;

static const kvr_policy_ops *ops = &kvr_policy_cache_aware;

static fx *setup_fx(const kvr_policy_cfg *cfg)
{
    fx *f = calloc(1, sizeof(*f));
    for (size_t i = 0; i < NW; i++) {
        snprintf(f->url[i], sizeof(f->url[i]), "http://127.0.0.1:%zu", 9001 + i);
        f->w[i] = (kvr_worker){.url = f->url[i], .id = i + 10, .healthy = 1, .queue = -1,
                               .running = -1, .kv_usage = -1, .kv_tokens = -1};
        f->el[i] = &f->w[i];
    }
    kvr_policy_cfg c;
    kvr_policy_cfg_default(&c);
    f->p = ops->create(cfg ? cfg : &c, "m");
    assert_non_null(f->p);
    return f;
}

static void free_fx(fx *f)
{
    ops->destroy(f->p);
    free(f);
}

static kvr_route_keys keys(const char *session, const char *text)
{
    return (kvr_route_keys){.session = session, .session_len = session ? strlen(session) : 0,
                            .text = text, .text_len = text ? strlen(text) : 0};
}

static kvr_pick pick_n(fx *f, kvr_worker *const *el, size_t n, const char *session,
                       const char *text)
{
    kvr_route_keys k = keys(session, text);
    kvr_pick out = {0};
    assert_int_equal(ops->pick(f->p, el, n, &k, &out), 0);
    return out;
}

static kvr_pick pick(fx *f, const char *session, const char *text)
{
    return pick_n(f, f->el, NW, session, text);
}

static void teach(fx *f, kvr_worker *w, const char *session, const char *text)
{
    kvr_route_keys k = keys(session, text);
    ops->teach(f->p, w, &k);
}

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

static void test_labels(void **state)
{
    (void)state;
    kvr_rand_seed(1);
    fx *f = setup_fx(NULL);
    char *conv = text_n(2000, 1);
    /* Nothing to go on. */
    kvr_pick p = pick(f, NULL, NULL);
    assert_string_equal(p.decision, "empty_key_min_load");
    assert_true(p.match == -1);
    /* New text. */
    p = pick(f, NULL, conv);
    assert_string_equal(p.decision, "low_match_min_load");
    assert_true(p.match == 0);
    /* Picking never teaches: still unknown. */
    p = pick(f, NULL, conv);
    assert_string_equal(p.decision, "low_match_min_load");
    /* Taught (2xx headers from worker 2): the same text goes there, match 1.00. */
    teach(f, f->el[2], NULL, conv);
    for (int i = 0; i < 20; i++) {
        p = pick(f, NULL, conv);
        assert_string_equal(p.decision, "prefix_match");
        assert_ptr_equal(p.worker, f->el[2]);
        assert_true(p.match == 1.0);
    }
    /* Session bound to worker 1 wins over the prefix held by worker 2. */
    teach(f, f->el[1], "sess-A", "something else entirely, long enough to be a block or two");
    p = pick(f, "sess-A", conv);
    assert_string_equal(p.decision, "session_id_match");
    assert_ptr_equal(p.worker, f->el[1]);
    assert_true(p.match == 1.0); /* best match over the eligible set */
    /* Session keys are exact: sess-AB is a different, unknown session. */
    p = pick(f, "sess-AB", conv);
    assert_string_equal(p.decision, "prefix_match");
    /* Session refused for load → load_balance on the least loaded. */
    f->w[1].inflight = 100;
    f->w[0].inflight = 3;
    f->w[3].inflight = 5;
    f->w[2].inflight = 4;
    p = pick(f, "sess-A", NULL);
    assert_string_equal(p.decision, "load_balance");
    assert_ptr_equal(p.worker, f->el[0]);
    /* Prefix refused for load → load_balance. */
    f->w[1].inflight = 0;
    f->w[2].inflight = 100;
    p = pick(f, NULL, conv);
    assert_string_equal(p.decision, "load_balance");
    assert_ptr_equal(p.worker, f->el[1]);
    /* The session's worker is not eligible: decided as if there were no session. */
    kvr_worker *no1[] = {f->el[0], f->el[2], f->el[3]};
    f->w[2].inflight = 0;
    p = pick_n(f, no1, 3, "sess-A", conv);
    assert_string_equal(p.decision, "prefix_match");
    assert_ptr_equal(p.worker, f->el[2]);
    kvr_worker *only0[] = {f->el[0]};
    p = pick_n(f, only0, 1, "sess-A", conv);
    assert_string_equal(p.decision, "low_match_min_load");
    assert_true(p.match == 0);
    free(conv);
    free_fx(f);
}

static void test_overload_gate(void **state)
{
    (void)state;
    kvr_rand_seed(2);
    fx *f = setup_fx(NULL);
    teach(f, f->el[3], "s", NULL);
    for (int i = 0; i < NW; i++)
        f->w[i].inflight = 10;
    /* abs: load − min must exceed 32. */
    f->w[3].inflight = 42;
    assert_string_equal(pick(f, "s", NULL).decision, "session_id_match");
    f->w[3].inflight = 43;
    assert_string_equal(pick(f, "s", NULL).decision, "load_balance");
    /* rel: load must also exceed min × 1.5. */
    for (int i = 0; i < NW; i++)
        f->w[i].inflight = 100;
    f->w[3].inflight = 150;
    assert_string_equal(pick(f, "s", NULL).decision, "session_id_match");
    f->w[3].inflight = 151;
    assert_string_equal(pick(f, "s", NULL).decision, "load_balance");
    /* Flags change the gate. */
    free_fx(f);
    kvr_policy_cfg c;
    kvr_policy_cfg_default(&c);
    c.balance_abs_threshold = 2;
    c.balance_rel_threshold = 1.1;
    f = setup_fx(&c);
    teach(f, f->el[3], "s", NULL);
    f->w[3].inflight = 3;
    assert_string_equal(pick(f, "s", NULL).decision, "load_balance");
    f->w[3].inflight = 2;
    assert_string_equal(pick(f, "s", NULL).decision, "session_id_match");
    free_fx(f);
}

static void test_cache_threshold(void **state)
{
    (void)state;
    kvr_rand_seed(3);
    fx *f = setup_fx(NULL);
    char *t = text_n(1282, 9);
    char held = t[640];
    t[640] = 0;
    teach(f, f->el[1], NULL, t);   /* worker 1 holds the first 640 bytes */
    t[640] = held;
    t[1280] = 0;                   /* 640 / 1280 = 0.50 ≥ 0.5 */
    kvr_pick p = pick(f, NULL, t);
    assert_string_equal(p.decision, "prefix_match");
    assert_true(p.match == 0.5);
    t[1280] = 'x';
    t[1281] = 0;                   /* 640 / 1281 < 0.5 */
    p = pick(f, NULL, t);
    assert_string_equal(p.decision, "low_match_min_load");
    assert_true(p.match > 0.49 && p.match < 0.5);
    free(t);
    free_fx(f);
}

static void test_ties_random(void **state)
{
    (void)state;
    kvr_rand_seed(4);
    fx *f = setup_fx(NULL);
    /* 1,000 distinct new sessions over 4 idle workers: each gets 250 ± 20 %. */
    size_t n[NW] = {0};
    for (int i = 0; i < 1000; i++) {
        char s[32], t[64];
        snprintf(s, sizeof(s), "new-session-%d", i);
        snprintf(t, sizeof(t), "a new conversation number %d", i);
        kvr_pick p = pick(f, s, t);
        assert_string_equal(p.decision, "low_match_min_load");
        teach(f, p.worker, s, t);
        n[p.worker->id - 10]++;
    }
    for (int i = 0; i < NW; i++) {
        print_message("worker %d: %zu sessions\n", i, n[i]);
        assert_true(n[i] >= 200 && n[i] <= 300);
    }
    /* Every one of them is now sticky. */
    for (int i = 0; i < 1000; i += 7) {
        char s[32];
        snprintf(s, sizeof(s), "new-session-%d", i);
        assert_string_equal(pick(f, s, NULL).decision, "session_id_match");
    }
    /* Equal prefix matches on two workers: split at random between those two only. */
    char *t = text_n(500, 5);
    teach(f, f->el[0], NULL, t);
    teach(f, f->el[3], NULL, t);
    size_t m[NW] = {0};
    for (int i = 0; i < 1000; i++) {
        kvr_pick p = pick(f, NULL, t);
        assert_string_equal(p.decision, "prefix_match");
        m[p.worker->id - 10]++;
    }
    assert_int_equal(m[1] + m[2], 0);
    assert_true(m[0] >= 400 && m[0] <= 600);
    free(t);
    free_fx(f);
}

static void test_forget_and_stats(void **state)
{
    (void)state;
    kvr_rand_seed(5);
    fx *f = setup_fx(NULL);
    char *t = text_n(6400, 6);
    teach(f, f->el[2], "x", t);
    teach(f, f->el[2], "y", NULL);
    teach(f, f->el[1], "z", "short");
    kvr_cache_aware_stats st;
    kvr_cache_aware_stats_get(f->p, &st);
    assert_int_equal(st.index_blocks, 101);
    assert_int_equal(st.sessions, 3);
    kvr_cache_aware_worker_stats ws;
    kvr_cache_aware_worker_stats_get(f->p, f->w[2].id, &ws);
    assert_int_equal(ws.index_blocks, 100);
    assert_int_equal(ws.sessions, 2);
    assert_int_equal(ws.index_capacity, 4000000);
    /* The worker leaves: its sessions and blocks go at once. */
    ops->forget_worker(f->p, f->el[2]);
    kvr_cache_aware_stats_get(f->p, &st);
    assert_int_equal(st.index_blocks, 1);
    assert_int_equal(st.sessions, 1);
    assert_int_equal(st.session_evictions[KVR_SESSION_EVICT_WORKER_REMOVED], 2);
    kvr_pick p = pick(f, "x", t);
    assert_string_equal(p.decision, "low_match_min_load");
    assert_true(p.match == 0);
    /* A worker that publishes its KV capacity gets an index cap from it. */
    f->w[0].kv_tokens = 16 * 50; /* 50 blocks of 64 bytes at 4 bytes per token */
    teach(f, f->el[0], NULL, t);
    kvr_cache_aware_worker_stats_get(f->p, f->w[0].id, &ws);
    assert_int_equal(ws.index_capacity, 50);
    assert_int_equal(ws.index_blocks, 50);
    p = pick(f, NULL, t);
    assert_true(p.match == 0.5);
    kvr_cache_aware_stats_get(f->p, &st);
    assert_true(st.memory_bytes > 0);
    free(t);
    free_fx(f);
    /* --worker-index-blocks wins over the published capacity. */
    kvr_policy_cfg c;
    kvr_policy_cfg_default(&c);
    c.worker_index_blocks = 7;
    f = setup_fx(&c);
    f->w[0].kv_tokens = 16 * 50;
    t = text_n(6400, 7);
    teach(f, f->el[0], NULL, t);
    kvr_cache_aware_worker_stats_get(f->p, f->w[0].id, &ws);
    assert_int_equal(ws.index_capacity, 7);
    assert_int_equal(ws.index_blocks, 7);
    free(t);
    free_fx(f);
}

static void test_explain(void **state)
{
    (void)state;
    kvr_rand_seed(6);
    fx *f = setup_fx(NULL);
    char *t = text_n(1000, 8);
    teach(f, f->el[1], "s", t);
    t[500] ^= 1;
    f->w[1].inflight = 40;
    f->w[0].inflight = 1;
    f->w[2].inflight = 2;
    f->w[3].inflight = 1;
    kvr_cache_aware_explain_row rows[NW];
    kvr_route_keys k = keys("s", t);
    kvr_pick out;
    assert_int_equal(kvr_cache_aware_explain(f->p, f->el, NW, &k, rows, &out), 0);
    assert_string_equal(out.decision, "load_balance");
    assert_true(out.worker == f->el[0] || out.worker == f->el[3]);
    assert_ptr_equal(rows[1].worker, f->el[1]);
    assert_int_equal(rows[1].matched_bytes, 448);   /* 7 whole blocks before the change */
    assert_true(rows[1].match == 0.448);
    assert_int_equal(rows[1].inflight, 40);
    assert_true(rows[1].overloaded);
    assert_true(rows[1].session_owner);
    assert_false(rows[0].overloaded || rows[0].session_owner);
    assert_int_equal(rows[0].matched_bytes, 0);
    assert_true(out.match == 0.448);
    assert_int_equal(kvr_cache_aware_explain(f->p, f->el, 0, &k, rows, &out), -1);
    assert_int_equal(kvr_cache_aware_sweep(f->p, 100), 0);
    free(t);
    free_fx(f);
}

static void test_self_correction(void **state)
{
    (void)state;
    kvr_rand_seed(7);
    fx *f = setup_fx(NULL);
    char *p1 = text_n(640, 11), *p2 = text_n(640, 12);
    kvr_worker *w = f->el[2];
    teach(f, w, NULL, p2);
    teach(f, w, NULL, p1);
    /* P1 routed to its worker: the pick keeps its blocks' last use as they are now. */
    kvr_pick pk = pick(f, NULL, p1);
    assert_ptr_equal(pk.worker, w);
    assert_true(pk.chosen_match == 1.0);
    assert_string_equal(pk.index, "approximate");
    assert_int_equal(pk.use.runs, 1);
    assert_int_equal(pk.use.end[0], 10);
    kvr_pick other = pick(f, NULL, "nothing anyone holds");
    assert_int_equal(other.use.runs, 0);
    teach(f, w, NULL, p1); /* the 2xx headers */
    /* The worker reports 0 of 160 prompt tokens cached: P2, used before P1, goes; P1 was
     * cached just now and stays; the cap becomes what remains, but at least twice P1. */
    kvr_route_keys k = keys(NULL, p1);
    assert_int_equal(ops->correct(f->p, w, &k, &pk, 0, 160), 1);
    kvr_pick q = pick(f, NULL, p2);
    assert_true(q.match == 0);
    q = pick(f, NULL, p1);
    assert_true(q.worker == w && q.match == 1.0);
    kvr_cache_aware_worker_stats ws;
    kvr_cache_aware_worker_stats_get(f->p, w->id, &ws);
    assert_int_equal(ws.index_blocks, 10);
    assert_int_equal(ws.index_capacity, 20);
    /* A report as good as the prediction corrects nothing; without the routing text nothing
     * can be corrected either. */
    assert_int_equal(ops->correct(f->p, w, &k, &q, 160, 160), 0);
    kvr_route_keys none = keys(NULL, NULL);
    assert_int_equal(ops->correct(f->p, w, &none, &q, 0, 160), 0);
    /* Half the prompt predicted, all of it cached: 80 tokens ≈ 320 bytes = 5 blocks more. */
    q.chosen_match = 0.5;
    assert_int_equal(ops->correct(f->p, w, &k, &q, 160, 160), 0);
    kvr_cache_aware_worker_stats_get(f->p, w->id, &ws);
    assert_int_equal(ws.index_capacity, 25);
    /* A shortfall within what byte-to-token proportions explain (3/4 of the prediction) is
     * no evidence of an eviction. */
    q.chosen_match = 1.0;
    assert_int_equal(ops->correct(f->p, w, &k, &q, 120, 160), 0);
    kvr_cache_aware_worker_stats_get(f->p, w->id, &ws);
    assert_int_equal(ws.index_blocks, 10);
    assert_int_equal(ws.index_capacity, 25);
    /* Cached up to block 4 of 10 (no teaching at the headers this time): block 5 was evicted,
     * so all of P1 (last used together) goes, P2, used since, stays. */
    q.chosen_match = 0;
    assert_int_equal(ops->correct(f->p, w, &k, &q, (int64_t)1 << 40, (int64_t)1 << 40), 0);
    kvr_cache_aware_worker_stats_get(f->p, w->id, &ws);
    assert_int_equal(ws.index_capacity, 4000000);
    teach(f, w, NULL, p2);
    pk = pick(f, NULL, p1);
    assert_int_equal(pk.use.runs, 1);
    teach(f, w, NULL, p2);
    kvr_route_keys k2 = keys(NULL, p1);
    assert_int_equal(ops->correct(f->p, w, &k2, &pk, 64, 160), 1);
    kvr_cache_aware_worker_stats_get(f->p, w->id, &ws);
    assert_int_equal(ws.index_blocks, 10);   /* P2's 10; P1's 10 were all no later */
    assert_int_equal(ws.index_capacity, 20);
    q = pick(f, NULL, p1);
    assert_true(q.match == 0);
    /* precise has the same correction */
    assert_ptr_equal(kvr_policy_precise.correct, ops->correct);
    free(p1);
    free(p2);
    free_fx(f);
}

static void test_registered(void **state)
{
    (void)state;
    assert_ptr_equal(kvr_policy_find("cache_aware"), &kvr_policy_cache_aware);
    assert_ptr_equal(kvr_policy_find("consistent_hash"), &kvr_policy_consistent_hash);
    assert_ptr_equal(kvr_policy_find("rendezvous_hash"), &kvr_policy_rendezvous_hash);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_labels),
        cmocka_unit_test(test_overload_gate),
        cmocka_unit_test(test_cache_threshold),
        cmocka_unit_test(test_ties_random),
        cmocka_unit_test(test_forget_and_stats),
        cmocka_unit_test(test_explain),
        cmocka_unit_test(test_self_correction),
        cmocka_unit_test(test_registered),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
