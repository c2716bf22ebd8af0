/* The pipeline policy's scorers (seed 004: filter → weighted scorers → argmax). Each scores an
 * eligible worker in [0, 1], higher is better; the policy sums them with the route's weights
 * (kvr_policy_cfg.scorers) and takes the best sum, ties at random. The functions here are pure
 * (what they read is passed in), so the arithmetic is unit-tested without a fleet. */
#ifndef KVR_ROUTING_SCORERS_H
#define KVR_ROUTING_SCORERS_H
#include <stddef.h>
#include <stdint.h>

#include "routing/policy.h"

/** The scorers, in the order of kvr_policy_cfg.scorers and kvr_explain_row.scorers. A value
 *  that is unknown for some workers (nothing scraped or polled yet) is neutral for them: the
 *  mean of the workers that have it; when no worker has it, every worker gets the same
 *  constant (1 for queue and kv_usage, 0.5 for lmcache), so it decides nothing. */
typedef enum kvr_scorer {
    KVR_SCORER_PREFIX,   /**< match ratio: the KV block index where the worker is exact, else
                              the prefix index (as cache_aware / precise score it) */
    KVR_SCORER_SESSION,  /**< 1 on the worker the request's session key is bound to, else 0 */
    KVR_SCORER_LOAD,     /**< 1 − (in-flight / target weight) ÷ the largest such value among the
                              eligible workers; 1 for all when that largest value is 0. Under
                              load, in-flight requests settle in proportion to the weights */
    KVR_SCORER_QUEUE,    /**< scraped waiting requests, min-max normalised and inverted: 1 for
                              the shortest queue, 0 for the longest, 1 for all when equal */
    KVR_SCORER_KV_USAGE, /**< 1 − scraped KV cache usage */
    KVR_SCORER_WEIGHT,   /**< target weight / the largest target weight */
    KVR_SCORER_LMCACHE,  /**< LMCache free capacity (1 − occupancy) from a fresh answer; 0 when
                              it said its cache is unavailable */
} kvr_scorer;

/** "prefix", "session", "load", "queue", "kv_usage", "weight", "lmcache". */
const char *kvr_scorer_name(int s);
/** The scorer named by `name` (`len` bytes), or -1. */
int kvr_scorer_find(const char *name, size_t len);
/** The defaults: prefix 3, session 4, load 2, kv_usage 1, weight 1, the others 0. */
void kvr_scorers_default(double *weights);

/** Parses "NAME=WEIGHT[,NAME=WEIGHT...]" (weights finite, 0..1e6) into `weights` (KVR_NSCORERS
 *  entries). With `replace` every scorer the list does not name gets 0 first (a route's
 *  `scorers` map replaces the defaults entirely); an empty list then means all 0. Returns 0, or
 *  -1 with a message in `err` (cap bytes), `weights` unchanged. */
int kvr_scorers_parse(const char *list, double *weights, int replace, char *err, size_t cap);
/** Writes the non-zero weights as "name=w,name=w" ("none" when all are 0). */
void kvr_scorers_format(const double *weights, char *out, size_t cap);

/** Fills `values[i]` with every scorer's value for eligible worker `el[i]` (n >= 1): `weights`
 *  their target weights (NULL = equal), `ratio[i]` their prefix match ratios, `session_idx` the
 *  index of the session's worker (-1 = none), `now_ms` for LMCache freshness. */
void kvr_scorers_eval(kvr_worker *const *el, size_t n, const double *weights, const double *ratio,
                      int session_idx, uint64_t now_ms, double (*values)[KVR_NSCORERS]);

/** The weighted sum of one worker's values. */
double kvr_scorers_sum(const double *values, const double *weights);

#endif
