/* The worker registry. */
#include "workers/registry.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kvr_registry {
    kvr_worker **w;       /* registered, in registration order */
    size_t n, cap;
    size_t next_id;
};

kvr_registry *kvr_registry_new(void)
{
    kvr_registry *r = calloc(1, sizeof(*r));
    if (!r)
        abort();
    return r;
}

static void free_models(kvr_worker *w)
{
    for (size_t i = 0; i < w->nmodels; i++)
        free(w->models[i]);
    free(w->models);
    w->models = NULL;
    w->nmodels = 0;
}

void kvr_worker_ref(kvr_worker *w)
{
    w->refs++;
}

void kvr_worker_unref(kvr_worker *w)
{
    if (!w || --w->refs > 0)
        return;
    free_models(w);
    kvr_worker_set_api_key(w, NULL);
    free(w->lmcache_endpoint);
    if (w->engine != w)
        kvr_worker_unref(w->engine);
    free(w->base_url);
    free(w->url);
    free(w->name);
    free(w);
}

void kvr_registry_free(kvr_registry *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->n; i++)
        kvr_worker_unref(r->w[i]);
    free(r->w);
    free(r);
}

static void append(kvr_registry *r, kvr_worker *w)
{
    if (r->n == r->cap) {
        size_t nc = r->cap ? r->cap * 2 : 8;
        kvr_worker **nw = realloc(r->w, nc * sizeof(*nw));
        if (!nw)
            abort();
        r->w = nw;
        r->cap = nc;
    }
    r->w[r->n++] = w;
}

kvr_worker *kvr_registry_add(kvr_registry *r, const char *url, const char *name, double weight)
{
    if (strncmp(url, "http://", 7) != 0 || strlen(url) <= 7)
        return NULL;
    if (!name)
        name = url;
    if (kvr_registry_find_url(r, url) || kvr_registry_find_name(r, name))
        return NULL;
    kvr_worker *w = calloc(1, sizeof(*w));
    if (!w || !(w->url = strdup(url)) || !(w->name = strdup(name)))
        abort();
    w->id = r->next_id++;
    w->refs = 1;
    w->dp_rank = -1;
    w->engine = w;
    w->weight = weight > 0 ? weight : 1;
    w->healthy = 1;
    w->queue = w->running = w->kv_usage = -1;
    w->kv_tokens = -1;
    w->start_time = -1;
    w->lmcache_occupancy = -1;
    append(r, w);
    return w;
}

/* Rank r > 0 of a data-parallel engine shares rank 0's health and breaker: it points at the
 * rank 0 registered now (a rank restored by a reload may have outlived the old rank 0). */
static void link_engine(kvr_registry *r, kvr_worker *w)
{
    if (w->dp_rank <= 0)
        return;
    char u[2048];
    snprintf(u, sizeof(u), "%s#0", w->base_url);
    kvr_worker *e = kvr_registry_find_url(r, u);
    if (!e || e == w->engine)
        return;
    kvr_worker_ref(e);
    if (w->engine != w)
        kvr_worker_unref(w->engine);
    w->engine = e;
}

kvr_worker *kvr_registry_add_rank(kvr_registry *r, const char *base_url, int rank, int size,
                                  const char *name, double weight)
{
    char u[2048];
    if (rank < 0 || rank >= size || strlen(base_url) > 2000)
        return NULL;
    snprintf(u, sizeof(u), "%s#%d", base_url, rank);
    kvr_worker *w = kvr_registry_add(r, u, name, weight);
    if (!w)
        return NULL;
    if (!(w->base_url = strdup(base_url)))
        abort();
    w->dp_rank = rank;
    w->dp_size = size;
    link_engine(r, w);
    return w;
}

int kvr_registry_readd(kvr_registry *r, kvr_worker *w)
{
    if (kvr_registry_find_url(r, w->url) || kvr_registry_find_name(r, w->name))
        return -1;
    kvr_worker_ref(w);
    w->removed = 0;
    append(r, w);
    link_engine(r, w);
    return 0;
}

/* `a` and `b` equal but for trailing slashes (the same engine URL). */
static int same_base(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    while (la > 7 && a[la - 1] == '/')
        la--;
    while (lb > 7 && b[lb - 1] == '/')
        lb--;
    return la == lb && memcmp(a, b, la) == 0;
}

int kvr_worker_in_engine(const kvr_worker *w, const char *id)
{
    if (w->dp_rank < 0)
        return 0;
    if (same_base(w->base_url, id))
        return 1;
    char rn[16];
    size_t nl = strlen(id), k = (size_t)snprintf(rn, sizeof(rn), "#%d", w->dp_rank);
    return strlen(w->name) == nl + k && strncmp(w->name, id, nl) == 0 &&
           strcmp(w->name + nl, rn) == 0;
}

size_t kvr_registry_find_engine(const kvr_registry *r, const char *id, kvr_worker **out,
                                size_t cap)
{
    size_t k = 0;
    for (size_t i = 0; i < r->n && k < cap; i++)
        if (kvr_worker_in_engine(r->w[i], id))
            out[k++] = r->w[i];
    return k;
}

