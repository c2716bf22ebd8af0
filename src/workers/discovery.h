/* Model discovery: without a config file's routes and without --model, every model a worker
 * lists in its /v1/models becomes a route over exactly the workers that list it (DESIGN §3a).
 * This module keeps each worker's list fresh; the app rebuilds the routes when one changes. */
#ifndef KVR_WORKERS_DISCOVERY_H
#define KVR_WORKERS_DISCOVERY_H
#include "workers/ctx.h"

/** Reads every worker's /v1/models at once, then every ctx->discovery_interval_s seconds; a
 *  worker that has not answered yet is asked again every second. An answer that differs from
 *  the worker's last list replaces it (kvr_worker_set_models) and calls ctx->on_models; a
 *  worker that cannot be reached, or answers anything but a 200 with a `data` list, keeps its
 *  last list. No-op unless ctx->discover. */
void kvr_discovery_start(kvr_workers_ctx *ctx);
/** Reads `w`'s /v1/models now (a worker just discovered), as the timer would; no-op unless
 *  ctx->discover. */
void kvr_discovery_probe(kvr_workers_ctx *ctx, kvr_worker *w);
/** Stops the timer (safe to call once). */
void kvr_discovery_stop(void);

/** Parses a /v1/models body (OpenAI's list shape) into `ids` (at most `cap` pointers into a
 *  jansson value stored in `*owner`; json_decref it after use). Returns the count, or -1 when
 *  the body is not such a list. Pure; used by the prober and its tests. */
int kvr_discovery_parse(const char *body, size_t len, const char **ids, size_t cap,
                        void **owner);

#endif
