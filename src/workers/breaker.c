/* Circuit breaker state machine (see breaker.h). */
#include "workers/breaker.h"

const char *kvr_breaker_state_name(kvr_breaker_state s)
{
    return s == KVR_BREAKER_OPEN ? "open" : s == KVR_BREAKER_HALF_OPEN ? "half_open" : "closed";
}

int kvr_breaker_on_start(kvr_breaker *b)
{
    if (b->state != KVR_BREAKER_HALF_OPEN || b->trial_inflight)
        return 0;
    b->trial_inflight = 1;
    return 1;
}

void kvr_breaker_on_abandon(kvr_breaker *b, int trial)
{
    if (trial && b->state == KVR_BREAKER_HALF_OPEN)
        b->trial_inflight = 0;
}

static int open_now(kvr_breaker *b, const kvr_breaker_cfg *cfg, uint64_t now_ms)
{
    uint64_t max = cfg->max_cooldown_ms > cfg->cooldown_ms ? cfg->max_cooldown_ms
                                                           : cfg->cooldown_ms;
    b->cooldown_ms = b->cooldown_ms ? b->cooldown_ms * 2 : cfg->cooldown_ms;
    if (b->cooldown_ms > max)
        b->cooldown_ms = max;
    b->state = KVR_BREAKER_OPEN;
    b->open_until_ms = now_ms + b->cooldown_ms;
    b->trial_inflight = 0;
    b->consecutive = 0;
    return KVR_BREAKER_OPEN;
}

int kvr_breaker_on_result(kvr_breaker *b, const kvr_breaker_cfg *cfg, int failure, int trial,
                          uint64_t now_ms)
{
    switch (b->state) {
    case KVR_BREAKER_CLOSED:
        if (!failure) {
            b->consecutive = 0;
            return -1;
        }
        if (cfg->failures == 0 || ++b->consecutive < cfg->failures)
            return -1;
        b->cooldown_ms = 0; /* a fresh opening starts at the base cooldown */
        return open_now(b, cfg, now_ms);
    case KVR_BREAKER_HALF_OPEN:
        if (!trial)
            return -1;
        if (failure)
            return open_now(b, cfg, now_ms);
        b->state = KVR_BREAKER_CLOSED;
        b->consecutive = 0;
        b->cooldown_ms = 0;
        b->trial_inflight = 0;
        return KVR_BREAKER_CLOSED;
    case KVR_BREAKER_OPEN:
    default:
        /* Results of requests that started before it opened change nothing. */
        return -1;
    }
}

int kvr_breaker_tick(kvr_breaker *b, uint64_t now_ms)
{
    if (b->state != KVR_BREAKER_OPEN || now_ms < b->open_until_ms)
        return -1;
    b->state = KVR_BREAKER_HALF_OPEN;
    b->trial_inflight = 0;
    return KVR_BREAKER_HALF_OPEN;
}
