/* The app's side of the replicas' shared state (app/app.h, cluster/cluster.h): what this
 * replica teaches goes to the routing log; what the others taught is applied to the routes;
 * loads are published and read back per worker name. */
#include <stdlib.h>
#include <string.h>

#include "app/app.h"
#include "cluster/cluster.h"
#include "util/log.h"

/* The worker named `name` (`len` bytes), or NULL. */
static kvr_worker *worker_named(kvr_app *app, const char *name, size_t len)
{
    for (size_t i = 0; i < kvr_registry_count(app->reg); i++) {
        kvr_worker *w = kvr_registry_at(app->reg, i);
        if (strlen(w->name) == len && !memcmp(w->name, name, len))
            return w;
    }
    return NULL;
}

static kvr_route *route_named(kvr_app *app, const char *name, size_t len)
{
    for (size_t i = 0; app->routes && i < app->routes->n; i++) {
        kvr_route *r = app->routes->routes[i];
        if (strlen(r->name) == len && !memcmp(r->name, name, len))
            return r;
    }
    return NULL;
}

static void on_apply(void *ud, const kvr_entry *e, uint64_t age_ms)
{
    kvr_app *app = ud;
    kvr_worker *w = worker_named(app, e->worker, e->worker_len);
    if (!w)
        return; /* a worker this replica does not route to */
    if (e->type == KVR_ENTRY_FORGET) {
        kvr_app_forget_worker(app, w);
        return;
    }
    kvr_route *r = route_named(app, e->route, e->route_len);
    if (!r)
        return;
    if (e->nkeys > app->ncluster_keys) {
        uint64_t *k = realloc(app->cluster_keys, e->nkeys * sizeof(*k));
        if (!k)
            return;
        app->cluster_keys = k;
        app->ncluster_keys = e->nkeys;
    }
    for (size_t i = 0; i < e->nkeys; i++)
        app->cluster_keys[i] = kvr_entry_key(e, i);
    kvr_learned l = {
        .session = e->has_session ? e->session : NULL,
        .session_len = e->has_session ? sizeof(e->session) : 0,
        .age_ms = age_ms,
        .ttl_ms = e->ttl_s * 1000,
        .keys = app->cluster_keys,
        .nkeys = e->nkeys,
        .block_bytes = e->block_bytes,
        .correct = e->type == KVR_ENTRY_CORRECT,
        .keep_blocks = (size_t)e->keep_blocks,
    };
    kvr_route_learn(r, w, &l);
}

static size_t on_local_load(void *ud, const char **names, int64_t *counts, size_t max)
{
    kvr_app *app = ud;
    size_t n = 0;
    for (size_t i = 0; i < kvr_registry_count(app->reg) && n < max; i++) {
        kvr_worker *w = kvr_registry_at(app->reg, i);
        if (w->inflight <= 0)
            continue; /* absent = 0: the hash stays small */
        names[n] = w->name;
        counts[n++] = w->inflight;
    }
    return n;
}

static void on_remote_load(void *ud, const kvr_cluster_load *loads, size_t n)
{
    kvr_app *app = ud;
    for (size_t i = 0; i < kvr_registry_count(app->reg); i++) {
        kvr_worker *w = kvr_registry_at(app->reg, i);
        int64_t v = 0;
        size_t len = strlen(w->name);
        for (size_t j = 0; j < n; j++)
            if (loads[j].worker_len == len && !memcmp(loads[j].worker, w->name, len))
                v = loads[j].inflight;
        w->remote_inflight = v;
    }
}

int kvr_app_cluster_start(kvr_app *app, char *err, size_t cap)
{
    if (!app->cfg.cluster.url || !*app->cfg.cluster.url)
        return 0;
    kvr_cluster_hooks h = {
        .apply = on_apply,
        .local_load = on_local_load,
        .remote_load = on_remote_load,
        .ud = app,
    };
    app->cluster = kvr_cluster_new(app->loop, &app->cfg.cluster, app->metrics, &h, err, cap);
    return app->cluster ? 0 : -1;
}

