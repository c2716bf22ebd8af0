/* cache_aware policy (DESIGN §7): exact session affinity, then prefix affinity, then least
 * load, with an overload gate. The ops table is kvr_policy_cache_aware (routing/policies.h);
 * this header adds what the metrics, GET /workers and POST /debug/route need. Every function
 * here takes the instance returned by kvr_policy_cache_aware.create (check the route's ops
 * pointer first: passing another policy's instance is undefined).
 *
 * Decision for a request over the eligible set E (loads = in-flight attempts, min over E):
 *   overloaded(w) ⇔ load(w) − min > balance_abs_threshold ∧ load(w) > min × balance_rel_threshold
 *   1. session key bound (session map, TTL not expired) to a worker in E, not overloaded
 *      → that worker, "session_id_match";
 *   2. else best prefix match ratio (matched bytes / text bytes) ≥ cache_threshold (and > 0),
 *      ties at random among the best not overloaded → "prefix_match";
 *   3. else least loaded (ties at random) → "load_balance" if 1 or 2 was refused for load,
 *      else "empty_key_min_load" without routing text, else "low_match_min_load".
 * kvr_pick.match = best ratio over E (-1 without routing text).
 *
 * Learning: teach() (call when the worker's 2xx response headers arrive, never for failed
 * attempts) binds the session to the worker and records the routing text under it; a worker's
 * per-worker index cap comes from --worker-index-blocks when set, else from its published KV
 * capacity (kvr_worker.kv_tokens), else the global cap. forget_worker() drops all of it at once.
 *
 * Self-correction (seed 002's "optimistic with fallback"; the `correct` op): a pick scored by
 * the prefix index keeps the use stamps of the chosen worker's matched blocks as they were at
 * the pick (kvr_pick.use). When that worker then reports fewer cached tokens than predicted by
 * more than one block (the caller's test) and less than half the prediction (smaller
 * shortfalls are what byte-proportional predictions are off by anyway), it evidently evicted
 * the prefix from the first block it no longer had (reported share of the prompt × routing
 * text bytes ÷ block_bytes) and, being an LRU cache, everything it had used no later than that:
 * those entries go from its index, and its cap drops to what remains, never below twice the
 * request's own blocks (kvr_prefix_index_correct). The caller then teaches the request again.
 * A report of more cached tokens than predicted lifts a cap lowered that way by the difference
 * (a cleared cache refills; nothing else would show the lowered cap is too low). The exact KV
 * index is not corrected here: its events do. */
#ifndef KVR_ROUTING_POLICY_CACHE_AWARE_H
#define KVR_ROUTING_POLICY_CACHE_AWARE_H
#include <stddef.h>
#include <stdint.h>

#include "index/session_map.h"
#include "routing/policy.h"

/** Counters of one instance (the ops table's `stats`). */
typedef kvr_policy_stats kvr_cache_aware_stats;
/** Fills `out` for instance `self`. */
void kvr_cache_aware_stats_get(void *self, kvr_cache_aware_stats *out);

/** Per-worker figures (the ops table's `worker_stats`). */
typedef kvr_policy_worker_stats kvr_cache_aware_worker_stats;
/** Fills `out` for registry id `worker_id` (zeros and the default cap when unknown). */
void kvr_cache_aware_worker_stats_get(void *self, size_t worker_id,
                                      kvr_cache_aware_worker_stats *out);

/** One row of POST /debug/route's answer (the ops table's `explain`). */
typedef kvr_explain_row kvr_cache_aware_explain_row;

/** Runs the decision exactly as pick() does (learning nothing) and describes it: `rows` gets
 *  one entry per eligible worker, in the order of `eligible` (`n` rows, caller-allocated);
 *  `out` gets the decision. Returns 0, or -1 when n is 0 or memory ran out. */
int kvr_cache_aware_explain(void *self, kvr_worker *const *eligible, size_t n,
                            const kvr_route_keys *k, kvr_cache_aware_explain_row *rows,
                            kvr_pick *out);

/** Drops up to `max` expired sessions (call from a periodic timer; teach() also sweeps a few).
 *  Returns the number dropped. */
size_t kvr_cache_aware_sweep(void *self, size_t max);

/** What the instance knows of one eligible worker for a request, for the policies that score
 *  workers with it (pipeline, cost: routing/policies.h). */
typedef struct kvr_cache_aware_score {
    double ratio;          /**< match ratio 0..1 from the index that vouches for the worker (as
                                the decision uses it); 0 without routing text */
    size_t matched_bytes;  /**< leading routing-text bytes the prefix index credits it with */
    int exact;             /**< 1: scored by the KV block index (precise, worker exact) */
    size_t kv_blocks;      /**< exact: leading prompt blocks resident there */
    uint32_t block_size;   /**< exact: its block size in tokens, else 0 */
} kvr_cache_aware_score;

/** Scores the `n` eligible workers for keys `k` exactly as the decision would (learning
 *  nothing): `out[i]` for `el[i]`, and `*session_idx` the index of the worker the session key
 *  is bound to (-1 when none is, or it is not eligible). Returns 0, or -1 when n is 0 or memory
 *  ran out. */
int kvr_cache_aware_scores(void *self, kvr_worker *const *el, size_t n, const kvr_route_keys *k,
                           kvr_cache_aware_score *out, int *session_idx);

#endif