size_t kvr_registry_ranks(const kvr_registry *r, const kvr_worker *engine, kvr_worker **out,
                          size_t cap)
{
    size_t k = 0;
    for (size_t i = 0; i < r->n; i++)
        if (r->w[i]->engine == engine && r->w[i] != engine) {
            if (k < cap)
                out[k] = r->w[i];
            k++;
        }
    return k;
}

void kvr_registry_remove(kvr_registry *r, kvr_worker *w)
{
    for (size_t i = 0; i < r->n; i++) {
        if (r->w[i] != w)
            continue;
        memmove(&r->w[i], &r->w[i + 1], (r->n - i - 1) * sizeof(*r->w));
        r->n--;
        w->removed = 1;
        kvr_worker_unref(w);
        return;
    }
}

size_t kvr_registry_count(const kvr_registry *r)
{
    return r->n;
}

kvr_worker *kvr_registry_at(const kvr_registry *r, size_t i)
{
    return i < r->n ? r->w[i] : NULL;
}

/* Linear: fleets are tens of workers and these lookups are off the per-request path (probes,
 * admin, reload) or bounded by the fleet size (pins). */
kvr_worker *kvr_registry_get(const kvr_registry *r, size_t id)
{
    for (size_t i = 0; i < r->n; i++)
        if (r->w[i]->id == id)
            return r->w[i];
    return NULL;
}

kvr_worker *kvr_registry_find_url(const kvr_registry *r, const char *url)
{
    for (size_t i = 0; i < r->n; i++)
        if (strcmp(r->w[i]->url, url) == 0)
            return r->w[i];
    return NULL;
}

kvr_worker *kvr_registry_find_name(const kvr_registry *r, const char *name)
{
    for (size_t i = 0; i < r->n; i++)
        if (strcmp(r->w[i]->name, name) == 0)
            return r->w[i];
    return NULL;
}

size_t kvr_registry_eligible_count(const kvr_registry *r)
{
    size_t k = 0;
    for (size_t i = 0; i < r->n; i++)
        k += kvr_worker_eligible(r->w[i]) != 0;
    return k;
}

size_t kvr_registry_serving_count(const kvr_registry *r)
{
    size_t k = 0;
    for (size_t i = 0; i < r->n; i++)
        k += r->w[i]->role != KVR_ROLE_PREFILL && kvr_worker_eligible(r->w[i]) != 0;
    return k;
}

int kvr_worker_set_models(kvr_worker *w, const char *const *ids, size_t n)
{
    int same = w->models && n == w->nmodels;
    for (size_t i = 0; same && i < n; i++)
        same = strcmp(w->models[i], ids[i]) == 0;
    if (same)
        return 0;
    char **m = calloc(n ? n : 1, sizeof(*m));
    if (!m)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!(m[i] = strdup(ids[i]))) {
            for (size_t j = 0; j < i; j++)
                free(m[j]);
            free(m);
            return 0;
        }
    free_models(w);
    w->models = m;
    w->nmodels = n;
    return 1;
}

void kvr_worker_set_api_key(kvr_worker *w, const char *key)
{
    if (w->api_key) {
        memset(w->api_key, 0, strlen(w->api_key));
        free(w->api_key);
    }
    w->api_key = key ? strdup(key) : NULL;
}

int kvr_worker_set_lmcache(kvr_worker *w, const char *endpoint)
{
    if (endpoint && w->lmcache_endpoint && strcmp(endpoint, w->lmcache_endpoint) == 0)
        return 0;
    if (!endpoint && !w->lmcache_endpoint)
        return 0;
    char *e = endpoint ? strdup(endpoint) : NULL;
    if (endpoint && !e)
        return 0; /* keeps the old endpoint: better than none */
    free(w->lmcache_endpoint);
    w->lmcache_endpoint = e;
    /* What the old endpoint said is not about the new one; a poll in flight is dropped. */
    w->lmcache_occupancy = -1;
    w->lmcache_ok_ms = w->lmcache_fresh_until_ms = 0;
    w->lmcache_gen++;
    w->lmcache_polling = 0;
    return 1;
}

int kvr_worker_lists(const kvr_worker *w, const char *model)
{
    for (size_t i = 0; i < w->nmodels; i++)
        if (strcmp(w->models[i], model) == 0)
            return 1;
    return 0;
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
    const char *base = kvr_worker_base(w);
    size_t bl = strlen(base);
    while (bl > 7 && base[bl - 1] == '/')
        bl--;
    size_t pl = strlen(path);
    if (bl + pl >= cap)
        return -1;
    memcpy(out, base, bl);
    memcpy(out + bl, path, pl + 1);
    return 0;
}

static const char *const g_roles[] = {[KVR_ROLE_BOTH] = "both", [KVR_ROLE_PREFILL] = "prefill",
                                      [KVR_ROLE_DECODE] = "decode"};

const char *kvr_worker_role_name(kvr_worker_role role)
{
    return (unsigned)role < 3 ? g_roles[role] : "both";
}

int kvr_worker_role_parse(const char *name, kvr_worker_role *out)
{
    for (int i = 0; i < 3; i++)
        if (strcmp(name, g_roles[i]) == 0) {
            *out = (kvr_worker_role)i;
            return 0;
        }
    return -1;
}
