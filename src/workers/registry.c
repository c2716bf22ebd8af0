/* The worker registry. */
#include "workers/registry.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kvr_registry {
    kvr_worker **w;
    size_t n, cap;
};

kvr_registry *kvr_registry_new(void)
{
    kvr_registry *r = calloc(1, sizeof(*r));
    if (!r)
        abort();
    return r;
}

void kvr_registry_free(kvr_registry *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->n; i++) {
        free(r->w[i]->url);
        free(r->w[i]);
    }
    free(r->w);
    free(r);
}

kvr_worker *kvr_registry_add(kvr_registry *r, const char *url)
{
    if (strncmp(url, "http://", 7) != 0 || strlen(url) <= 7)
        return NULL;
    for (size_t i = 0; i < r->n; i++)
        if (strcmp(r->w[i]->url, url) == 0)
            return NULL;
    if (r->n == r->cap) {
        size_t nc = r->cap ? r->cap * 2 : 8;
        kvr_worker **nw = realloc(r->w, nc * sizeof(*nw));
        if (!nw)
            abort();
        r->w = nw;
        r->cap = nc;
    }
    kvr_worker *w = calloc(1, sizeof(*w));
    if (!w || !(w->url = strdup(url)))
        abort();
    w->id = r->n;
    w->healthy = 1;
    w->queue = w->running = w->kv_usage = -1;
    w->kv_tokens = -1;
    r->w[r->n++] = w;
    return w;
}

size_t kvr_registry_count(const kvr_registry *r)
{
    return r->n;
}

kvr_worker *kvr_registry_at(const kvr_registry *r, size_t i)
{
    return i < r->n ? r->w[i] : NULL;
}

size_t kvr_registry_eligible(const kvr_registry *r, kvr_worker **out)
{
    size_t k = 0;
    for (size_t i = 0; i < r->n; i++)
        if (kvr_worker_eligible(r->w[i]))
            out[k++] = r->w[i];
    return k;
}

void kvr_worker_acquire(kvr_worker *w)
{
    w->inflight++;
    w->requests++;
}

void kvr_worker_release(kvr_worker *w)
{
    assert(w->inflight > 0);
    w->inflight--;
}

int kvr_worker_url(const kvr_worker *w, const char *path, char *out, size_t cap)
{
    size_t bl = strlen(w->url);
    while (bl > 7 && w->url[bl - 1] == '/')
        bl--;
    int n = snprintf(out, cap, "%.*s%s", (int)bl, w->url, path);
    return (n < 0 || (size_t)n >= cap) ? -1 : 0;
}
