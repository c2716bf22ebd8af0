/* Routes: eligibility over targets, exclusion for retries, Responses API pins, learned state
 * kept across a reload of the same route and dropped for workers that are no longer targets,
 * route-table lookup by name and alias, worker lifetime through references. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "routing/policies.h"
#include "routing/route.h"
#include "util/json_read.h"
#include "workers/registry.h"

typedef struct fx {
    kvr_registry *reg;
    kvr_worker *w[3];
    kvr_policy_cfg cfg;
} fx;

static int setup(void **state)
{
    fx *f = calloc(1, sizeof(*f));
    f->reg = kvr_registry_new();
    const char *urls[] = {"http://127.0.0.1:9001", "http://127.0.0.1:9002",
                          "http://127.0.0.1:9003"};
    for (int i = 0; i < 3; i++)
        f->w[i] = kvr_registry_add(f->reg, urls[i], NULL, 1);
    kvr_policy_cfg_default(&f->cfg);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    kvr_registry_free(f->reg);
    free(f);
    return 0;
}

static kvr_route *make(fx *f, const char *name, const kvr_policy_ops *ops, size_t n,
                       kvr_route *prev)
{
    kvr_route_target t[3];
    for (size_t i = 0; i < n; i++)
        t[i] = (kvr_route_target){f->w[i], i == 0 ? "upstream-name" : NULL, 0};
    const char *aliases[] = {"alias-of-" "x"};
    kvr_route_def d = {.name = name, .aliases = aliases, .naliases = 1, .ops = ops,
                       .cfg = &f->cfg, .targets = t, .ntargets = n, .response_pins = 100,
                       .response_pin_ttl_ms = 60000};
    kvr_route *r = kvr_route_new(&d, prev);
    assert_non_null(r);
    return r;
}

static kvr_route_keys keys(const char *text)
{
    return (kvr_route_keys){.text = text, .text_len = strlen(text)};
}

static void test_targets_and_exclusion(void **state)
{
    fx *f = *state;
    kvr_route *r = make(f, "m", &kvr_policy_round_robin, 3, NULL);
    assert_string_equal(r->targets[0].model, "upstream-name");
    assert_string_equal(r->targets[1].model, "m"); /* default: the route's name */
    assert_true(r->targets[1].weight == 1);
    kvr_pick p;
    const kvr_route_target *t;
    /* Excluding two workers leaves only the third, whatever the policy's turn. */
    size_t ex[] = {f->w[0]->id, f->w[2]->id};
    for (int i = 0; i < 5; i++) {
        assert_int_equal(kvr_route_pick(r, ex, 2, NULL, NULL, 0, &p, &t), 0);
        assert_ptr_equal(p.worker, f->w[1]);
        assert_ptr_equal(t->worker, f->w[1]);
    }
    /* Ineligible (draining) workers are never picked; none left → -1. */
    f->w[1]->draining = 1;
    assert_int_equal(kvr_route_pick(r, ex, 2, NULL, NULL, 0, &p, &t), -1);
    f->w[1]->draining = 0;
    kvr_route_unref(r);
}

static void test_pins(void **state)
{
    fx *f = *state;
    kvr_route *r = make(f, "m", &kvr_policy_round_robin, 3, NULL);
    kvr_route_pin_response(r, "resp_1", 6, f->w[2]);
    kvr_pick p;
    const kvr_route_target *t;
    for (int i = 0; i < 4; i++) {
        assert_int_equal(kvr_route_pick(r, NULL, 0, NULL, "resp_1", 6, &p, &t), 0);
        assert_ptr_equal(p.worker, f->w[2]);
        assert_string_equal(p.decision, "session_id_match");
    }
    size_t wid;
    assert_int_equal(kvr_route_find_response(r, "resp_1", 6, &wid), 1);
    assert_int_equal(wid, f->w[2]->id);
    /* The pinned worker already tried: the policy decides among the rest. */
    size_t ex[] = {f->w[2]->id};
    assert_int_equal(kvr_route_pick(r, ex, 1, NULL, "resp_1", 6, &p, &t), 0);
    assert_ptr_not_equal(p.worker, f->w[2]);
    kvr_route_forget_worker(r, f->w[2]);
    assert_int_equal(kvr_route_find_response(r, "resp_1", 6, &wid), 0);
    kvr_route_unref(r);
}

