/* The policy interface: given the eligible workers and a request's routing keys, pick one
 * worker and say why (the decision label). One file per policy under src/routing/. */
#ifndef KVR_ROUTING_POLICY_H
#define KVR_ROUTING_POLICY_H
#include <stddef.h>
#include <stdint.h>

#include "index/prefix_index.h"
#include "index/session_map.h"
#include "workers/worker.h"

/** Scorers of the pipeline policy (routing/scorers.h names them). */
#define KVR_NSCORERS 7

/** A request's routing keys (DESIGN §5). Both ranges are borrowed for the call. */
typedef struct kvr_route_keys {
    const char *session;   /**< session key bytes, NULL when the request has none */
    size_t session_len;    /**< bytes */
    const char *text;      /**< routing text (what the engine will cache), NULL/0 when none */
    size_t text_len;       /**< bytes */
    kvr_prefix_keys *kept; /**< block keys of `text` kept with the request across its
                                match and teaches (index/prefix_index.h; the text only
                                grows meanwhile); NULL = none */
    int refresh_later;     /**< teach only what the worker does not hold yet: a fuller
                                teach of this text (the reply's) follows and refreshes the
                                rest (kvr_prefix_index_insert_new) */
    const uint32_t *tokens; /**< the prompt's token ids as the engine caches them (precise
                                 policy, proxy/tokenize.h), NULL when unknown */
    size_t ntokens;
    /** Weights of the eligible workers (their route targets' weights), parallel to the
     *  `eligible` array of the same pick/explain call; NULL = all equal. The route fills it on
     *  its own copy of the keys: the weight belongs to the route target, not the worker (one
     *  worker may have other weights in other routes), and the eligible set changes per call
     *  (exclusions on retry), so it travels with the call rather than living in the policy. */
    const double *weights;
} kvr_route_keys;

/** A policy's answer. */
typedef struct kvr_pick {
    kvr_worker *worker;    /**< chosen worker, one of the eligible ones */
    const char *decision;  /**< static label: the policy name for simple policies, else one of
                                session_id_match, prefix_match, low_match_min_load,
                                empty_key_min_load, load_balance (DESIGN §7), kv_match
                                (precise), lmcache_aware, pipeline, min_cost */
    double match;          /**< best prefix match ratio 0..1 over eligible workers, -1 = n/a */
    const char *index;     /**< which index scored the chosen worker: "exact" (KV block index,
                                precise) or "approximate" (prefix index); NULL for policies
                                that match no prefix (x-kvroute-index) */
    double chosen_match;   /**< match ratio of the chosen worker itself (-1 = n/a) */
    int64_t predicted_tokens; /**< exact: prompt tokens predicted cached on the chosen worker;
                                   -1 when only a ratio is known (approximate) */
    uint32_t block_size;   /**< exact: the chosen worker's block size in tokens (0 = n/a) */
    kvr_prefix_use use;    /**< approximate with a match: the use stamps of the chosen worker's
                                matched blocks at the pick, for `correct` (runs 0 = none) */
    double prefill_tokens; /**< cost: prompt tokens predicted uncached on the chosen worker
                                (what its prefill_start/prefill_end account), 0 = n/a */
} kvr_pick;

/** What another kvroute replica taught a worker (the shared routing log, cluster/cluster.h),
 *  applied as if this replica had routed that request itself. All borrowed for the call. */
typedef struct kvr_learned {
    const void *session;       /**< the session key as policies see it in a cluster (its
                                    16-byte digest, proxy/keys.h), NULL = none */
    size_t session_len;        /**< bytes */
    uint64_t age_ms;           /**< how long ago that request was answered (its last use) */
    uint64_t ttl_ms;           /**< the teaching replica's session TTL (0 = unknown): the
                                    binding is dropped when older than it or than our own */
    const uint64_t *keys;      /**< the routing text's block keys (prefix_index.h), in order */
    size_t nkeys;
    size_t block_bytes;        /**< the block size they were cut with (other sizes ignored) */
    int correct;               /**< 1: not a teaching but a correction: the worker lost the
                                    block keys[0] (and, an LRU cache, what it used no later);
                                    its cap drops to what is left, not below keep_blocks */
    size_t keep_blocks;
} kvr_learned;

