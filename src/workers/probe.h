/* A GET to one worker's path whose answer comes back with the worker (health checks, model
 * discovery, metric scraping). The worker is looked up again by id when the answer arrives,
 * so a probe never holds a pointer across loop iterations. */
#ifndef KVR_WORKERS_PROBE_H
#define KVR_WORKERS_PROBE_H
#include "workers/ctx.h"

/** Result: `w` is the probed worker (NULL if it is no longer registered); `status` is 0 when
 *  no response came (then `err` says why); `body` holds at most the probe's cap of bytes,
 *  valid during the call only. */
typedef void (*kvr_probe_cb)(kvr_workers_ctx *ctx, kvr_worker *w, int status, const char *body,
                             size_t len, kvr_upstream_err err);

/** GETs `path` on `w`, keeping `max_bytes` of the body, giving up after `timeout_ms`.
 *  Returns 0, or -1 when it could not start (then `cb` never runs). */
int kvr_probe_worker(kvr_workers_ctx *ctx, kvr_worker *w, const char *path, size_t max_bytes,
                     uint64_t timeout_ms, kvr_probe_cb cb);

#endif
