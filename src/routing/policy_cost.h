/* cost policy (routing/policies.h): the arithmetic, exposed for unit tests.
 *
 * For each eligible worker the predicted prefill work is the prompt tokens already sent there
 * whose first byte has not come back (pending), plus this request's uncached tokens there
 * (prompt tokens minus the predicted match, at least 1: an engine always computes the last
 * token), times that worker's measured seconds per prefill token. The least wins. */
#ifndef KVR_ROUTING_POLICY_COST_H
#define KVR_ROUTING_POLICY_COST_H

/** Seconds per prefill token assumed while no worker was measured (~40,000 tokens/s, one
 *  H100 on an 8B model); only the ratio between workers matters, so this only sets units. */
#define KVR_COST_DEFAULT_SPT 25e-6

/** A worker's prefill speed, learned from first-byte times. A first byte's time is a fixed
 *  part (network, one scheduler step: the fastest first byte seen, `base_ms`) plus the prefill
 *  of the tokens it covered (its own and those pending ahead of it). Decayed sums of the
 *  samples' milliseconds, tokens and count give seconds per token = (Σms − count × base) / Σtokens:
 *  long prefills weigh more than short ones, recent samples more than old ones, and a worker
 *  that mostly serves cache hits does not look slow for its fixed part. */
typedef struct kvr_prefill_rate {
    double ms;
    double tokens;
    double n;
    double base_ms;
} kvr_prefill_rate;

/** Adds a sample: a first byte `ms` after sending, covering `tokens` (> 0) of prefill. */
void kvr_prefill_rate_observe(kvr_prefill_rate *r, double tokens, double ms);
/** Seconds per prefill token; 0 while unmeasured (no sample yet, or none above the floor). */
double kvr_prefill_rate_spt(const kvr_prefill_rate *r);

/** Tokens a worker would prefill: max(1, prompt − matched). */
double kvr_cost_uncached(double prompt_tokens, double matched_tokens);
/** Predicted prefill seconds: (pending + uncached) × seconds per token. */
double kvr_cost_predict(double pending_tokens, double uncached_tokens, double spt);

#endif
