/* What the worker-side background tasks (health checks, metric scraping, model discovery,
 * LMCache status polls) need from the daemon: the loop, the upstream client, the registry,
 * their settings, the metrics they set, and callbacks for what only the routing side can do.
 * Owned by the caller (the app), which keeps it alive until the tasks are stopped. */
#ifndef KVR_WORKERS_CTX_H
#define KVR_WORKERS_CTX_H
#include <stdint.h>
#include <uv.h>

#include "obs/metrics.h"
#include "upstream/upstream.h"
#include "workers/registry.h"

typedef struct kvr_workers_ctx {
    uv_loop_t *loop;
    kvr_upstream *up;
    kvr_registry *reg;
    uint64_t health_interval_ms;   /**< active checks (0 = off) */
    uint32_t unhealthy_threshold;  /**< failed checks in a row → unhealthy */
    uint32_t healthy_threshold;    /**< passed checks in a row → healthy */
    uint64_t forget_after_ms;      /**< down this long → on_forget */
    const char *health_path;       /**< e.g. "/health" (borrowed) */
    uint64_t scrape_interval_s;    /**< /metrics reads (0 = off) */
    uint64_t discovery_interval_s; /**< /v1/models reads when `discover` is set */
    int discover;                  /**< 1: read every worker's /v1/models (routes from them) */
    uint64_t lmcache_interval_ms;  /**< LMCache status polls of workers with an endpoint */
    kvr_metric *queue;             /**< kvroute_worker_queue{worker} */
    kvr_metric *kv_usage;          /**< kvroute_worker_kv_usage{worker} */
    kvr_metric *lmcache_occupancy; /**< kvroute_lmcache_occupancy{worker} */
    kvr_metric *lmcache_polls;     /**< kvroute_lmcache_polls_total{worker,result} */
    /** A worker lost its cache (down longer than forget_after_ms, or restarted): forget what
     *  was learned about it. */
    void (*on_forget)(void *ud, kvr_worker *w);
    /** A worker's /v1/models list changed (kvr_worker_set_models returned 1). */
    void (*on_models)(void *ud, kvr_worker *w);
    /** A worker's engine failed enough health checks to turn unhealthy (not after a failed
     *  connect, which ends its attempts by itself). May be NULL. Runs inside the health
     *  check's own callback: whatever it does to other attempts must wait a loop turn. */
    void (*on_down)(void *ud, kvr_worker *engine);
    void *ud;
} kvr_workers_ctx;

#endif
