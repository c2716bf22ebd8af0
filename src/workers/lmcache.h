/* LMCache status polling (seed 004): every --lmcache-interval-ms kvroute GETs each worker's
 * configured `lmcache.endpoint` for {"occupancy": 0..1, "cache_available": bool}, which the
 * lmcache_aware policy reads from the worker (kvr_worker_lmcache). Polls go through the shared
 * upstream client, so the egress policy judges every connection they open. */
#ifndef KVR_WORKERS_LMCACHE_H
#define KVR_WORKERS_LMCACHE_H
#include <stddef.h>

#include "workers/ctx.h"

/** An answer older than this many intervals (counted from when its poll was sent) is stale. */
#define KVR_LMCACHE_FRESH_INTERVALS 3
/** A poll gives up after this many intervals. Longer than the freshness window, so a slow
 *  endpoint's late answer still arrives and is counted as stale rather than as an error. */
#define KVR_LMCACHE_DEADLINE_INTERVALS 5

/** Parses an endpoint's answer: a JSON object with a number `occupancy` in [0, 1] and a
 *  boolean `cache_available` (other members ignored). Returns 0 with both set, or -1 when it
 *  is malformed. Pure; used by the poller and its tests. */
int kvr_lmcache_parse(const char *body, size_t len, double *occupancy, int *available);

/** Starts the periodic polls (every ctx->lmcache_interval_ms; one poll per worker at a time).
 *  Each answer sets the worker's lmcache_* fields, kvroute_lmcache_occupancy{worker} and
 *  counts kvroute_lmcache_polls_total{worker,result}: ok, stale (well-formed but older than
 *  the freshness window when it arrived), malformed or error; the last two make the worker
 *  neutral at once. */
void kvr_lmcache_start(kvr_workers_ctx *ctx);
/** Stops the timer; answers still in flight are then dropped. */
void kvr_lmcache_stop(void);

#endif
