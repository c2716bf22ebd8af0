/* A repeating loop timer that can be stopped once from anywhere (health checks, scraping,
 * discovery each own one). */
#ifndef KVR_WORKERS_PERIODIC_H
#define KVR_WORKERS_PERIODIC_H
#include <stdint.h>
#include <uv.h>

typedef struct kvr_periodic {
    uv_timer_t timer;   /**< timer.data is the `data` given to start */
    int running;
} kvr_periodic;

/** Starts `cb` after `first_ms`, then every `every_ms` (> 0). No-op when already running. */
void kvr_periodic_start(kvr_periodic *p, uv_loop_t *loop, uv_timer_cb cb, void *data,
                        uint64_t first_ms, uint64_t every_ms);
/** Stops the timer and closes its handle (the struct must live until the loop ends). Safe to
 *  call when not running. */
void kvr_periodic_stop(kvr_periodic *p);

#endif