static void test_reload_keeps_state(void **state)
{
    fx *f = *state;
    kvr_route *r1 = make(f, "m", &kvr_policy_cache_aware, 3, NULL);
    const char *text = "a long enough routing text that fills more than one prefix block, "
                       "so that the index records several blocks for it on one worker";
    kvr_route_keys k = keys(text);
    kvr_route_teach(r1, f->w[0], &k);
    kvr_route_teach(r1, f->w[2], &k);
    kvr_policy_worker_stats ws;
    kvr_route_worker_stats(r1, f->w[0], &ws);
    assert_true(ws.index_blocks > 0);

    /* Same name and policy, worker 2 no longer a target: state kept for 0, dropped for 2. */
    f->cfg.cache_threshold = 0.7; /* retuned in place */
    kvr_route *r2 = make(f, "m", &kvr_policy_cache_aware, 2, r1);
    kvr_route_worker_stats(r2, f->w[0], &ws);
    assert_true(ws.index_blocks > 0);
    kvr_route_worker_stats(r2, f->w[2], &ws);
    assert_int_equal(ws.index_blocks, 0);
    kvr_pick p;
    const kvr_route_target *t;
    assert_int_equal(kvr_route_pick(r2, NULL, 0, &k, NULL, 0, &p, &t), 0);
    assert_ptr_equal(p.worker, f->w[0]);
    assert_string_equal(p.decision, "prefix_match");
    /* The old route, still held by requests in progress, shares the state. */
    kvr_route_unref(r1);
    kvr_route_worker_stats(r2, f->w[0], &ws);
    assert_true(ws.index_blocks > 0);

    /* Another policy, or a structural change: a fresh state. */
    kvr_route *r3 = make(f, "m", &kvr_policy_round_robin, 2, r2);
    kvr_route_worker_stats(r3, f->w[0], &ws);
    assert_int_equal(ws.index_blocks, 0);
    f->cfg.block_bytes = 128;
    kvr_route *r4 = make(f, "m", &kvr_policy_cache_aware, 2, r2);
    kvr_route_worker_stats(r4, f->w[0], &ws);
    assert_int_equal(ws.index_blocks, 0);
    f->cfg.block_bytes = 64;
    kvr_route_unref(r2);
    kvr_route_unref(r3);
    kvr_route_unref(r4);
}

static void test_two_routes_learn_apart(void **state)
{
    fx *f = *state;
    kvr_route *a = make(f, "a", &kvr_policy_cache_aware, 3, NULL);
    kvr_route *b = make(f, "b", &kvr_policy_cache_aware, 3, NULL);
    kvr_route_keys k = keys("shared text taught on route a only, long enough for blocks....");
    kvr_route_teach(a, f->w[1], &k);
    kvr_pick p;
    const kvr_route_target *t;
    assert_int_equal(kvr_route_pick(b, NULL, 0, &k, NULL, 0, &p, &t), 0);
    assert_true(p.match == 0);
    assert_int_equal(kvr_route_pick(a, NULL, 0, &k, NULL, 0, &p, &t), 0);
    assert_true(p.match == 1);
    kvr_route_unref(a);
    kvr_route_unref(b);
}

static void test_table_lookup(void **state)
{
    fx *f = *state;
    kvr_route_table *t = kvr_route_table_new();
    kvr_route_table_add(t, make(f, "llama", &kvr_policy_random, 2, NULL));
    assert_non_null(kvr_route_table_find(t, "llama"));
    assert_ptr_equal(kvr_route_table_find(t, "alias-of-x"), kvr_route_table_find(t, "llama"));
    assert_null(kvr_route_table_find(t, "llam"));
    assert_null(kvr_route_table_find(t, NULL));
    kvr_route_table_free(t);
}

