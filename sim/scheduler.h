/* kvroute-sim's engine: continuous batching over the KV block pool, modelled on vLLM V1's
 * Scheduler + KVCacheManager (vllm/v1/core/sched/scheduler.py, kv_cache_manager.py):
 *
 * - Each step has a token budget of max_num_batched_tokens. Running sequences go first, in
 *   admission order: each asks for all its not-yet-computed tokens (1 when decoding, the rest
 *   of its prompt when prefilling), cut to the budget left (chunked prefill). A sequence that
 *   cannot get the blocks it needs preempts the most recently admitted running sequence
 *   (its blocks are freed and it goes back to the head of the waiting queue, to be recomputed),
 *   as vLLM's recompute preemption.
 * - Then, if nothing was preempted, waiting sequences are admitted first-come first-served
 *   while the budget lasts and fewer than max_num_seqs run. Admission looks up the longest
 *   cached prefix of full blocks, capped so at least one prompt token is computed (vLLM), takes
 *   those blocks (cached tokens), and allocates the rest; a head that does not fit waits
 *   (head-of-line, like vLLM's FCFS policy).
 * - Full blocks enter the prefix cache when they are scheduled (prompt blocks at prefill and
 *   blocks filled by generated tokens while decoding), exactly as vLLM's cache_blocks().
 * - A step costs step_overhead_us + prefill_tokens × prefill_us_per_token
 *   + decoding_sequences × decode_us_per_token + their context tokens × decode_us_per_kv_token
 *   model µs (timing.h), times time_scale in wall time. Tokens
 *   computed after a preemption count as prefill. When the step ends, every sequence whose
 *   known tokens are all computed samples one token (its first token ends the prefill; TTFT).
 *   A sequence finishes after max_tokens tokens (ignore_eos), freeing its blocks last-first.
 * - With time_scale 0 steps run back to back, one per loop iteration, without sleeping;
 *   otherwise a timerfd (µs precision; a uv_timer has only ms) ends each step.
 *
 * Output tokens are kvr_sim_gen_token(gen_seed, i): deterministic per prompt.
 * Single-threaded; all callbacks run on the loop thread from inside the scheduler. */
#ifndef KVR_SIM_SCHEDULER_H
#define KVR_SIM_SCHEDULER_H
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "kvcache.h"

typedef struct kvr_sim_sched kvr_sim_sched;
typedef struct kvr_sim_seq kvr_sim_seq;

/** Engine settings (flags of the same names). */
typedef struct kvr_sim_sched_cfg {
    uint32_t max_num_seqs;           /**< running sequences at most (vLLM: 256) */
    uint32_t max_num_batched_tokens; /**< tokens per step (vLLM: 8192 on H100) */
    double prefill_us_per_token;     /**< µs per prefill token */
    double decode_us_per_token;      /**< µs per decoding sequence per step */
    double decode_us_per_kv_token;   /**< µs per context token of a decoding sequence (KV read) */
    double step_overhead_us;         /**< µs per step */
    double time_scale;               /**< wall time = model time × time_scale (0: no sleep) */
    uint64_t seed;                   /**< mixed into every sequence's output */
    /** Called when a step's results have been delivered (the KV-event batch is flushed
     *  there, one per step like vLLM). May be NULL. */
    void (*on_step_done)(void *ud);
    void *ud;
} kvr_sim_sched_cfg;

/** Callbacks of one sequence. They run from inside the scheduler; `ud` is the submitter's. */
typedef struct kvr_sim_seq_cbs {
    /** Output token number `index` (0-based) was sampled; `last` when it is the final one
     *  (the sequence then finishes right after this call). The sequence may be aborted from
     *  here with kvr_sim_sched_abort(). */
    void (*on_token)(void *ud, kvr_sim_seq *seq, uint32_t id, size_t index, int last);
    /** The sequence finished (all max_tokens generated); it is freed when this returns. */
    void (*on_finish)(void *ud, kvr_sim_seq *seq);
} kvr_sim_seq_cbs;

