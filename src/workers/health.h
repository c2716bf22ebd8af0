/* Active health checks and model discovery. */
#ifndef KVR_WORKERS_HEALTH_H
#define KVR_WORKERS_HEALTH_H
#include "app/app.h"

/** Starts checking every worker's `cfg.health_path` every `cfg.health_interval_ms` (off when
 *  0): a 2xx marks it healthy, anything else (or no answer within the upstream timeouts)
 *  unhealthy, and the change is logged. While no model is known (no --model and no worker
 *  has answered /v1/models yet), each round also asks the workers' /v1/models and adds the
 *  ids found to the served list. The first round runs at once. */
void kvr_health_start(kvr_app *app);
/** Marks `w` unhealthy now (a request could not connect to it), as a failed check would:
 *  logged, ineligible until a health check passes, and forgotten by the policy. Only
 *  meaningful with health checks on (nothing else would bring it back). */
void kvr_health_mark_down(kvr_app *app, kvr_worker *w);
/** Stops the timer (closed on the loop; safe to call once). */
void kvr_health_stop(kvr_app *app);

#endif