void kvr_app_cluster_taught(kvr_app *app, kvr_route *r, kvr_worker *w, const kvr_route_keys *k)
{
    if (!app->cluster || !r->ops->learn || w->removed || (!k->text_len && !k->session_len))
        return;
    size_t bb = r->cfg.block_bytes, max = app->cfg.cluster.entry_max_blocks;
    size_t n = k->text_len ? (k->text_len + bb - 1) / bb : 0;
    if (n > max)
        n = max;
    if (n > app->ncluster_keys) {
        uint64_t *p = realloc(app->cluster_keys, n * sizeof(*p));
        if (!p)
            return;
        app->cluster_keys = p;
        app->ncluster_keys = n;
    }
    if (n)
        kvr_prefix_keys_get(k->kept, bb, k->text, k->text_len, app->cluster_keys, n);
    /* Little-endian bytes, as the entry carries them. */
    unsigned char *bytes = n ? malloc(n * 8) : NULL;
    if (n && !bytes)
        return;
    for (size_t i = 0; i < n; i++)
        for (int b = 0; b < 8; b++)
            bytes[i * 8 + b] = (unsigned char)(app->cluster_keys[i] >> (8 * b));
    kvr_entry e = {
        .type = KVR_ENTRY_TEACH,
        .route = r->name,
        .route_len = strlen(r->name),
        .worker = w->name,
        .worker_len = strlen(w->name),
        .block_bytes = bb,
        .keys = bytes,
        .nkeys = n,
    };
    /* In a cluster the session key is already the digest (proxy/keys.c). */
    if (k->session_len == sizeof(e.session)) {
        memcpy(e.session, k->session, sizeof(e.session));
        e.has_session = 1;
        e.ttl_s = r->cfg.session_ttl_s;
    }
    kvr_cluster_append(app->cluster, &e);
    free(bytes);
}

void kvr_app_cluster_corrected(kvr_app *app, kvr_route *r, kvr_worker *w,
                               const kvr_route_keys *k, int64_t cached, int64_t prompt)
{
    if (!app->cluster || !r->ops->learn || w->removed || !k->text_len || prompt <= 0 ||
        cached < 0)
        return;
    /* The block the worker was found without, and the cap's floor, as cache_aware's
     * correction computes them (routing/policy_cache_aware.h). */
    size_t bb = r->cfg.block_bytes;
    double ratio = cached < prompt ? (double)cached / (double)prompt : 1.0;
    size_t first_missing = (size_t)(ratio * (double)k->text_len) / bb;
    size_t nblocks = (k->text_len + bb - 1) / bb;
    if (first_missing >= nblocks || first_missing >= app->cfg.cluster.entry_max_blocks)
        return;
    uint64_t *keys = malloc((first_missing + 1) * sizeof(*keys));
    if (!keys)
        return;
    kvr_prefix_keys_get(k->kept, bb, k->text, k->text_len, keys, first_missing + 1);
    unsigned char key8[8];
    for (int b = 0; b < 8; b++)
        key8[b] = (unsigned char)(keys[first_missing] >> (8 * b));
    free(keys);
    kvr_entry e = {
        .type = KVR_ENTRY_CORRECT,
        .route = r->name,
        .route_len = strlen(r->name),
        .worker = w->name,
        .worker_len = strlen(w->name),
        .block_bytes = bb,
        .keys = key8,
        .nkeys = 1,
        .keep_blocks = 2 * nblocks,
    };
    kvr_cluster_append(app->cluster, &e);
}

void kvr_app_cluster_forgot(kvr_app *app, kvr_worker *w)
{
    if (!app->cluster)
        return;
    kvr_entry e = {
        .type = KVR_ENTRY_FORGET,
        .worker = w->name,
        .worker_len = strlen(w->name),
    };
    kvr_cluster_append(app->cluster, &e);
}
