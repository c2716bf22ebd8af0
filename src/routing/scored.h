/* What the pipeline and cost policies share: each owns a precise instance (cache_aware's
 * session map and prefix index, plus the KV block index for workers whose KV events are
 * exact) that learns exactly as it would on its own route, scores workers with it
 * (kvr_cache_aware_scores), and hands it everything there is to learn. A policy state built on
 * it begins with a kvr_scored, so the delegating ops below take that state as `self`. */
#ifndef KVR_ROUTING_SCORED_H
#define KVR_ROUTING_SCORED_H
#include <stddef.h>

#include "routing/policy.h"
#include "routing/policy_cache_aware.h"

typedef struct kvr_scored {
    void *ca;                    /**< the embedded precise instance (owned) */
    kvr_policy_cfg cfg;          /**< the route's tunables (scorer weights included) */
    kvr_cache_aware_score *sc;   /**< per-pick scratch: each eligible worker's score */
    size_t cap;                  /**< its entries */
} kvr_scored;

/** Creates the embedded instance. Returns 0, or -1 (then kvr_scored_fini is still safe). */
int kvr_scored_init(kvr_scored *b, const kvr_policy_cfg *cfg, const char *model);
void kvr_scored_fini(kvr_scored *b);

/** Scores the eligible workers into b->sc (learning nothing); `*session_idx` as
 *  kvr_cache_aware_scores. Returns 0, or -1 when n is 0 or memory ran out. */
int kvr_scored_score(kvr_scored *b, kvr_worker *const *el, size_t n, const kvr_route_keys *k,
                     int *session_idx);
/** The decision's match (best ratio, -1 without routing text or an exact worker) and, for the
 *  chosen eligible worker `i`, worker/index/chosen_match/predicted_tokens/block_size. */
void kvr_scored_chose(const kvr_scored *b, kvr_worker *const *el, size_t n, size_t i,
                      const kvr_route_keys *k, kvr_pick *out);
/** Prompt tokens of the request (the token ids when fetched, else routing text bytes / 4) and
 *  those predicted cached on eligible worker `i` (resident blocks where exact, else its match
 *  ratio of the prompt). */
double kvr_scored_prompt_tokens(const kvr_route_keys *k);
double kvr_scored_matched_tokens(const kvr_scored *b, size_t i, const kvr_route_keys *k);
/** The /debug/route row of eligible worker `i` as cache_aware describes it. */
void kvr_scored_row(const kvr_scored *b, kvr_worker *const *el, size_t i, int session_idx,
                    const kvr_route_keys *k, kvr_explain_row *row);

/* Delegating ops (self = a state that begins with a kvr_scored). */
void kvr_scored_teach(void *self, kvr_worker *w, const kvr_route_keys *k);
void kvr_scored_forget(void *self, kvr_worker *w);
void kvr_scored_learn(void *self, kvr_worker *w, const kvr_learned *l);
void kvr_scored_stats(void *self, kvr_policy_stats *out);
void kvr_scored_worker_stats(void *self, size_t worker_id, kvr_policy_worker_stats *out);
size_t kvr_scored_sweep(void *self, size_t max);
void kvr_scored_sent(void *self, kvr_worker *w, const kvr_route_keys *k);
/** Retunes the embedded instance and takes the new tunables; -1 as its retune. */
int kvr_scored_retune(void *self, const kvr_policy_cfg *cfg);

#endif
