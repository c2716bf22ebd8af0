/* kvroute-sim engine in manual mode: cached tokens and TTFT, chunked prefill, max_num_seqs and
 * KV-capacity queueing, preemption, decode blocks cached for the next turn, aborts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "scheduler.h"
#include "tokenizer.h"

typedef struct req {
    kvr_sim_seq *seq;
    uint32_t out[64];
    size_t nout;
    int finished, last_seen;
    size_t cached, prompt;
    double ttft_model_us;
    int abort_at; /* abort from on_token at this index (-1: never) */
    kvr_sim_sched *s;
} req;

static void on_token(void *ud, kvr_sim_seq *seq, uint32_t id, size_t index, int last)
{
    req *r = ud;
    assert_int_equal(index, r->nout);
    r->out[r->nout++] = id;
    r->last_seen = last;
    if (index == 0) {
        const kvr_sim_seq_info *in = kvr_sim_seq_get_info(seq);
        r->ttft_model_us = in->first_token_model_us - in->arrival_model_us;
    }
    if (r->abort_at >= 0 && (size_t)r->abort_at == index)
        kvr_sim_sched_abort(r->s, seq);
}

static void on_finish(void *ud, kvr_sim_seq *seq)
{
    req *r = ud;
    const kvr_sim_seq_info *in = kvr_sim_seq_get_info(seq);
    r->finished = 1;
    r->cached = in->cached_tokens;
    r->prompt = in->prompt_tokens;
    assert_int_equal(in->output_tokens, r->nout);
}

static const kvr_sim_seq_cbs cbs = {on_token, on_finish};

static kvr_sim_sched_cfg config(uint32_t max_seqs, uint32_t budget)
{
    kvr_sim_sched_cfg c = {.max_num_seqs = max_seqs, .max_num_batched_tokens = budget,
                           .prefill_us_per_token = 10, .decode_us_per_token = 100,
                           .step_overhead_us = 1000, .time_scale = 0, .seed = 1};
    return c;
}

/* Submits tokens base..base+n-1 (or `ids` when given). */
static void submit(kvr_sim_sched *s, req *r, const uint32_t *ids, size_t n, size_t max_tokens)
{
    memset(r, 0, sizeof(*r));
    r->abort_at = -1;
    r->s = s;
    uint32_t *t = malloc((n + max_tokens) * sizeof(*t));
    for (size_t i = 0; i < n; i++)
        t[i] = ids[i];
    r->seq = kvr_sim_sched_submit(s, t, n, max_tokens, &cbs, r);
    assert_non_null(r->seq);
}

static void run_all(kvr_sim_sched *s)
{
    for (int i = 0; i < 10000 && kvr_sim_sched_step(s); i++)
        ;
    assert_int_equal(kvr_sim_sched_num_running(s), 0);
    assert_int_equal(kvr_sim_sched_num_waiting(s), 0);
}

static uint32_t prompt[4096];

static void fill_prompt(uint32_t base)
{
    for (size_t i = 0; i < 4096; i++)
        prompt[i] = base + (uint32_t)i;
}

static void test_cache_hit_shortens_ttft(void **state)
{
    (void)state;
    fill_prompt(1000);
    kvr_sim_kv *kv = kvr_sim_kv_new(1000, 16, 0);
    kvr_sim_sched_cfg c = config(8, 8192);
    kvr_sim_sched *s = kvr_sim_sched_new(NULL, kv, &c);
    req a, b;
    submit(s, &a, prompt, 1000, 4);
    assert_int_equal(kvr_sim_sched_step(s), 1);
    assert_true(kvr_sim_sched_last_cost_us(s) == 1000 + 1000 * 10);
    run_all(s);
    assert_true(a.finished && a.last_seen);
    assert_int_equal(a.nout, 4);
    assert_int_equal(a.cached, 0);
    assert_true(a.ttft_model_us == 11000);
    /* the same prompt again: 62 full blocks hit (992 tokens), 8 tokens to prefill */
    submit(s, &b, prompt, 1000, 4);
    run_all(s);
    assert_int_equal(b.cached, 992);
    assert_true(b.ttft_model_us == 1000 + 8 * 10);
    assert_memory_equal(a.out, b.out, sizeof(a.out)); /* deterministic output per prompt */
    assert_int_equal(kvr_sim_sched_cache_queries(s), 2000);
    assert_int_equal(kvr_sim_sched_cache_hits(s), 992);
    assert_int_equal(kvr_sim_kv_num_used(kv), 0);
    kvr_sim_sched_close(s);
    kvr_sim_kv_free_pool(kv);
}

