/* Active health checks. */
#ifndef KVR_WORKERS_HEALTH_H
#define KVR_WORKERS_HEALTH_H
#include "workers/ctx.h"

/** Starts checking every worker's `ctx->health_path` every `ctx->health_interval_ms` (off
 *  when 0): a 2xx marks it healthy, anything else (or no answer within min(interval, 5 s))
 *  unhealthy, and the change is logged. The first round runs at once. */
void kvr_health_start(kvr_workers_ctx *ctx);
/** Marks `w` unhealthy now (a failed check, or a request could not connect to it): logged,
 *  ineligible until a health check passes, and ctx->on_down is called. Only meaningful with
 *  health checks on (nothing else would bring it back). */
void kvr_health_mark_down(kvr_workers_ctx *ctx, kvr_worker *w);
/** Stops the timer (closed on the loop; safe to call once). */
void kvr_health_stop(void);

#endif