static void test_removed_worker_lives_while_referenced(void **state)
{
    fx *f = *state;
    kvr_worker *w = kvr_registry_add(f->reg, "http://127.0.0.1:9009", "nine", 2);
    assert_non_null(w);
    assert_ptr_equal(kvr_registry_find_name(f->reg, "nine"), w);
    assert_null(kvr_registry_add(f->reg, "http://127.0.0.1:9010", "nine", 1)); /* name taken */
    kvr_route_target tg = {w, NULL, 0};
    kvr_route_def d = {.name = "r", .ops = &kvr_policy_least_load, .cfg = &f->cfg,
                       .targets = &tg, .ntargets = 1};
    kvr_route *r = kvr_route_new(&d, NULL);
    assert_true(r->targets[0].weight == 1);
    size_t id = w->id;
    kvr_registry_remove(f->reg, w);
    assert_null(kvr_registry_get(f->reg, id));
    assert_true(w->removed);
    assert_false(kvr_worker_eligible(w));
    kvr_pick p;
    const kvr_route_target *t;
    assert_int_equal(kvr_route_pick(r, NULL, 0, NULL, NULL, 0, &p, &t), -1);
    /* A new worker never reuses the id. */
    kvr_worker *w2 = kvr_registry_add(f->reg, "http://127.0.0.1:9011", NULL, 0);
    assert_true(w2->id > id);
    assert_string_equal(w2->name, "http://127.0.0.1:9011");
    kvr_route_unref(r); /* frees w (ASan checks) */
}

/* Target weights reach the policy, parallel to the eligible set, exclusions included. */
static void test_target_weights_reach_the_policy(void **state)
{
    fx *f = *state;
    kvr_route_target t[3] = {{f->w[0], NULL, 3}, {f->w[1], NULL, 1}, {f->w[2], NULL, 0.5}};
    kvr_route_def d = {.name = "m", .ops = &kvr_policy_round_robin, .cfg = &f->cfg,
                       .targets = t, .ntargets = 2};
    kvr_route *r = kvr_route_new(&d, NULL);
    assert_non_null(r);
    kvr_pick p;
    const kvr_route_target *tg;
    const char *want = "aaba";
    for (int i = 0; i < 8; i++) {
        assert_int_equal(kvr_route_pick(r, NULL, 0, NULL, NULL, 0, &p, &tg), 0);
        assert_ptr_equal(p.worker, f->w[want[i % 4] - 'a']);
    }
    /* /debug/route lists each target's weight and does not take a turn. */
    const kvr_explain_row *rows;
    size_t n;
    kvr_route_keys k = keys("x");
    assert_int_equal(kvr_route_explain(r, NULL, 0, &k, NULL, 0, &p, &rows, &n), 0);
    assert_int_equal(n, 2);
    assert_true(rows[0].weight == 3 && rows[1].weight == 1);
    assert_int_equal(kvr_route_pick(r, NULL, 0, NULL, NULL, 0, &p, &tg), 0);
    assert_ptr_equal(p.worker, f->w[0]);
    kvr_route_unref(r);

    /* With the heavy target excluded, the rest keep their own weights. */
    d.ops = &kvr_policy_random;
    d.ntargets = 3;
    r = kvr_route_new(&d, NULL);
    size_t ex[] = {f->w[0]->id}, count[3] = {0};
    for (int i = 0; i < 3000; i++) {
        assert_int_equal(kvr_route_pick(r, ex, 1, NULL, NULL, 0, &p, &tg), 0);
        count[p.worker->id - f->w[0]->id]++;
    }
    assert_int_equal(count[0], 0);
    assert_true(count[1] > 1800 && count[1] < 2200); /* 2:1 */
    kvr_policy_stats st;
    kvr_route_stats(r, &st);
    assert_true(st.hash_overflows == 0);
    kvr_route_unref(r);
}