static void test_full_prompt_hit_leaves_one_block_to_compute(void **state)
{
    (void)state;
    fill_prompt(5);
    kvr_sim_kv *kv = kvr_sim_kv_new(100, 16, 0);
    kvr_sim_sched_cfg c = config(8, 8192);
    kvr_sim_sched *s = kvr_sim_sched_new(NULL, kv, &c);
    req a, b;
    submit(s, &a, prompt, 64, 1);
    run_all(s);
    submit(s, &b, prompt, 64, 1);
    run_all(s);
    assert_int_equal(b.cached, 48); /* vLLM: hit capped at num_tokens - 1 → 3 of 4 blocks */
    kvr_sim_sched_close(s);
    kvr_sim_kv_free_pool(kv);
}

/* Generated tokens fill blocks that are cached: the next turn (prompt + answer + more) hits
 * past the old prompt. */
static void test_decode_blocks_cached_for_next_turn(void **state)
{
    (void)state;
    fill_prompt(7);
    kvr_sim_kv *kv = kvr_sim_kv_new(100, 16, 0);
    kvr_sim_sched_cfg c = config(8, 8192);
    kvr_sim_sched *s = kvr_sim_sched_new(NULL, kv, &c);
    req a, b;
    submit(s, &a, prompt, 40, 30); /* computes 40 + 29 = 69 tokens → 4 full blocks */
    run_all(s);
    assert_int_equal(kvr_sim_kv_num_cached(kv), 4);
    uint32_t next[100];
    memcpy(next, prompt, 40 * sizeof(uint32_t));
    memcpy(next + 40, a.out, 30 * sizeof(uint32_t));
    for (int i = 70; i < 100; i++)
        next[i] = 50000 + (uint32_t)i;
    submit(s, &b, next, 100, 2);
    run_all(s);
    assert_int_equal(b.cached, 64);
    kvr_sim_sched_close(s);
    kvr_sim_kv_free_pool(kv);
}

static void test_chunked_prefill(void **state)
{
    (void)state;
    fill_prompt(9);
    kvr_sim_kv *kv = kvr_sim_kv_new(100, 16, 0);
    kvr_sim_sched_cfg c = config(8, 16);
    kvr_sim_sched *s = kvr_sim_sched_new(NULL, kv, &c);
    req a;
    submit(s, &a, prompt, 40, 2);
    kvr_sim_sched_step(s);
    assert_int_equal(a.nout, 0);
    assert_int_equal(kvr_sim_kv_num_cached(kv), 1); /* blocks are cached as chunks fill them */
    kvr_sim_sched_step(s);
    assert_int_equal(a.nout, 0);
    kvr_sim_sched_step(s);
    assert_int_equal(a.nout, 1); /* 16 + 16 + 8 */
    assert_true(a.ttft_model_us == 3 * 1000 + 40 * 10);
    run_all(s);
    assert_true(a.finished);
    kvr_sim_sched_close(s);
    kvr_sim_kv_free_pool(kv);
}

static void test_max_num_seqs_queues(void **state)
{
    (void)state;
    kvr_sim_kv *kv = kvr_sim_kv_new(100, 16, 0);
    kvr_sim_sched_cfg c = config(2, 8192);
    kvr_sim_sched *s = kvr_sim_sched_new(NULL, kv, &c);
    req r[3];
    for (int i = 0; i < 3; i++) {
        fill_prompt(100u * (uint32_t)i + 1);
        submit(s, &r[i], prompt, 20, 3);
    }
    kvr_sim_sched_step(s);
    assert_int_equal(kvr_sim_sched_num_running(s), 2);
    assert_int_equal(kvr_sim_sched_num_waiting(s), 1);
    /* one prefill step plus two decode steps later the first two finish; then the third runs */
    kvr_sim_sched_step(s);
    kvr_sim_sched_step(s);
    assert_true(r[0].finished && r[1].finished);
    assert_int_equal(r[2].nout, 0);
    run_all(s);
    assert_true(r[2].finished);
    assert_true(r[2].ttft_model_us > r[0].ttft_model_us);
    kvr_sim_sched_close(s);
    kvr_sim_kv_free_pool(kv);
}

static void test_kv_capacity_queues(void **state)
{
    (void)state;
    kvr_sim_kv *kv = kvr_sim_kv_new(6, 16, 0);
    kvr_sim_sched_cfg c = config(8, 8192);
    kvr_sim_sched *s = kvr_sim_sched_new(NULL, kv, &c);
    req a, b;
    fill_prompt(1);
    submit(s, &a, prompt, 60, 2); /* 4 blocks */
    fill_prompt(20000);
    submit(s, &b, prompt, 60, 2); /* 4 more do not fit while a runs */
    assert_true(kvr_sim_sched_fits(s, 96));
    assert_false(kvr_sim_sched_fits(s, 97));
    kvr_sim_sched_step(s);
    assert_int_equal(kvr_sim_sched_num_running(s), 1);
    assert_int_equal(kvr_sim_sched_num_waiting(s), 1);
    run_all(s);
    assert_true(a.finished && b.finished);
    assert_true(kvr_sim_kv_evictions(kv) > 0);
    kvr_sim_sched_close(s);
    kvr_sim_kv_free_pool(kv);
}