/** Tunables shared by the policies (flags). */
typedef struct kvr_policy_cfg {
    double cache_threshold;        /**< min match ratio for prefix_match (0.5) */
    double balance_abs_threshold;  /**< overload gate: load - min_load > this (32) */
    double balance_rel_threshold;  /**< ... and load > min_load × this (1.5) */
    uint64_t session_ttl_s;        /**< session map TTL in seconds (3600) */
    size_t max_sessions;           /**< session map capacity (1,000,000) */
    size_t block_bytes;            /**< prefix index block size in bytes (64) */
    size_t max_index_blocks;       /**< global cap on distinct block keys (4,000,000) */
    size_t worker_index_blocks;    /**< per-worker cap, 0 = from KV capacity / global cap */
    double hash_load_factor;       /**< consistent_hash / rendezvous_hash bounded loads: a
                                        worker may hold at most ceil(this × (in-flight over
                                        eligible + 1) × its weight share) (1.25); 0 = unbounded */
    struct kvr_kv_events *kv;      /**< the KV events and KV block index (borrowed from the app;
                                        precise reads it), NULL = none */
    double scorers[KVR_NSCORERS];  /**< pipeline: each scorer's weight (>= 0), indexed by
                                        kvr_scorer (routing/scorers.h); defaults prefix 3,
                                        session 4, load 2, kv_usage 1, weight 1, others 0 */
} kvr_policy_cfg;
void kvr_policy_cfg_default(kvr_policy_cfg *c);

typedef struct kvr_policy kvr_policy;

/** Counters of one policy instance (one route), for kvroute_index_blocks{model},
 *  kvroute_index_evictions_total{model}, kvroute_sessions{model},
 *  kvroute_session_evictions_total{model,reason} (reason: kvr_session_evict_reason_name())
 *  and kvroute_hash_overflows_total{model}.
 *  Zero for policies that learn nothing. */
typedef struct kvr_policy_stats {
    size_t index_blocks;                                      /**< distinct block keys */
    uint64_t index_evictions;                                 /**< holdings evicted by caps */
    size_t sessions;                                          /**< live session entries */
    uint64_t session_evictions[KVR_SESSION_EVICT_NREASONS];   /**< by reason */
    size_t memory_bytes;                                      /**< index + session map */
    uint64_t hash_overflows;   /**< hash policies: picks that passed over the key's owner
                                    because it was at its load bound */
} kvr_policy_stats;

/** What one instance learned about one worker, for GET /workers and /routes. */
typedef struct kvr_policy_worker_stats {
    size_t index_blocks;       /**< blocks the worker is recorded as holding */
    size_t index_capacity;     /**< its cap on them */
    size_t sessions;           /**< sessions bound to it */
} kvr_policy_worker_stats;

/** How a policy sees one eligible worker, for POST /debug/route. */
typedef struct kvr_explain_row {
    kvr_worker *worker;        /**< the eligible worker (borrowed) */
    size_t matched_bytes;      /**< leading routing-text bytes it is recorded as holding */
    double match;              /**< matched_bytes / text bytes; -1 without routing text or
                                    when the policy does not match prefixes */
    int64_t inflight;          /**< its load at decision time */
    int overloaded;            /**< 1 when the overload gate refuses it (hash policies: it is
                                    at its load bound) */
    int session_owner;         /**< 1 when the request's session key is bound to it */
    size_t kv_blocks;          /**< precise: leading blocks of the prompt resident on it per
                                    the KV block index (its trust state aside) */
    const char *trust;         /**< precise: its KV-event trust state ("exact", …), else NULL */
    const char *index;         /**< which index scored it ("exact"/"approximate"), or NULL */
    double weight;             /**< its target weight (filled by the route, not the policy) */
    int scored;                /**< 1: pipeline filled scorers and score; 2: cost filled score
                                    and the prefill figures; 0: none of the fields below */
    double scorers[KVR_NSCORERS]; /**< pipeline: each scorer's value 0..1 (kvr_scorer order) */
    double score;              /**< pipeline: their weighted sum (argmax wins); cost: the
                                    predicted prefill seconds (least wins) */
    double prefill_pending;    /**< cost: prompt tokens sent there whose first byte has not come */
    double prefill_uncached;   /**< cost: this request's prompt tokens it would prefill */
    double seconds_per_token;  /**< cost: its measured prefill seconds per token (or the
                                    fleet's mean, 0 while nothing was measured) */
} kvr_explain_row;

