/* Admission queue (DESIGN §12): requests that cannot start now (the process is at
 * --max-inflight, or every eligible worker of their route is at its max_inflight) wait here,
 * bounded by --max-queue and --queue-timeout-ms. Fair across client keys: round robin over the
 * keys that have waiting requests, FIFO within a key, so one key's burst cannot starve
 * another's. The queue knows nothing of requests beyond this intrusive node; the proxy says
 * whether a waiter can start. */
#ifndef KVR_PROXY_ADMISSION_H
#define KVR_PROXY_ADMISSION_H
#include <stddef.h>
#include <stdint.h>

/** A waiting request (embedded in the caller's request state). */
typedef struct kvr_waiter {
    struct kvr_waiter *next;
    const char *key;        /**< the fairness identity (client key name; "-" without auth);
                                 borrowed, must outlive the wait */
    uint64_t since_ms;      /**< when it started waiting (monotonic) */
    int queued;             /**< 1 while in the queue */
    size_t lane;            /**< internal */
} kvr_waiter;

typedef struct kvr_admission kvr_admission;

/** A queue holding at most `max` waiters (0 = none may wait). Never NULL (aborts on OOM). */
kvr_admission *kvr_admission_new(size_t max);
/** Frees the queue (waiters still in it are simply dropped). */
void kvr_admission_free(kvr_admission *q);
/** Changes the bound (reload); waiters already queued stay. */
void kvr_admission_set_max(kvr_admission *q, size_t max);
/** Waiters in the queue. */
size_t kvr_admission_depth(const kvr_admission *q);

/** Queues `w` (its key and since_ms set by the caller). Returns 0, or -1 when the queue is
 *  full. */
int kvr_admission_push(kvr_admission *q, kvr_waiter *w);
/** Takes `w` out (a client gone, a timeout); no-op when it is not queued. */
void kvr_admission_remove(kvr_admission *q, kvr_waiter *w);

/** Offers waiters their turn, fairly: for each key in round-robin order its oldest waiter is
 *  taken out of the queue and passed to `try_start`, which returns 1 when it started (or was
 *  answered otherwise: it stays out) or 0 when it cannot start yet (it goes back to the head of
 *  its key's lane, and the key's later waiters wait behind it). The callback must not push or
 *  remove waiters. Rounds repeat while
 *  any waiter started. Returns how many started. */
size_t kvr_admission_dispatch(kvr_admission *q, int (*try_start)(void *ud, kvr_waiter *w),
                              void *ud);

/** The waiter that has waited longest among the keys' oldest ones, or NULL (timeouts). */
kvr_waiter *kvr_admission_oldest(const kvr_admission *q);

#endif
