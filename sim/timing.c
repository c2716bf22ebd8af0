/* Step-time model (see timing.h). */
#include "timing.h"

static double nonneg(double v)
{
    return v > 0 ? v : 0; /* also maps NaN to 0 */
}

double kvr_sim_step_cost_us(const kvr_sim_timing *t, const kvr_sim_step_load *l)
{
    if (l->prefill_tokens == 0 && l->decode_seqs == 0)
        return 0;
    return nonneg(t->step_overhead_us) +
           (double)l->prefill_tokens * nonneg(t->prefill_us_per_token) +
           (double)l->decode_seqs * nonneg(t->decode_us_per_token) +
           (double)l->decode_kv_tokens * nonneg(t->decode_us_per_kv_token);
}

double kvr_sim_idle_ttft_us(const kvr_sim_timing *t, size_t prompt_tokens, size_t cached_tokens,
                            uint32_t budget)
{
    size_t left = prompt_tokens > cached_tokens ? prompt_tokens - cached_tokens : 0;
    if (left == 0)
        left = 1; /* vLLM always computes the last prompt token */
    if (budget == 0)
        budget = 1;
    double us = 0;
    while (left > 0) {
        size_t n = left < budget ? left : budget;
        kvr_sim_step_load l = {.prefill_tokens = n};
        us += kvr_sim_step_cost_us(t, &l);
        left -= n;
    }
    return us;
}