/** Operations of a policy. Only `name`, `create`, `pick` and `destroy` are mandatory. */
typedef struct kvr_policy_ops {
    const char *name;
    /** Creates an instance; `model` names the model it routes (for metric labels). */
    void *(*create)(const kvr_policy_cfg *cfg, const char *model);
    /** Picks among `n` >= 1 eligible workers. Returns 0, or -1 when none can be chosen. Pure
     *  with respect to learned state: picking never teaches (so /debug/route can call it). */
    int (*pick)(void *self, kvr_worker *const *eligible, size_t n, const kvr_route_keys *k,
                kvr_pick *out);
    /** The worker answered 2xx headers for a request with these keys: learn from it. */
    void (*teach)(void *self, kvr_worker *w, const kvr_route_keys *k);
    /** `w` leaves (removed, restarted, cache cleared): forget everything about it now. */
    void (*forget_worker)(void *self, kvr_worker *w);
    void (*destroy)(void *self);
    /** 1 when pick() reads the routing keys; 0 lets the proxy skip building them. */
    int uses_keys;
    /** 1 when pick() reads the routing text only for requests without a session key (the
     *  hash policies hash the session key when there is one, and learn nothing): the proxy
     *  then skips building the text, and reading the body into a tree, for requests that
     *  have one. 0: the text is built whenever uses_keys is set. */
    int text_without_session;
    /** Optional. Runs the decision exactly as pick() does (learning nothing) and fills one
     *  row per eligible worker (`rows`, n entries, caller-allocated) and `out`. Returns 0, or
     *  -1 when n is 0 or memory ran out. Without it the route fills rows with loads only. */
    int (*explain)(void *self, kvr_worker *const *eligible, size_t n, const kvr_route_keys *k,
                   kvr_explain_row *rows, kvr_pick *out);
    /** Optional: counters of the instance (zeros when absent). */
    void (*stats)(void *self, kvr_policy_stats *out);
    /** Optional: what the instance holds for registry id `worker_id` (zeros when absent). */
    void (*worker_stats)(void *self, size_t worker_id, kvr_policy_worker_stats *out);
    /** Optional: drops up to `max` expired entries; returns how many (periodic timer). */
    size_t (*sweep)(void *self, size_t max);
    /** Optional: applies new tunables in place, keeping what was learned. Returns 0, or -1
     *  when they change its structure (e.g. block_bytes): the route then starts afresh.
     *  Absent: the instance keeps its tunables when its route is reloaded unchanged in kind
     *  (policies whose tunables it reads only at create time list no retune, and a reload
     *  with other tunables makes a fresh instance). */
    int (*retune)(void *self, const kvr_policy_cfg *cfg);
    /** Optional: an attempt with keys `k` was just sent to `w` (precise records the prompt's
     *  blocks there as speculative until an event settles them). */
    void (*sent)(void *self, kvr_worker *w, const kvr_route_keys *k);
    /** 1 when pick() reads the prompt's token ids (the proxy then fetches them first); 2 when
     *  it reads them only for workers with KV events (fetched when an eligible worker of the
     *  route has them configured: elsewhere the ids would buy nothing). */
    int uses_tokens;
    /** Optional. The worker `w` of `pick` (scored by the approximate index) answered 2xx and
     *  reported `cached` of its `prompt` tokens cached, off chosen_match × prompt by more than
     *  one block; `k` are the request's keys as routed (the routing text at least; may be
     *  empty when they were not kept). Returns 1 when the instance corrected what it learned
     *  about `w` (the caller then teaches `k` again), 0 when it changed nothing it counts as a
     *  correction (it may still have adjusted an estimate). */
    int (*correct)(void *self, kvr_worker *w, const kvr_route_keys *k, const kvr_pick *pick,
                   int64_t cached, int64_t prompt);
    /** Optional (cost): an attempt was just sent to `w` (after `sent`) whose pick predicted
     *  `tokens` uncached prompt tokens there (kvr_pick.prefill_tokens). Returns the prefill
     *  already outstanding there before it, in tokens, to be handed back to prefill_end. */
    double (*prefill_start)(void *self, kvr_worker *w, double tokens);
    /** Optional (cost): that attempt's prefill is over: its first token came `ms` after it was
     *  sent, or `ms` < 0 when it ended without one or its first byte says nothing about its
     *  prefill (a body that is not streamed arrives whole). Called exactly once per
     *  prefill_start, with its `tokens` and the `ahead` it returned. */
    void (*prefill_end)(void *self, kvr_worker *w, double tokens, double ahead, double ms);
    /** Optional: another replica taught `w` (kvr_learned): bind the session and record the
     *  block keys as teach() would have. Policies that learn nothing leave it NULL. */
    void (*learn)(void *self, kvr_worker *w, const kvr_learned *l);
} kvr_policy_ops;

