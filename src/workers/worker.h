/* A worker: one inference engine replica (vLLM / SGLang / kvroute-sim) behind the router. */
#ifndef KVR_WORKERS_WORKER_H
#define KVR_WORKERS_WORKER_H
#include <stddef.h>
#include <stdint.h>

#include "workers/breaker.h"

/** A worker's part in prefill/decode disaggregation: a route with prefill workers among its
 *  targets is disaggregated (routing/route.h, proxy/pd.h). */
typedef enum kvr_worker_role {
    KVR_ROLE_BOTH = 0, /**< prefills and decodes (every worker until roles are configured) */
    KVR_ROLE_PREFILL,  /**< prefill only */
    KVR_ROLE_DECODE,   /**< decode only */
} kvr_worker_role;

/** State of one worker, owned by the registry (src/workers/registry.h). Policies read it. */
typedef struct kvr_worker {
    char *url;              /**< base URL exactly as configured ("http://127.0.0.1:9001"); the
                                 `worker` metric label, x-kvroute-worker and hash-ring key.
                                 A data-parallel rank's is "URL#r" (DESIGN §10): never
                                 connect to it, kvr_worker_base() is the address */
    char *base_url;         /**< a data-parallel rank's engine URL (owned, without "#r"): what
                                 every request, probe and scrape connects to; NULL for a plain
                                 worker (its url is its address) */
    int dp_rank;            /**< its data-parallel rank r (vLLM's X-data-parallel-rank), -1 for
                                 a plain worker */
    int dp_size;            /**< the engine's data_parallel_size (0 for a plain worker) */
    struct kvr_worker *engine; /**< whose health, circuit breaker and scrapes this worker's
                                    are: itself for a plain worker and rank 0, rank 0 for the
                                    other ranks (referenced by them; kvr_registry_add_rank).
                                    Never NULL */
    char *name;             /**< its name in the config (defaults to the URL); routes' targets
                                 and the admin paths name it */
    double weight;          /**< configured weight (1): the default weight of its targets */
    kvr_worker_role role;   /**< KVR_ROLE_BOTH unless configured (`role`, --prefill,
                                 --decode) or added with another (POST /workers) */
    uint16_t bootstrap_port; /**< SGLang disaggregation bootstrap port of a prefill worker
                                  (`bootstrap_port`; 8998, SGLang's default, unless set) */
    char *api_key;          /**< the worker's own API key (owned; NULL = none), sent as
                                 `Authorization: Bearer` on every request kvroute makes to it;
                                 never logged or shown */
    uint32_t max_inflight;  /**< most attempts in flight here (0 = no limit) */
    size_t id;              /**< unique for the process's life (never reused after removal):
                                 the index of per-worker state in routes and indexes */
    int refs;               /**< the registry's reference + one per route targeting it
                                 (kvr_worker_ref/unref); freed at 0 */
    int removed;            /**< 1 once a reload dropped it: never eligible again; it lives
                                 only until its requests end */
    char **models;          /**< model ids its /v1/models listed last (owned), for routes
                                 discovered without a config; NULL until it answered */
    size_t nmodels;
    int64_t inflight;       /**< upstream attempts in progress (DESIGN §4 step 6: changed only
                                 by kvr_worker_acquire/release) */
    int64_t remote_inflight; /**< the other kvroute replicas' attempts in flight here, as
                                  they last published them (cluster/cluster.h; 0 without
                                  Redis): added to `inflight` by every load decision */
    int64_t prefilling;     /**< attempts whose 2xx headers taught the prefix index but whose
                                 first body byte has not come (the proxy's): what they taught
                                 may not be cached there yet */
    int healthy;            /**< 1 while its last health check passed (starts at 1) */
    int draining;           /**< 1 when drained (POST /workers/NAME/drain): no new requests,
                                 in-flight ones finish, learned state kept */
    double queue;           /**< scraped vllm:num_requests_waiting, -1 when unknown */
    double running;         /**< scraped vllm:num_requests_running, -1 when unknown */
    double kv_usage;        /**< scraped vllm:kv_cache_usage_perc (0..1), -1 when unknown */
    int64_t kv_tokens;      /**< KV capacity in tokens (num_gpu_blocks × block_size from
                                 vllm:cache_config_info), -1 when unknown */
    uint32_t kv_block_size; /**< tokens per KV block (vllm:cache_config_info's block_size),
                                 0 when unknown; cross-checks the KV events' block_size */
    uint64_t requests;      /**< attempts started on it, for /workers */
    kvr_breaker breaker;    /**< passive health: results of the requests it served */
    uint32_t check_fails;   /**< failed health checks in a row */
    uint32_t check_passes;  /**< passed health checks in a row */
    uint64_t down_since_ms; /**< monotonic ms when it last went unhealthy (0 while healthy) */
    int forgotten;          /**< its learned state was dropped during this outage */
    double start_time;      /**< scraped process_start_time_seconds, -1 when unknown: a change
                                 means the engine restarted with an empty KV cache */
    char *lmcache_endpoint; /**< owned: the URL polled for {"occupancy", "cache_available"}
                                 (src/workers/lmcache.h); NULL = none */
    double lmcache_occupancy; /**< its last well-formed answer's occupancy 0..1; -1 = none,
                                   or the last poll failed or was malformed */
    int lmcache_available;  /**< that answer's cache_available */
    uint64_t lmcache_ok_ms; /**< monotonic ms when the poll that brought it was sent (0 = none) */
    uint64_t lmcache_fresh_until_ms; /**< lmcache_ok_ms + 3 polling intervals: from then on
                                          the answer is stale and the worker neutral */
    uint32_t lmcache_gen;   /**< +1 per endpoint change: an answer to an older poll is dropped */
    int lmcache_polling;    /**< a poll of the current endpoint is in flight */
} kvr_worker;

