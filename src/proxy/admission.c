/* Fair admission queue (see admission.h). */
#include "proxy/admission.h"

#include <stdlib.h>
#include <string.h>

typedef struct lane {
    const char *key;
    kvr_waiter *head, *tail;
} lane;

struct kvr_admission {
    lane *lanes;        /* one per key seen; an empty lane is reused */
    size_t nlanes, cap;
    size_t depth, max;
    size_t turn;        /* the lane served first in the next round */
};

kvr_admission *kvr_admission_new(size_t max)
{
    kvr_admission *q = calloc(1, sizeof(*q));
    if (!q)
        abort();
    q->max = max;
    return q;
}

void kvr_admission_free(kvr_admission *q)
{
    if (!q)
        return;
    free(q->lanes);
    free(q);
}

void kvr_admission_set_max(kvr_admission *q, size_t max)
{
    q->max = max;
}

size_t kvr_admission_depth(const kvr_admission *q)
{
    return q->depth;
}

static size_t lane_for(kvr_admission *q, const char *key)
{
    size_t free_lane = q->nlanes;
    for (size_t i = 0; i < q->nlanes; i++) {
        if (q->lanes[i].head && strcmp(q->lanes[i].key, key) == 0)
            return i;
        if (!q->lanes[i].head && free_lane == q->nlanes)
            free_lane = i;
    }
    if (free_lane == q->nlanes) {
        if (q->nlanes == q->cap) {
            size_t nc = q->cap ? q->cap * 2 : 8;
            lane *l = realloc(q->lanes, nc * sizeof(*l));
            if (!l)
                abort();
            q->lanes = l;
            q->cap = nc;
        }
        q->nlanes++;
    }
    q->lanes[free_lane] = (lane){key, NULL, NULL};
    return free_lane;
}

int kvr_admission_push(kvr_admission *q, kvr_waiter *w)
{
    if (q->depth >= q->max)
        return -1;
    size_t i = lane_for(q, w->key);
    lane *l = &q->lanes[i];
    w->next = NULL;
    w->lane = i;
    w->queued = 1;
    if (l->tail)
        l->tail->next = w;
    else
        l->head = w;
    l->tail = w;
    q->depth++;
    return 0;
}

void kvr_admission_remove(kvr_admission *q, kvr_waiter *w)
{
    if (!w->queued)
        return;
    lane *l = &q->lanes[w->lane];
    kvr_waiter *prev = NULL;
    for (kvr_waiter *it = l->head; it; prev = it, it = it->next) {
        if (it != w)
            continue;
        if (prev)
            prev->next = w->next;
        else
            l->head = w->next;
        if (l->tail == w)
            l->tail = prev;
        break;
    }
    w->queued = 0;
    w->next = NULL;
    q->depth--;
}

size_t kvr_admission_dispatch(kvr_admission *q, int (*try_start)(void *ud, kvr_waiter *w),
                              void *ud)
{
    size_t started = 0, progress = 1;
    while (progress && q->depth) {
        progress = 0;
        size_t n = q->nlanes, first = q->turn;
        for (size_t k = 0; k < n && q->depth; k++) {
            size_t i = (first + k) % n;
            kvr_waiter *w = q->lanes[i].head;
            if (!w)
                continue;
            kvr_admission_remove(q, w);
            if (try_start(ud, w)) {
                started++;
                progress = 1;
                q->turn = (i + 1) % n; /* the next round starts after the key just served */
                continue;
            }
            /* Not now: back at the head of its key's lane. */
            lane *l = &q->lanes[i];
            w->next = l->head;
            w->queued = 1;
            w->lane = i;
            l->head = w;
            if (!l->tail)
                l->tail = w;
            q->depth++;
        }
    }
    return started;
}

kvr_waiter *kvr_admission_oldest(const kvr_admission *q)
{
    kvr_waiter *best = NULL;
    for (size_t i = 0; i < q->nlanes; i++) {
        kvr_waiter *w = q->lanes[i].head;
        if (w && (!best || w->since_ms < best->since_ms))
            best = w;
    }
    return best;
}
