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
/** Stops the timer (closed on the loop; safe to call once). */
void kvr_health_stop(kvr_app *app);

#endif