/** What a sequence knows about itself (valid until it is freed). */
typedef struct kvr_sim_seq_info {
    size_t prompt_tokens;   /**< prompt length, tokens */
    size_t cached_tokens;   /**< prefix-cache hit at first admission, tokens (usage) */
    size_t output_tokens;   /**< tokens generated so far */
    size_t max_tokens;      /**< tokens to generate */
    uint64_t arrival_ns;    /**< wall, monotonic (kvr_now_ns) */
    uint64_t admitted_ns;   /**< first admission; 0 while waiting */
    uint64_t first_token_ns;/**< 0 before the first token */
    double arrival_model_us;     /**< model clock at submission (sum of step costs, µs) */
    double first_token_model_us; /**< model clock when token 0 was sampled */
    uint32_t preemptions;   /**< times preempted */
} kvr_sim_seq_info;

/** Creates the engine over `kv` (not owned). With `loop` NULL nothing runs by itself: tests
 *  drive it with kvr_sim_sched_step(). `cfg` is copied. NULL on OOM or with a timerfd error. */
kvr_sim_sched *kvr_sim_sched_new(uv_loop_t *loop, kvr_sim_kv *kv, const kvr_sim_sched_cfg *cfg);
/** Aborts every sequence (no callbacks), closes the handles and frees the engine once they are
 *  closed (the loop must run; immediately without a loop). */
void kvr_sim_sched_close(kvr_sim_sched *s);

/** Submits a request: `tokens` (malloc'd, `ntok` prompt ids, ownership moves to the engine,
 *  freed even on failure) must have room for ntok + max_tokens ids. Returns the sequence,
 *  or NULL when out of memory. The caller checks beforehand that ntok + max_tokens tokens fit
 *  the pool at all (kvr_sim_sched_fits). */
kvr_sim_seq *kvr_sim_sched_submit(kvr_sim_sched *s, uint32_t *tokens, size_t ntok,
                                  size_t max_tokens, const kvr_sim_seq_cbs *cbs, void *ud);
/** 1 when a sequence of `total_tokens` (prompt + max_tokens) can ever be held by the pool. */
int kvr_sim_sched_fits(const kvr_sim_sched *s, size_t total_tokens);
/** Stops a sequence: no more callbacks; its blocks are freed at once, or when the step
 *  computing it ends (vLLM handles aborts between steps). Must not be called after on_finish.*/
void kvr_sim_sched_abort(kvr_sim_sched *s, kvr_sim_seq *seq);

/** The sequence's counters. */
const kvr_sim_seq_info *kvr_sim_seq_get_info(const kvr_sim_seq *seq);
/** Seed of the sequence's output (kvr_sim_gen_token's gen_seed). */
uint64_t kvr_sim_seq_gen_seed(const kvr_sim_seq *seq);

/** Manual mode (loop NULL): schedules and completes one step. Returns the number of sequences
 *  that ran in it (0 when idle). The step's model cost is kvr_sim_sched_last_cost_us(). */
size_t kvr_sim_sched_step(kvr_sim_sched *s);
/** The engine's settings as used (max_num_seqs and max_num_batched_tokens at least 1). */
const kvr_sim_sched_cfg *kvr_sim_sched_get_cfg(const kvr_sim_sched *s);
/** Model cost of the last scheduled step, µs (before time_scale). */
double kvr_sim_sched_last_cost_us(const kvr_sim_sched *s);
/** Model clock: the sum of all step costs so far, µs (independent of time_scale). */
double kvr_sim_sched_model_us(const kvr_sim_sched *s);

/** Sequences running (admitted, holding blocks): vllm:num_requests_running. */
size_t kvr_sim_sched_num_running(const kvr_sim_sched *s);
/** Sequences waiting for admission (new or preempted): vllm:num_requests_waiting. */
size_t kvr_sim_sched_num_waiting(const kvr_sim_sched *s);
/** Prefix-cache queries and hits in tokens, counted once per request at first admission
 *  (vllm:prefix_cache_queries / _hits). */
uint64_t kvr_sim_sched_cache_queries(const kvr_sim_sched *s);
/** See kvr_sim_sched_cache_queries(). */
uint64_t kvr_sim_sched_cache_hits(const kvr_sim_sched *s);
/** Preemptions so far (vllm:num_preemptions). */
uint64_t kvr_sim_sched_preemptions(const kvr_sim_sched *s);
/** Steps completed so far. */
uint64_t kvr_sim_sched_steps(const kvr_sim_sched *s);

#endif
