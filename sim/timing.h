/* kvroute-sim's step-time model: what one engine step costs in model time, from the work in
 * it. Everything is model time (µs of GPU time); the engine multiplies by --time-scale to get
 * wall time. The terms and the values of the built-in profiles are explained, with their
 * sources, in docs/sim.md ("Timing profiles"). */
#ifndef KVR_SIM_TIMING_H
#define KVR_SIM_TIMING_H
#include <stddef.h>
#include <stdint.h>

/** Cost coefficients of one step, model µs. A step costs
 *  step_overhead_us + prefill_tokens × prefill_us_per_token
 *  + decode_seqs × decode_us_per_token + decode_kv_tokens × decode_us_per_kv_token. */
typedef struct kvr_sim_timing {
    double step_overhead_us;       /**< per step: reading the weights once (memory-bound) */
    double prefill_us_per_token;   /**< per prompt token computed (compute-bound GEMMs) */
    double decode_us_per_token;    /**< per decoding sequence (its one token's GEMMs) */
    double decode_us_per_kv_token; /**< per KV token a decoding sequence attends to (reading
                                        its KV cache: bytes per token / HBM bandwidth) */
} kvr_sim_timing;

/** The work scheduled in one step. */
typedef struct kvr_sim_step_load {
    size_t prefill_tokens;   /**< prompt (or recomputed) tokens, all sequences, tokens */
    size_t decode_seqs;      /**< sequences generating one token, sequences */
    size_t decode_kv_tokens; /**< sum over decoding sequences of their context, tokens */
} kvr_sim_step_load;

/** Model cost of a step with load `l`, µs (≥ 0; negative coefficients count as 0). A step with
 *  no work costs nothing. */
double kvr_sim_step_cost_us(const kvr_sim_timing *t, const kvr_sim_step_load *l);

/** Model TTFT of one prompt on an idle engine, µs: the prompt's uncached tokens
 *  (prompt_tokens - cached_tokens, at least 1) run in chunks of at most `budget` tokens
 *  (max_num_batched_tokens), one step each; the first token is sampled at the end of the last
 *  chunk. `budget` 0 counts as 1. */
double kvr_sim_idle_ttft_us(const kvr_sim_timing *t, size_t prompt_tokens, size_t cached_tokens,
                            uint32_t budget);

#endif
