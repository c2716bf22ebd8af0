/* Per-key rate limits (DESIGN §12): requests and tokens per minute for a client key, over a
 * sliding 60-second window of one-second slots. Tokens are what a request may cost before it
 * runs (its prompt tokens, estimated, plus max_tokens / max_completion_tokens) and are settled
 * against the response's usage when it ends. Headers follow OpenAI's x-ratelimit-* names. */
#ifndef KVR_PROXY_RATELIMIT_H
#define KVR_PROXY_RATELIMIT_H
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"

typedef struct kvr_ratelimits kvr_ratelimits;

/** Limits from the config (copied). Never NULL (aborts on OOM); with n == 0 nothing is
 *  limited. */
kvr_ratelimits *kvr_ratelimits_new(const kvr_rate_limit_spec *specs, size_t n);
void kvr_ratelimits_free(kvr_ratelimits *rl);

/** What the x-ratelimit-* headers say after a decision; `limited` 0 when the key has no
 *  limit (no headers then). */
typedef struct kvr_ratelimit_info {
    int limited;                  /**< the key has a limit */
    uint64_t limit_requests, remaining_requests, reset_requests_s;
    uint64_t limit_tokens, remaining_tokens, reset_tokens_s;
    uint64_t retry_after_s;       /**< when refused: seconds until it would fit */
} kvr_ratelimit_info;

/** One request of `key` that may cost `tokens`: returns 0 and counts it (1 request, `tokens`
 *  tokens) when it fits, 1 when a limit refuses it (nothing counted). `info` is filled either
 *  way. */
int kvr_ratelimit_take(kvr_ratelimits *rl, const char *key, uint64_t tokens, uint64_t now_ms,
                       kvr_ratelimit_info *info);
/** Settles a request's tokens: `delta` = actual − estimated (may be negative), counted in the
 *  current slot. */
void kvr_ratelimit_settle(kvr_ratelimits *rl, const char *key, int64_t delta, uint64_t now_ms);

#endif
