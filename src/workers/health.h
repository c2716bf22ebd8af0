/* Active health checks (DESIGN §11): every ctx->health_interval_ms each worker's health path
 * is probed; `unhealthy_threshold` failures in a row make it unhealthy, `healthy_threshold`
 * passes in a row healthy again (it rejoins without a restart of kvroute). What was learned
 * about a worker is dropped only when it really lost its cache: it stayed down longer than
 * `forget_after_ms`, or it restarted (its process_start_time_seconds changed, seen by the
 * scraper, which calls ctx->on_forget itself). */
#ifndef KVR_WORKERS_HEALTH_H
#define KVR_WORKERS_HEALTH_H
#include "workers/ctx.h"

/** Starts the checks (off when ctx->health_interval_ms is 0); the first round runs at once. A
 *  probe times out within min(interval, 5 s). Changes are logged. */
void kvr_health_start(kvr_workers_ctx *ctx);
/** Applies one check result to `w`'s engine (`ok` 1 or 0; every rank of a data-parallel
 *  engine shares it) at monotonic time `now_ms`: thresholds,
 *  down time, and ctx->on_forget once a worker has been down longer than forget_after_ms.
 *  Used by the prober and by tests. */
void kvr_health_apply(kvr_workers_ctx *ctx, kvr_worker *w, int ok, uint64_t now_ms);
/** Marks `w` (its engine: every rank of it) unhealthy now, as `unhealthy_threshold` failed checks would (a request found its
 *  port closed: the engine is gone, and a dead worker with no load would otherwise attract
 *  least-loaded decisions until the next check). It comes back after `healthy_threshold`
 *  passed checks. No-op with health checks off (nothing would bring it back). */
void kvr_health_mark_down(kvr_workers_ctx *ctx, kvr_worker *w, uint64_t now_ms);
/** Stops the timer (closed on the loop; safe to call once). */
void kvr_health_stop(void);

#endif
