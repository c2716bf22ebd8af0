/* The built-in policies' operation tables (see routing/policy.h for the interface). */
#ifndef KVR_ROUTING_POLICIES_H
#define KVR_ROUTING_POLICIES_H
#include "routing/policy.h"

/** Simple policies (src/routing/policy_simple.c); their decision label is their name. */
extern const kvr_policy_ops kvr_policy_round_robin; /**< next eligible worker in turn */
extern const kvr_policy_ops kvr_policy_random;      /**< uniform among eligible */
extern const kvr_policy_ops kvr_policy_least_load;  /**< fewest in-flight, random ties */
extern const kvr_policy_ops kvr_policy_power_of_two; /**< less loaded of two random picks */

/** Key-based policies (one file each under src/routing/).
 *  consistent_hash: ring of 160 virtual nodes per worker keyed by the worker URL (XXH3); key =
 *  session key, else the first block of the routing text, else a random eligible worker; an
 *  ineligible owner passes the key to the next distinct worker clockwise. Label
 *  "consistent_hash", match -1.
 *  rendezvous_hash: the eligible worker with the highest XXH3(URL, seed = key hash), same key
 *  rule. Label "rendezvous_hash", match -1.
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

/** Policies listed by kvr_policy_find() beyond the simple ones (a trailing list, may be empty). */
#define KVR_POLICIES_EXTRA                                                                    \
    &kvr_policy_consistent_hash, &kvr_policy_rendezvous_hash, &kvr_policy_cache_aware,        \
        &kvr_policy_precise, &kvr_policy_lmcache_aware

#endif
