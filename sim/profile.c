/* The built-in timing profiles (see profile.h; sources and derivations in docs/sim.md). */
#include "profile.h"

#include <string.h>

static const kvr_sim_profile profiles[] = {
    {
        .name = "h100-llama3.1-8b",
        .summary = "Llama 3.1 8B BF16 on 1x H100 80GB (vLLM V1 defaults)",
        .model = "meta-llama/Llama-3.1-8B-Instruct",
        /* (0.9 x 79.1 GiB - 14.99 GiB weights - 3 GiB runtime) / 128 KiB per token / 16 */
        .kv_blocks = 27238,
        .max_num_seqs = 1024,            /* vLLM get_batch_defaults, >= 70 GiB GPU, API server */
        .max_num_batched_tokens = 8192,  /* same source */
        .max_model_len = 131072,
        .timing = {.step_overhead_us = 6000,        /* 16.06 GB weights / 2.68 TB/s */
                   .prefill_us_per_token = 36,      /* 16.06 GFLOP / 442 TFLOP/s achieved */
                   .decode_us_per_token = 36,       /* same FLOPs as a prompt token */
                   .decode_us_per_kv_token = 0.049} /* 128 KiB / 2.68 TB/s */
    },
    {
        .name = "h100x4-llama3.1-70b",
        .summary = "Llama 3.1 70B BF16 on 4x H100 80GB, tensor parallel 4 (vLLM V1 defaults)",
        .model = "meta-llama/Llama-3.1-70B-Instruct",
        /* per GPU: (0.9 x 79.1 GiB - 32.85 GiB weights - 3 GiB) / 80 KiB per token / 16 */
        .kv_blocks = 28948,
        .max_num_seqs = 1024,
        .max_num_batched_tokens = 8192,
        .max_model_len = 131072,
        .timing = {.step_overhead_us = 18300,       /* NIM ITL 18.58 ms at concurrency 1 */
                   .prefill_us_per_token = 80,      /* NIM TTFT slope 500 -> 5000 tokens */
                   .decode_us_per_token = 80,
                   .decode_us_per_kv_token = 0.031} /* 80 KiB per GPU / 2.68 TB/s */
    },
};

size_t kvr_sim_profile_count(void)
{
    return sizeof(profiles) / sizeof(*profiles);
}

const kvr_sim_profile *kvr_sim_profile_at(size_t i)
{
    return i < kvr_sim_profile_count() ? &profiles[i] : NULL;
}

const kvr_sim_profile *kvr_sim_profile_find(const char *name)
{
    if (!name)
        return NULL;
    for (size_t i = 0; i < kvr_sim_profile_count(); i++)
        if (strcmp(profiles[i].name, name) == 0)
            return &profiles[i];
    return NULL;
}
