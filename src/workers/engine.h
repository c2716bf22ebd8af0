/* Data-parallel engines (issue 21): one engine process (vLLM --data-parallel-size N) serves N
 * ranks behind one URL. Each rank is a registry worker of its own ("URL#r": own load, prefix
 * index entries, sessions, KV-event state), but what belongs to the process is done once per
 * engine, by rank 0 (kvr_worker.engine): the health check, the circuit breaker, the /metrics
 * scrape and the /v1/models read. These helpers spread an engine-wide result over its ranks.
 * A plain worker is an engine of one rank, so callers need no special case. */
#ifndef KVR_WORKERS_ENGINE_H
#define KVR_WORKERS_ENGINE_H
#include <stddef.h>

#include "workers/ctx.h"

/** Most ranks an engine has (KVR_MAX_DP_SIZE, repeated here so workers/ needs no config). */
#define KVR_ENGINE_MAX_RANKS 256

/** The workers of `engine` (itself first, then its other ranks in registration order) into
 *  `out` (room for KVR_ENGINE_MAX_RANKS). Returns how many (at least 1). */
size_t kvr_engine_ranks(const kvr_workers_ctx *ctx, kvr_worker *engine, kvr_worker **out);

/** `engine` lost its cache (down too long, restarted): ctx->on_forget for each of its ranks. */
void kvr_engine_forget(kvr_workers_ctx *ctx, kvr_worker *engine);

#endif
