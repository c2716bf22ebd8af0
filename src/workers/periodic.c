/* Repeating loop timers (see periodic.h). */
#include "workers/periodic.h"

void kvr_periodic_start(kvr_periodic *p, uv_loop_t *loop, uv_timer_cb cb, void *data,
                        uint64_t first_ms, uint64_t every_ms)
{
    if (p->running)
        return;
    uv_timer_init(loop, &p->timer);
    p->timer.data = data;
    uv_timer_start(&p->timer, cb, first_ms, every_ms);
    p->running = 1;
}

void kvr_periodic_stop(kvr_periodic *p)
{
    if (!p->running)
        return;
    p->running = 0;
    uv_timer_stop(&p->timer);
    uv_close((uv_handle_t *)&p->timer, NULL);
}
