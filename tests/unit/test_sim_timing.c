/* kvroute-sim step-time model and timing profiles: the cost formula, chunked idle TTFT, the
 * profile table and applying a profile to the configuration; the KV-read term in the engine. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "profile.h"
#include "scheduler.h"
#include "sim.h"
#include "timing.h"

static int near(double a, double b)
{
    return fabs(a - b) < 1e-6 * (fabs(b) + 1);
}

static void test_step_cost_formula(void **state)
{
    (void)state;
    kvr_sim_timing t = {.step_overhead_us = 1000, .prefill_us_per_token = 10,
                        .decode_us_per_token = 100, .decode_us_per_kv_token = 0.5};
    kvr_sim_step_load idle = {0};
    assert_true(kvr_sim_step_cost_us(&t, &idle) == 0);
    kvr_sim_step_load l = {.prefill_tokens = 200, .decode_seqs = 3, .decode_kv_tokens = 3000};
    assert_true(near(kvr_sim_step_cost_us(&t, &l), 1000 + 2000 + 300 + 1500));
    /* bad coefficients never make a step cost negative */
    kvr_sim_timing bad = {.step_overhead_us = -5, .prefill_us_per_token = NAN,
                          .decode_us_per_token = -1, .decode_us_per_kv_token = 2};
    assert_true(near(kvr_sim_step_cost_us(&bad, &l), 6000));
}

static void test_idle_ttft_chunks_by_budget(void **state)
{
    (void)state;
    kvr_sim_timing t = {.step_overhead_us = 1000, .prefill_us_per_token = 10};
    /* 10000 tokens, budget 8192: two steps */
    assert_true(near(kvr_sim_idle_ttft_us(&t, 10000, 0, 8192), 2 * 1000 + 10000 * 10));
    /* a cache hit leaves fewer tokens; a full hit still computes one */
    assert_true(near(kvr_sim_idle_ttft_us(&t, 10000, 9984, 8192), 1000 + 16 * 10));
    assert_true(near(kvr_sim_idle_ttft_us(&t, 100, 100, 8192), 1000 + 10));
    assert_true(near(kvr_sim_idle_ttft_us(&t, 3, 0, 0), 3 * 1010)); /* budget 0 → 1 */
}

static void test_profile_table(void **state)
{
    (void)state;
    assert_true(kvr_sim_profile_count() >= 2);
    const kvr_sim_profile *p8 = kvr_sim_profile_find("h100-llama3.1-8b");
    const kvr_sim_profile *p70 = kvr_sim_profile_find("h100x4-llama3.1-70b");
    assert_non_null(p8);
    assert_non_null(p70);
    assert_null(kvr_sim_profile_find("h100"));
    assert_null(kvr_sim_profile_find(NULL));
    assert_null(kvr_sim_profile_at(kvr_sim_profile_count()));
    for (size_t i = 0; i < kvr_sim_profile_count(); i++) {
        const kvr_sim_profile *p = kvr_sim_profile_at(i);
        assert_ptr_equal(kvr_sim_profile_find(p->name), p);
        assert_true(p->kv_blocks > 0 && p->max_num_seqs > 0 && p->max_num_batched_tokens > 0);
        assert_true(p->timing.step_overhead_us > 0 && p->timing.prefill_us_per_token > 0);
        /* a full-length request fits the pool */
        assert_true((uint64_t)p->kv_blocks * KVR_SIM_PROFILE_BLOCK_SIZE >= p->max_model_len);
    }
    /* vLLM's H100 defaults for the API server */
    assert_int_equal(p8->max_num_batched_tokens, 8192);
    assert_int_equal(p8->max_num_seqs, 1024);
}

/* The sanity bound: a 2,000-token prompt at idle takes 20 ms..1 s of model time on
 * the 8B profile, and less than on the 70B profile. */