static void test_member_span(void **state)
{
    (void)state;
    const char *b = "{ \"messages\": [{\"model\": \"inner\"}], \"model\" : \"a\\\"b\", "
                    "\"n\": 1 }";
    size_t vlen;
    long at = kvr_json_member_span(b, strlen(b), "model", &vlen);
    assert_true(at > 0);
    assert_int_equal(vlen, 6);
    assert_memory_equal(b + at, "\"a\\\"b\"", 6);
    const char *dup = "{\"model\":\"x\",\"model\":\"yy\"}";
    at = kvr_json_member_span(dup, strlen(dup), "model", &vlen);
    assert_memory_equal(dup + at, "\"yy\"", 4); /* last wins, as the parser */
    const char *esc = "{\"mod\\u0065l\":\"x\",\"m\\u006f\\u0064el\" : \"zz\"}";
    at = kvr_json_member_span(esc, strlen(esc), "model", &vlen);
    assert_true(at > 0);
    assert_memory_equal(esc + at, "\"zz\"", 4);
    assert_int_equal(kvr_json_member_span("{\"models\":1}", 12, "model", &vlen), -1);
    assert_int_equal(kvr_json_member_span("[1]", 3, "model", &vlen), -1);
    assert_int_equal(kvr_json_member_span("{}", 2, "model", &vlen), -1);
}

/* A route with a prefill-role target and others is disaggregated: its decode side holds the
 * others with the decode policy; the role exclusions split the targets; a reload keeps both
 * sides' state; without a decode policy, or without a prefill worker, it stays ordinary. */
static void test_pd_sides(void **state)
{
    fx *f = *state;
    f->w[0]->role = KVR_ROLE_PREFILL;
    f->w[1]->role = KVR_ROLE_DECODE;
    kvr_route_target t[3] = {{f->w[0], NULL, 0}, {f->w[1], NULL, 0}, {f->w[2], NULL, 0}};
    kvr_route_def d = {.name = "m", .ops = &kvr_policy_cache_aware, .cfg = &f->cfg,
                       .targets = t, .ntargets = 3, .decode_ops = &kvr_policy_least_load,
                       .pd_mode = KVR_PD_SGLANG};
    kvr_route *r = kvr_route_new(&d, NULL);
    assert_non_null(r->pd);
    assert_int_equal(r->pd->mode, KVR_PD_SGLANG);
    kvr_route *dr = r->pd->decode;
    assert_int_equal(dr->ntargets, 2);
    assert_ptr_equal(dr->targets[0].worker, f->w[1]);
    assert_ptr_equal(dr->targets[1].worker, f->w[2]);
    assert_ptr_equal(dr->ops, &kvr_policy_least_load);
    size_t ex[8];
    assert_int_equal(kvr_route_role_exclude(r, 1, ex, 0, 8), 2); /* a prefill pick */
    assert_int_equal(ex[0], f->w[1]->id);
    assert_int_equal(ex[1], f->w[2]->id);
    assert_int_equal(kvr_route_role_exclude(r, 0, ex, 0, 8), 1); /* a decode pick */
    assert_int_equal(ex[0], f->w[0]->id);
    kvr_pick p;
    const kvr_route_target *tg;
    kvr_route_keys k = keys("hello");
    assert_int_equal(kvr_route_pick(r, ex, kvr_route_role_exclude(r, 1, ex, 0, 8), &k, NULL, 0,
                                    &p, &tg), 0);
    assert_ptr_equal(p.worker, f->w[0]);
    kvr_route *r2 = kvr_route_new(&d, r);
    assert_ptr_equal(r2->state, r->state);
    assert_ptr_equal(r2->pd->decode->state, r->pd->decode->state);
    kvr_route_unref(r2);
    kvr_route_unref(r);
    d.decode_ops = NULL;
    r = kvr_route_new(&d, NULL);
    assert_null(r->pd);
    assert_int_equal(kvr_route_role_exclude(r, 1, ex, 0, 8), 0);
    kvr_route_unref(r);
    f->w[0]->role = KVR_ROLE_BOTH;
    d.decode_ops = &kvr_policy_least_load;
    r = kvr_route_new(&d, NULL);
    assert_null(r->pd);
    kvr_route_unref(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_targets_and_exclusion, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pins, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reload_keeps_state, setup, teardown),
        cmocka_unit_test_setup_teardown(test_two_routes_learn_apart, setup, teardown),
        cmocka_unit_test_setup_teardown(test_table_lookup, setup, teardown),
        cmocka_unit_test_setup_teardown(test_removed_worker_lives_while_referenced, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_target_weights_reach_the_policy, setup, teardown),
        cmocka_unit_test(test_member_span),
        cmocka_unit_test_setup_teardown(test_pd_sides, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