/** Looks a policy up by name ("round_robin", "random", "least_load", "power_of_two",
 *  "consistent_hash", "rendezvous_hash", "cache_aware", "precise", "lmcache_aware",
 *  "pipeline", "cost"); NULL if unknown. */
const kvr_policy_ops *kvr_policy_find(const char *name);
/** Comma-separated names of all policies, for --help. */
const char *kvr_policy_names(void);

/** Helper for policies: the eligible worker with the fewest in-flight requests, ties broken
 *  uniformly at random (never by list order). `n` >= 1. */
kvr_worker *kvr_policy_least_loaded(kvr_worker *const *eligible, size_t n);
/** As kvr_policy_least_loaded comparing in-flight / weight (`weights` parallel to `eligible`,
 *  NULL = equal), so under load requests settle in proportion to the weights. */
kvr_worker *kvr_policy_least_loaded_w(kvr_worker *const *eligible, const double *weights,
                                      size_t n);
/** Weight of eligible worker `i` for a call with keys `k` (1 when none were given). */
double kvr_policy_weight(const kvr_route_keys *k, size_t i);
/** The keys' weights when they differ, else NULL: with equal weights random, least_load,
 *  power_of_two and rendezvous_hash keep their unweighted arithmetic, so exactly their
 *  unweighted picks (and random draws). */
const double *kvr_policy_weights(const kvr_route_keys *k, size_t n);
/** Index of an eligible worker drawn with probability proportional to its weight (`weights`
 *  NULL = uniform, one kvr_rand_below(n) draw). `n` >= 1. */
size_t kvr_policy_weighted_index(const double *weights, size_t n);

/** Bounded loads (consistent hashing with bounded loads, Mirrokni et al. 2016): a worker may
 *  take one more request while in-flight + 1 <= ceil(factor × (T + 1) × w / W), T the
 *  in-flight over the `n` eligible workers, w its weight and W theirs summed (w / W = 1 / n with
 *  equal weights). Factor >= 1 guarantees some worker is under its bound. */
typedef struct kvr_load_bound {
    double scale;              /**< factor × (T + 1) / W; 0 = unbounded */
} kvr_load_bound;
/** The bound for this eligible set, weights from `k` (kvr_policy_weight); factor 0 =
 *  unbounded. */
kvr_load_bound kvr_load_bound_make(kvr_worker *const *eligible, size_t n, const kvr_route_keys *k,
                                   double factor);
/** 1 when `w` (weight `weight`, kvr_policy_weight of the same keys) is at its bound and must
 *  be passed over. */
int kvr_load_bound_over(const kvr_load_bound *b, const kvr_worker *w, double weight);
/** The /debug/route rows of a bounded-load hash policy: each eligible worker (`n` of them,
 *  `rows` caller-allocated) with its load, no match, and `overloaded` when it is at the bound
 *  that `factor` (--hash-load-factor) sets. */
void kvr_load_bound_rows(kvr_worker *const *eligible, size_t n, const kvr_route_keys *k,
                         double factor, kvr_explain_row *rows);

#endif
