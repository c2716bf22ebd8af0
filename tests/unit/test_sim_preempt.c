/* kvroute-sim engine, recompute preemption (vLLM V1): when a running sequence cannot get a KV
 * block, the newest running sequence is preempted (its blocks freed, back to the head of the
 * waiting queue) and recomputed later; every request still finishes with all its tokens, the
 * same tokens it would have produced unpreempted, and no block leaks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "scheduler.h"

enum { NREQ = 4, PROMPT = 48, MAXTOK = 40 };

typedef struct req {
    uint32_t out[MAXTOK];
    size_t nout;
    int finished;
    uint32_t preemptions;
    uint64_t finish_order;
} req;

static uint64_t finished_so_far;

static void on_token(void *ud, kvr_sim_seq *seq, uint32_t id, size_t index, int last)
{
    (void)seq, (void)last;
    req *r = ud;
    assert_int_equal(index, r->nout);
    assert_true(r->nout < MAXTOK);
    r->out[r->nout++] = id;
}

static void on_finish(void *ud, kvr_sim_seq *seq)
{
    req *r = ud;
    r->finished = 1;
    r->preemptions = kvr_sim_seq_get_info(seq)->preemptions;
    r->finish_order = finished_so_far++;
}

static const kvr_sim_seq_cbs cbs = {on_token, on_finish};

/* Runs NREQ distinct requests (PROMPT + MAXTOK tokens = 6 blocks each) over `blocks` blocks. */
static uint64_t run(uint32_t blocks, req *reqs)
{
    finished_so_far = 0;
    kvr_sim_kv *kv = kvr_sim_kv_new(blocks, 16, 0);
    kvr_sim_sched_cfg c = {.max_num_seqs = 16, .max_num_batched_tokens = 8192,
                           .prefill_us_per_token = 10, .decode_us_per_token = 100,
                           .step_overhead_us = 1000, .seed = 3};
    kvr_sim_sched *s = kvr_sim_sched_new(NULL, kv, &c);
    for (int i = 0; i < NREQ; i++) {
        memset(&reqs[i], 0, sizeof(reqs[i]));
        uint32_t *t = malloc((PROMPT + MAXTOK) * sizeof(*t));
        for (uint32_t k = 0; k < PROMPT; k++)
            t[k] = 1000u * (uint32_t)(i + 1) + k; /* no shared prefix */
        assert_true(kvr_sim_sched_fits(s, PROMPT + MAXTOK));
        assert_non_null(kvr_sim_sched_submit(s, t, PROMPT, MAXTOK, &cbs, &reqs[i]));
    }
    int steps = 0;
    while (kvr_sim_sched_step(s) && steps < 10000)
        steps++;
    assert_true(steps < 10000);
    assert_int_equal(kvr_sim_sched_num_running(s), 0);
    assert_int_equal(kvr_sim_sched_num_waiting(s), 0);
    assert_int_equal(kvr_sim_kv_num_used(kv), 0); /* nothing leaked */
    uint64_t preemptions = kvr_sim_sched_preemptions(s);
    kvr_sim_sched_close(s);
    kvr_sim_kv_free_pool(kv);
    return preemptions;
}

static void test_kv_exhausted_preempts_newest_and_all_finish(void **state)
{
    (void)state;
    req ample[NREQ], tight[NREQ];
    assert_int_equal(run(1000, ample), 0); /* room for all: no preemption */
    /* 4 × 6 blocks needed at the end, 16 available: all four are admitted (3 blocks of prompt
     * each), then decoding runs out of blocks */
    uint64_t n = run(16, tight);
    assert_true(n >= 1);
    for (int i = 0; i < NREQ; i++) {
        assert_true(tight[i].finished);
        assert_int_equal(tight[i].nout, MAXTOK);
        /* recomputation changes nothing in the output */
        assert_memory_equal(tight[i].out, ample[i].out, sizeof(ample[i].out));
    }
    /* the oldest request is never the victim; the newest is */
    assert_int_equal(tight[0].preemptions, 0);
    assert_true(tight[NREQ - 1].preemptions >= 1);
    assert_int_equal(tight[0].finish_order, 0);
    uint64_t total = 0;
    for (int i = 0; i < NREQ; i++)
        total += tight[i].preemptions;
    assert_int_equal(total, n);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv_exhausted_preempts_newest_and_all_finish),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