static void test_preemption_recomputes(void **state)
{
    (void)state;
    /* 4 blocks of 4 tokens; two sequences of 6 prompt tokens each take 2 blocks; decoding needs
     * more, so the later one is preempted, then recomputed after the first finishes. */
    kvr_sim_kv *kv = kvr_sim_kv_new(4, 4, 0);
    kvr_sim_sched_cfg c = config(8, 8192);
    kvr_sim_sched *s = kvr_sim_sched_new(NULL, kv, &c);
    req a, b, solo;
    fill_prompt(1);
    submit(s, &a, prompt, 6, 8);
    fill_prompt(300);
    submit(s, &b, prompt, 6, 8);
    run_all(s);
    assert_true(a.finished && b.finished);
    assert_int_equal(a.nout, 8);
    assert_int_equal(b.nout, 8);
    assert_true(kvr_sim_sched_preemptions(s) >= 1);
    /* output does not depend on preemption */
    kvr_sim_kv *kv2 = kvr_sim_kv_new(100, 4, 0);
    kvr_sim_sched *s2 = kvr_sim_sched_new(NULL, kv2, &c);
    submit(s2, &solo, prompt, 6, 8);
    run_all(s2);
    assert_memory_equal(solo.out, b.out, sizeof(solo.out));
    kvr_sim_sched_close(s2);
    kvr_sim_kv_free_pool(kv2);
    assert_int_equal(kvr_sim_kv_num_used(kv), 0);
    kvr_sim_sched_close(s);
    kvr_sim_kv_free_pool(kv);
}

static void test_aborts_free_blocks(void **state)
{
    (void)state;
    kvr_sim_kv *kv = kvr_sim_kv_new(100, 16, 0);
    kvr_sim_sched_cfg c = config(1, 8192);
    kvr_sim_sched *s = kvr_sim_sched_new(NULL, kv, &c);
    req a, b, d;
    fill_prompt(1);
    submit(s, &a, prompt, 50, 10);
    fill_prompt(1000);
    submit(s, &b, prompt, 50, 10);
    fill_prompt(2000);
    submit(s, &d, prompt, 50, 10);
    kvr_sim_sched_step(s); /* a runs, b and d wait */
    assert_true(kvr_sim_kv_num_used(kv) > 0);
    kvr_sim_sched_abort(s, b.seq); /* waiting */
    kvr_sim_sched_abort(s, a.seq); /* running, between steps */
    assert_int_equal(kvr_sim_kv_num_used(kv), 0);
    assert_int_equal(kvr_sim_sched_num_running(s), 0);
    assert_int_equal(kvr_sim_sched_num_waiting(s), 1);
    d.abort_at = 2; /* from inside its own on_token, like a dropped client */
    run_all(s);
    assert_int_equal(d.nout, 3);
    assert_false(d.finished);
    assert_false(a.finished || b.finished);
    assert_int_equal(kvr_sim_kv_num_used(kv), 0);
    kvr_sim_sched_close(s);
    kvr_sim_kv_free_pool(kv);
}

static void test_close_with_work_pending(void **state)
{
    (void)state;
    kvr_sim_kv *kv = kvr_sim_kv_new(100, 16, 0);
    kvr_sim_sched_cfg c = config(1, 8192);
    kvr_sim_sched *s = kvr_sim_sched_new(NULL, kv, &c);
    req a, b;
    fill_prompt(1);
    submit(s, &a, prompt, 50, 10);
    submit(s, &b, prompt, 50, 10);
    kvr_sim_sched_step(s);
    kvr_sim_sched_close(s); /* frees both sequences, no callbacks */
    assert_false(a.finished || b.finished);
    assert_int_equal(kvr_sim_kv_num_used(kv), 0);
    kvr_sim_kv_free_pool(kv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cache_hit_shortens_ttft),
        cmocka_unit_test(test_full_prompt_hit_leaves_one_block_to_compute),
        cmocka_unit_test(test_decode_blocks_cached_for_next_turn),
        cmocka_unit_test(test_chunked_prefill),
        cmocka_unit_test(test_max_num_seqs_queues),
        cmocka_unit_test(test_kv_capacity_queues),
        cmocka_unit_test(test_preemption_recomputes),
        cmocka_unit_test(test_aborts_free_blocks),
        cmocka_unit_test(test_close_with_work_pending),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
