/* One watched Service's slices → the owner's workers (k8s_sync.h). */
#include "workers/k8s_sync.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"

static kvr_k8s_tracked *find_tracked(kvr_k8s_sync *s, const char *url)
{
    for (size_t i = 0; i < s->ncur; i++)
        if (strcmp(s->cur[i].url, url) == 0)
            return &s->cur[i];
    return NULL;
}

enum { ST_NONE, ST_NOTREADY, ST_DRAIN, ST_READY };

static int ep_state(const kvr_k8s_endpoint *e)
{
    if (e->ready && !e->terminating)
        return ST_READY;
    if (e->serving && e->terminating)
        return ST_DRAIN;
    return ST_NOTREADY;
}

/* The best state of `url` over every slice, and the endpoint that has it. */
static int desired(const kvr_k8s_sync *s, const char *url, const kvr_k8s_endpoint **best)
{
    int st = ST_NONE;
    for (size_t k = 0; k < s->nslices; k++)
        for (size_t i = 0; i < s->slices[k].neps; i++) {
            const kvr_k8s_endpoint *e = &s->slices[k].eps[i];
            if (strcmp(e->url, url) != 0)
                continue;
            int x = ep_state(e);
            if (x > st) {
                st = x;
                *best = e;
            }
        }
    return st;
}

void kvr_k8s_sync_apply(kvr_k8s_sync *s, const kvr_k8s_hooks *h)
{
    for (size_t i = 0; i < s->ncur; i++)
        s->cur[i].seen = 0;
    /* New and changed endpoints. */
    for (size_t k = 0; k < s->nslices; k++)
        for (size_t i = 0; i < s->slices[k].neps; i++) {
            const kvr_k8s_endpoint *e = &s->slices[k].eps[i], *best = e;
            kvr_k8s_tracked *t = find_tracked(s, e->url);
            if (t && t->seen)
                continue;
            int st = desired(s, e->url, &best);
            if (!t) {
                if (st != ST_READY)
                    continue; /* never seen ready: not a worker yet */
                kvr_k8s_tracked *nc = realloc(s->cur, (s->ncur + 1) * sizeof(*nc));
                if (!nc)
                    continue;
                s->cur = nc;
                t = &s->cur[s->ncur++];
                memset(t, 0, sizeof(*t));
                snprintf(t->url, sizeof(t->url), "%s", e->url);
                t->added = h->add(h->ud, s->service, best->name[0] ? best->name : best->url,
                                  best->url, best->kv_url[0] ? best->kv_url : NULL,
                                  best->kv_replay_url[0] ? best->kv_replay_url : NULL) == 0;
                if (!t->added)
                    KVR_WARN("msg=\"kubernetes endpoint not added\" service=%s worker=%s",
                             s->service, e->url);
            } else if (t->added) {
                int d = st != ST_READY;
                if (d != t->draining) {
                    t->draining = d;
                    KVR_INFO("msg=\"kubernetes endpoint %s\" service=%s worker=%s",
                             d ? "draining" : "ready again", s->service, t->url);
                    h->set_draining(h->ud, t->url, d);
                }
            }
            t->seen = 1;
        }
    /* Gone from every slice. */
    size_t keep = 0;
    for (size_t i = 0; i < s->ncur; i++) {
        kvr_k8s_tracked *t = &s->cur[i];
        if (!t->seen) {
            if (t->added) {
                KVR_INFO("msg=\"kubernetes endpoint gone\" service=%s worker=%s", s->service,
                         t->url);
                h->remove(h->ud, t->url);
            }
            continue;
        }
        s->cur[keep++] = *t;
    }
    s->ncur = keep;
}

static void free_slices(kvr_k8s_sync *s)
{
    for (size_t i = 0; i < s->nslices; i++)
        kvr_k8s_slice_free(&s->slices[i]);
    free(s->slices);
    s->slices = NULL;
    s->nslices = 0;
}

void kvr_k8s_sync_replace(kvr_k8s_sync *s, kvr_k8s_slice *slices, size_t n)
{
    free_slices(s);
    s->slices = slices;
    s->nslices = n;
}

void kvr_k8s_sync_event(kvr_k8s_sync *s, kvr_k8s_slice *slice, int del)
{
    for (size_t i = 0; i < s->nslices; i++) {
        if (strcmp(s->slices[i].name, slice->name) != 0)
            continue;
        kvr_k8s_slice_free(&s->slices[i]);
        if (del) {
            s->slices[i] = s->slices[--s->nslices];
            kvr_k8s_slice_free(slice);
        } else {
            s->slices[i] = *slice;
        }
        return;
    }
    if (del) {
        kvr_k8s_slice_free(slice);
        return;
    }
    kvr_k8s_slice *ns = realloc(s->slices, (s->nslices + 1) * sizeof(*ns));
    if (!ns) {
        kvr_k8s_slice_free(slice);
        return;
    }
    s->slices = ns;
    s->slices[s->nslices++] = *slice;
}

size_t kvr_k8s_sync_added(const kvr_k8s_sync *s)
{
    size_t n = 0;
    for (size_t i = 0; i < s->ncur; i++)
        n += s->cur[i].added;
    return n;
}

void kvr_k8s_sync_free(kvr_k8s_sync *s)
{
    free_slices(s);
    free(s->cur);
    s->cur = NULL;
    s->ncur = 0;
}
