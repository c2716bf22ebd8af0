/* Requests that arrive during the warm start wait for it, briefly (cluster/cluster.h). */
#include <stdlib.h>

#include "cluster/internal.h"

struct kvr_cluster_wait {
    kvr_cluster *c;
    void (*cb)(void *ud);
    void *ud;
    uv_timer_t timer;
    kvr_cluster_wait *prev, *next; /* in c->waiters while waiting */
    int done;
};

static void on_closed(uv_handle_t *h)
{
    free(h->data);
}

static void unlink_waiter(kvr_cluster_wait *w)
{
    kvr_cluster *c = w->c;
    if (w->prev)
        w->prev->next = w->next;
    else if (c->waiters == w)
        c->waiters = w->next;
    if (w->next)
        w->next->prev = w->prev;
    w->prev = w->next = NULL;
}

static void finish(kvr_cluster_wait *w, int call)
{
    if (w->done)
        return;
    w->done = 1;
    unlink_waiter(w);
    uv_timer_stop(&w->timer);
    uv_close((uv_handle_t *)&w->timer, on_closed);
    if (call)
        w->cb(w->ud);
}

/* The hold is over (the warm start ended, --redis-warm-hold-ms passed, or Redis failed while
 * warming): the callback runs from this timer, never from inside a Redis reply. */
static void on_timer(uv_timer_t *t)
{
    finish(t->data, 1);
}

int kvr_cluster_holding(const kvr_cluster *c)
{
    return c && c->holding && !c->warm && c->cfg.warm_hold_ms > 0;
}

kvr_cluster_wait *kvr_cluster_wait_warm(kvr_cluster *c, void (*cb)(void *ud), void *ud)
{
    kvr_cluster_wait *w = calloc(1, sizeof(*w));
    if (!w)
        return NULL;
    w->c = c;
    w->cb = cb;
    w->ud = ud;
    uv_timer_init(c->loop, &w->timer);
    w->timer.data = w;
    w->next = c->waiters;
    if (c->waiters)
        c->waiters->prev = w;
    c->waiters = w;
    uv_timer_start(&w->timer, on_timer, kvr_cluster_holding(c) ? c->cfg.warm_hold_ms : 0, 0);
    return w;
}

void kvr_cluster_wait_cancel(kvr_cluster_wait *w)
{
    if (w)
        finish(w, 0);
}

void kvr_hold_release(kvr_cluster *c)
{
    c->holding = 0;
    for (kvr_cluster_wait *w = c->waiters; w; w = w->next)
        uv_timer_start(&w->timer, on_timer, 0, 0);
}
