/* Circuit breaker (passive health) of one worker: a pure state machine, driven by the results
 * of the requests the worker served (DESIGN §11).
 *
 *   closed ──(`failures` consecutive failures)──▶ open ──(cooldown passed)──▶ half_open
 *   half_open: exactly one trial request; success → closed (cooldown reset),
 *              failure → open again with the cooldown doubled (capped at max_cooldown_ms).
 *
 * A failure is what the worker is blamed for: connect error or timeout, first-byte timeout, a
 * connection closed or reset before its response ended, a 5xx status, a stalled stream. A 4xx
 * or a completed response is a success; a client abort is no verdict at all. The same shape as
 * Envoy's outlier detection (consecutive 5xx, ejection time doubling per ejection). */
#ifndef KVR_WORKERS_BREAKER_H
#define KVR_WORKERS_BREAKER_H
#include <stdint.h>

/** States, numbered as kvroute_worker_breaker_state reports them. */
typedef enum kvr_breaker_state {
    KVR_BREAKER_CLOSED = 0,
    KVR_BREAKER_OPEN = 1,
    KVR_BREAKER_HALF_OPEN = 2,
} kvr_breaker_state;

/** "closed", "open", "half_open": the `state` label of kvroute_breaker_transitions_total. */
const char *kvr_breaker_state_name(kvr_breaker_state s);

/** Settings (flags --breaker-failures, --breaker-cooldown-ms, --breaker-max-cooldown-ms). */
typedef struct kvr_breaker_cfg {
    uint32_t failures;         /**< consecutive failures that open it (5); 0 = never opens */
    uint64_t cooldown_ms;      /**< first open period (5000) */
    uint64_t max_cooldown_ms;  /**< cap of the doubling (60000; may equal cooldown_ms) */
} kvr_breaker_cfg;

/** One worker's breaker. Zero-initialised = closed. */
typedef struct kvr_breaker {
    kvr_breaker_state state;
    uint32_t consecutive;      /**< failures in a row while closed */
    uint64_t cooldown_ms;      /**< the current open period (0 = not opened yet) */
    uint64_t open_until_ms;    /**< while open: when it becomes half_open (monotonic ms) */
    int trial_inflight;        /**< half_open: the one trial request is running */
} kvr_breaker;

/** 1 when the breaker lets a new request through: closed, or half_open with no trial running. */
static inline int kvr_breaker_admits(const kvr_breaker *b)
{
    return b->state == KVR_BREAKER_CLOSED ||
           (b->state == KVR_BREAKER_HALF_OPEN && !b->trial_inflight);
}

/** A request starts on the worker. Returns 1 when it is the half_open trial (keep that with
 *  the request), else 0. */
int kvr_breaker_on_start(kvr_breaker *b);
/** A request's verdict: `failure` 1 or 0; `trial` as kvr_breaker_on_start returned (in
 *  half_open only the trial decides; older requests' results are ignored). Returns the state
 *  entered when it changed, else -1. */
int kvr_breaker_on_result(kvr_breaker *b, const kvr_breaker_cfg *cfg, int failure, int trial,
                          uint64_t now_ms);
/** A request ended without a verdict (client abort, cancelled): a trial frees its slot. */
void kvr_breaker_on_abandon(kvr_breaker *b, int trial);
/** Time passes: open → half_open once the cooldown is over. Returns the state entered when it
 *  changed, else -1. */
int kvr_breaker_tick(kvr_breaker *b, uint64_t now_ms);

#endif
