/* kvroute-sim timing profiles (`--profile NAME`): named sets of engine settings calibrated from
 * published measurements of Llama 3.1 on H100 GPUs. A profile is one row of a table (data, no
 * code per profile); docs/sim.md ("Timing profiles") gives every value's source and
 * derivation. Flags given on the command line override a profile's values. */
#ifndef KVR_SIM_PROFILE_H
#define KVR_SIM_PROFILE_H
#include <stddef.h>
#include <stdint.h>

#include "timing.h"

/** One profile. All times are model time. */
typedef struct kvr_sim_profile {
    const char *name;                /**< `--profile` value, e.g. "h100-llama3.1-8b" */
    const char *summary;             /**< one line for --help */
    const char *model;               /**< served model name (--model) */
    uint32_t kv_blocks;              /**< KV capacity, blocks of 16 tokens (num_gpu_blocks) */
    uint32_t max_num_seqs;           /**< running sequences at most (vLLM's default on H100) */
    uint32_t max_num_batched_tokens; /**< tokens per step, the chunked-prefill budget */
    uint32_t max_model_len;          /**< prompt + output tokens (Llama 3.1: 131072) */
    kvr_sim_timing timing;           /**< step cost coefficients, µs */
} kvr_sim_profile;

/** Block size the profiles' kv_blocks assume, tokens (vLLM's CUDA default). */
#define KVR_SIM_PROFILE_BLOCK_SIZE 16

/** Number of built-in profiles. */
size_t kvr_sim_profile_count(void);
/** Profile `i` (0 ≤ i < count), or NULL. */
const kvr_sim_profile *kvr_sim_profile_at(size_t i);
/** The profile named `name` (exact match), or NULL (also for NULL). */
const kvr_sim_profile *kvr_sim_profile_find(const char *name);

#endif