static void test_profile_idle_ttft_sane(void **state)
{
    (void)state;
    const kvr_sim_profile *p8 = kvr_sim_profile_find("h100-llama3.1-8b");
    const kvr_sim_profile *p70 = kvr_sim_profile_find("h100x4-llama3.1-70b");
    double t8 = kvr_sim_idle_ttft_us(&p8->timing, 2000, 0, p8->max_num_batched_tokens);
    double t70 = kvr_sim_idle_ttft_us(&p70->timing, 2000, 0, p70->max_num_batched_tokens);
    assert_true(t8 >= 20e3 && t8 <= 1e6);
    assert_true(t70 >= 20e3 && t70 <= 1e6);
    assert_true(t8 < t70);
    /* decode: one sequence at 2,000 tokens of context, a few ms per token */
    kvr_sim_step_load d = {.decode_seqs = 1, .decode_kv_tokens = 2000};
    double i8 = kvr_sim_step_cost_us(&p8->timing, &d);
    double i70 = kvr_sim_step_cost_us(&p70->timing, &d);
    assert_true(i8 >= 2e3 && i8 <= 50e3 && i8 < i70 && i70 <= 100e3);
}

static void test_apply_profile_to_config(void **state)
{
    (void)state;
    kvr_sim_config c;
    kvr_sim_config_default(&c);
    assert_null(c.profile);
    assert_true(c.decode_us_per_kv_token == 0); /* the old linear model by default */
    assert_int_equal(kvr_sim_config_apply_profile(&c, "no-such-profile"), -1);
    assert_null(c.profile);
    assert_int_equal(c.kv_blocks, 28000);
    assert_int_equal(kvr_sim_config_apply_profile(&c, "h100x4-llama3.1-70b"), 0);
    const kvr_sim_profile *p = kvr_sim_profile_find("h100x4-llama3.1-70b");
    assert_string_equal(c.profile, p->name);
    assert_string_equal(c.model, p->model);
    assert_int_equal(c.kv_blocks, p->kv_blocks);
    assert_int_equal(c.block_size, 16);
    assert_int_equal(c.max_num_seqs, p->max_num_seqs);
    assert_int_equal(c.max_num_batched_tokens, p->max_num_batched_tokens);
    assert_true(c.step_overhead_us == p->timing.step_overhead_us);
    assert_true(c.prefill_us_per_token == p->timing.prefill_us_per_token);
    assert_true(c.decode_us_per_token == p->timing.decode_us_per_token);
    assert_true(c.decode_us_per_kv_token == p->timing.decode_us_per_kv_token);
}

/* The engine charges decoding sequences for the context they read. */
static void test_engine_charges_kv_reads(void **state)
{
    (void)state;
    kvr_sim_kv *kv = kvr_sim_kv_new(100, 16, 0);
    kvr_sim_sched_cfg c = {.max_num_seqs = 4, .max_num_batched_tokens = 8192,
                           .prefill_us_per_token = 10, .decode_us_per_token = 100,
                           .decode_us_per_kv_token = 1, .step_overhead_us = 1000, .seed = 1};
    kvr_sim_sched *s = kvr_sim_sched_new(NULL, kv, &c);
    assert_true(kvr_sim_sched_get_cfg(s)->decode_us_per_kv_token == 1);
    uint32_t *t = malloc((300 + 3) * sizeof(*t));
    for (uint32_t i = 0; i < 300; i++)
        t[i] = 7 + i;
    assert_non_null(kvr_sim_sched_submit(s, t, 300, 3, NULL, NULL));
    assert_int_equal(kvr_sim_sched_step(s), 1); /* prefill: token 0 */
    assert_true(near(kvr_sim_sched_last_cost_us(s), 1000 + 300 * 10));
    assert_int_equal(kvr_sim_sched_step(s), 1); /* decode with 301 tokens of context */
    assert_true(near(kvr_sim_sched_last_cost_us(s), 1000 + 100 + 301));
    assert_int_equal(kvr_sim_sched_step(s), 1);
    assert_true(near(kvr_sim_sched_last_cost_us(s), 1000 + 100 + 302));
    assert_int_equal(kvr_sim_sched_step(s), 0);
    kvr_sim_sched_close(s);
    kvr_sim_kv_free_pool(kv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_step_cost_formula),
        cmocka_unit_test(test_idle_ttft_chunks_by_budget),
        cmocka_unit_test(test_profile_table),
        cmocka_unit_test(test_profile_idle_ttft_sane),
        cmocka_unit_test(test_apply_profile_to_config),
        cmocka_unit_test(test_engine_charges_kv_reads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
