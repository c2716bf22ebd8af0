/* The built-in policies' operation tables (see routing/policy.h for the interface). */
#ifndef KVR_ROUTING_POLICIES_H
#define KVR_ROUTING_POLICIES_H
#include "routing/policy.h"

/** Simple policies (src/routing/policy_simple.c); their decision label is their name. Each
 *  reads the target weights (kvr_route_keys.weights); equal weights behave as none. */
extern const kvr_policy_ops kvr_policy_round_robin; /**< smooth weighted round robin (nginx) */
extern const kvr_policy_ops kvr_policy_random;      /**< in proportion to the weights */
extern const kvr_policy_ops kvr_policy_least_load;  /**< least in-flight / weight, random ties */
extern const kvr_policy_ops kvr_policy_power_of_two; /**< of two random picks, the one with less
                                                          in-flight / weight */

/** Key-based policies (one file each under src/routing/).
 *  consistent_hash: ring of round(160 × target weight) virtual nodes per worker keyed by the
 *  worker URL (XXH3); key = session key, else the first block of the routing text, else a
 *  weighted-random eligible worker; an ineligible owner, or one at its load bound
 *  (hash_load_factor, kvr_load_bound), passes the key to the next distinct worker clockwise.
 *  Label "consistent_hash", match -1.
 *  rendezvous_hash: the eligible worker with the highest XXH3(URL, seed = key hash), weighted
 *  HRW with unequal weights, same key rule; one at its load bound passes the key to the next
 *  in score order. Label "rendezvous_hash", match -1.
 *  Both count the picks that passed over the key's owner for its load (stats.hash_overflows).
 *  cache_aware: session map + prefix index, decision procedure of DESIGN §7; extra accessors
 *  (metrics, /workers, /debug/route) in routing/policy_cache_aware.h. */
extern const kvr_policy_ops kvr_policy_consistent_hash;
extern const kvr_policy_ops kvr_policy_rendezvous_hash;
extern const kvr_policy_ops kvr_policy_cache_aware;
/** precise: cache_aware whose prefix stage first asks the KV block index (fed by the workers'
 *  vLLM KV events) for workers in the exact trust state; see routing/policy_cache_aware.h. */
extern const kvr_policy_ops kvr_policy_precise;
/** lmcache_aware: the eligible worker whose LMCache status endpoint reports the most free
 *  capacity (1 − occupancy), then the fewest in-flight, random ties; a worker without a fresh
 *  well-formed answer is neutral (ranked at the median free capacity of those with one, 0.5
 *  when none), one whose cache is unavailable ranks last. Label "lmcache_aware", match -1. */
extern const kvr_policy_ops kvr_policy_lmcache_aware;

/** pipeline (seed 004): the eligible worker with the best weighted sum of the scorers of
 *  routing/scorers.h (weights: the route's `scorers`), random ties; label "pipeline".
 *  cost: the eligible worker with the least predicted prefill time (routing/policy_cost.h),
 *  random ties, label "min_cost"; the session's worker while its cost is within 2× of the
 *  least ("session_id_match"). Both learn through an embedded precise instance
 *  (routing/scored.h) and read the prompt's token ids only where a worker has KV events. */
extern const kvr_policy_ops kvr_policy_pipeline;
extern const kvr_policy_ops kvr_policy_cost;

/** Policies listed by kvr_policy_find() beyond the simple ones (a trailing list, may be empty). */
#define KVR_POLICIES_EXTRA                                                                    \
    &kvr_policy_consistent_hash, &kvr_policy_rendezvous_hash, &kvr_policy_cache_aware,        \
        &kvr_policy_precise, &kvr_policy_lmcache_aware, &kvr_policy_pipeline, &kvr_policy_cost

#endif