/** The URL requests to `w` go to: a data-parallel rank's engine URL, else its own. */
static inline const char *kvr_worker_base(const kvr_worker *w)
{
    return w->base_url ? w->base_url : w->url;
}

/** 1 while `w`'s engine passes its health checks: the ranks of a data-parallel engine share
 *  one check (one process answers /health for all of them). */
static inline int kvr_worker_healthy(const kvr_worker *w)
{
    return w->engine->healthy;
}

/** The circuit breaker that judges `w`: its engine's, so a failure on any rank of a
 *  data-parallel engine counts for the whole engine (they share a process and a port). */
static inline kvr_breaker *kvr_worker_breaker(const kvr_worker *w)
{
    return &w->engine->breaker;
}

/** Healthy, not draining, still configured: eligible but for its circuit breaker. */
static inline int kvr_worker_serving(const kvr_worker *w)
{
    return kvr_worker_healthy(w) && !w->draining && !w->removed;
}

/** Eligible = may receive new requests: healthy, circuit breaker not open (a half-open one
 *  admits its single trial), not draining, still configured (DESIGN §4 step 4, §11). */
static inline int kvr_worker_eligible(const kvr_worker *w)
{
    return kvr_worker_serving(w) && kvr_breaker_admits(kvr_worker_breaker(w));
}

/** 1 when `w` is not eligible only because its breaker's one half-open trial is running: it
 *  is again once that trial's answer starts well (a request may wait for it in the queue). */
static inline int kvr_worker_on_trial(const kvr_worker *w)
{
    const kvr_breaker *b = kvr_worker_breaker(w);
    return kvr_worker_serving(w) && b->state == KVR_BREAKER_HALF_OPEN && b->trial_inflight;
}

/** The load every routing decision reads: this replica's attempts in flight at `w` plus the
 *  other replicas' (remote_inflight; DESIGN §13). */
static inline int64_t kvr_worker_load(const kvr_worker *w)
{
    return w->inflight + w->remote_inflight;
}

/** What lmcache_aware knows of a worker's cache at `now_ms` (monotonic). */
typedef enum kvr_lmcache_state {
    KVR_LMCACHE_NEUTRAL,     /**< no endpoint, or its answer failed, was malformed or is stale */
    KVR_LMCACHE_AVAILABLE,   /**< a fresh answer with cache_available true */
    KVR_LMCACHE_UNAVAILABLE, /**< a fresh answer with cache_available false */
} kvr_lmcache_state;

static inline kvr_lmcache_state kvr_worker_lmcache(const kvr_worker *w, uint64_t now_ms)
{
    if (w->lmcache_occupancy < 0 || now_ms >= w->lmcache_fresh_until_ms)
        return KVR_LMCACHE_NEUTRAL;
    return w->lmcache_available ? KVR_LMCACHE_AVAILABLE : KVR_LMCACHE_UNAVAILABLE;
}

#endif
