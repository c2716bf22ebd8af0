/* Building the fleet from a configuration, at start, on reload, when discovery sees a worker's
 * model list change and when the admin port adds or removes a worker (the routes themselves:
 * routes.c). */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/auth.h"
#include "app/app.h"
#include "events/kvevents.h"
#include "proxy/admission.h"
#include "proxy/ratelimit.h"
#include "proxy/tokenize.h"
#include "upstream/egress.h"
#include "util/log.h"
#include "workers/discovery.h"

static int in_config(const kvr_config *c, const kvr_worker *w)
{
    for (size_t i = 0; i < c->nworkers; i++)
        if (strcmp(c->workers[i].url, w->url) == 0)
            return 1;
    return 0;
}

/* A worker a reload removed while its requests still ran, restored by a later reload: the
 * same object comes back, so its in-flight load stays counted. */
static int readd_departed(kvr_app *app, const kvr_worker_spec *ws)
{
    for (size_t i = 0; i < app->ndeparted; i++) {
        kvr_worker *w = app->departed[i];
        if (strcmp(w->url, ws->url) != 0 || w->inflight == 0)
            continue;
        char *n = strdup(ws->name);
        if (!n)
            return 0;
        free(w->name);
        w->name = n;
        w->weight = ws->weight > 0 ? ws->weight : 1;
        if (kvr_registry_readd(app->reg, w) < 0)
            return 0;
        /* Out of the departed list (its reference goes with it; the registry holds one now). */
        app->departed[i] = app->departed[--app->ndeparted];
        kvr_worker_unref(w);
        return 1;
    }
    return 0;
}

/* `w` leaves the fleet: out of the registry at once (its name is free again), what was
 * learned about it forgotten; it lives on, counted, until its requests in flight end. */
static void retire(kvr_app *app, kvr_worker *w)
{
    KVR_INFO("msg=\"worker removed\" worker=%s inflight=%lld", w->url, (long long)w->inflight);
    kvr_app_forget_worker(app, w);
    if (app->kv)
        kvr_kv_events_drop(app->kv, w);
    kvr_app_depart(app, w);
    kvr_registry_remove(app->reg, w);
}

/* Retires the registered workers that neither `c` nor the run-time list has, first, so their
 * names are free for new ones; their requests finish on the routes that still reference
 * them. Returns them, referenced (unref once the routes are rebuilt), or NULL (out of
 * memory; nothing changed). */
static kvr_worker **drop_gone(kvr_app *app, const kvr_config *c, size_t *ngone)
{
    kvr_worker **gone = calloc(kvr_registry_count(app->reg) + 1, sizeof(*gone));
    *ngone = 0;
    if (!gone)
        return NULL;
    for (size_t i = 0; i < kvr_registry_count(app->reg); i++) {
        kvr_worker *w = kvr_registry_at(app->reg, i);
        if (!in_config(c, w) && !kvr_app_api_worker(app, w)) {
            kvr_worker_ref(w);
            gone[(*ngone)++] = w;
        }
    }
    for (size_t i = 0; i < *ngone; i++)
        retire(app, gone[i]);
    return gone;
}

static void unref_all(kvr_worker **ws, size_t n)
{
    for (size_t i = 0; i < n; i++)
        kvr_worker_unref(ws[i]);
    free(ws);
}

/* Registers the worker `ws` describes, or updates the one registered at its URL (name and
 * weight; its load, health and learned state kept). Returns it, or NULL with an error. */
static kvr_worker *sync_worker(kvr_app *app, const kvr_worker_spec *ws, kvr_errlist *errs)
{
    kvr_worker *w = kvr_registry_find_url(app->reg, ws->url);
    if (w) {
        w->dp_size = ws->dp_url ? (int)ws->data_parallel_size : 0; /* a reload resized it */
        if (strcmp(w->name, ws->name) != 0) {
            char *n = strdup(ws->name);
            if (n) {
                free(w->name);
                w->name = n;
            }
        }
        w->weight = ws->weight > 0 ? ws->weight : 1;
    } else if (readd_departed(app, ws)) {
        w = kvr_registry_find_url(app->reg, ws->url);
        KVR_INFO("msg=\"worker restored\" worker=%s", ws->url);
    } else if (!(w = ws->dp_url ? kvr_registry_add_rank(app->reg, ws->dp_url, ws->dp_rank,
                                                        (int)ws->data_parallel_size, ws->name,
                                                        ws->weight)
                                : kvr_registry_add(app->reg, ws->url, ws->name, ws->weight))) {
        kvr_errlist_add(errs, "worker '%s': cannot add it (malformed URL or duplicate)",
                        ws->url);
    } else if (app->routes) {
        KVR_INFO("msg=\"worker added\" worker=%s", ws->url);
    }
    return w;
}

/* A worker added at run time is a worker spec without keys, KV events or LMCache. */
static kvr_worker *sync_api_worker(kvr_app *app, const kvr_api_worker *aw, kvr_errlist *errs)
{
    kvr_worker_spec ws = {.url = aw->url, .name = aw->name, .weight = aw->weight,
                          .dp_url = aw->dp_url, .dp_rank = aw->dp_rank,
                          .data_parallel_size = aw->data_parallel_size};
    kvr_worker *w = sync_worker(app, &ws, errs);
    if (w) {
        w->role = aw->role;
        w->bootstrap_port = aw->bootstrap_port ? aw->bootstrap_port : 8998;
    }
    return w;
}

/* A worker's own key: the first line of api_key_file (trimmed), or api_key_env's value.
 * Returns a malloc'd key, NULL for none, or NULL with an error added. */
static char *worker_key(const kvr_worker_spec *ws, kvr_errlist *errs)
{
    char line[1024] = "";
    if (ws->api_key_file) {
        FILE *f = fopen(ws->api_key_file, "r");
        if (!f || !fgets(line, sizeof(line), f)) {
            kvr_errlist_add(errs, "worker '%s': api_key_file %s: cannot read it", ws->name,
                            ws->api_key_file);
            if (f)
                fclose(f);
            return NULL;
        }
        fclose(f);
    } else if (ws->api_key_env) {
        const char *v = getenv(ws->api_key_env);
        if (!v || !*v) {
            kvr_errlist_add(errs, "worker '%s': api_key_env %s is not set", ws->name,
                            ws->api_key_env);
            return NULL;
        }
        snprintf(line, sizeof(line), "%s", v);
    } else {
        return NULL;
    }
    char *s = line, *e = line + strlen(line);
    while (*s && isspace((unsigned char)*s))
        s++;
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = '\0';
    if (!*s) {
        kvr_errlist_add(errs, "worker '%s': its API key is empty", ws->name);
        return NULL;
    }
    char *k = strdup(s);
    memset(line, 0, sizeof(line));
    return k;
}

/* Everything a configuration needs from outside (key files, the environment), read before
 * anything changes, so a failure leaves the running fleet as it was. */
typedef struct loaded {
    kvr_auth *auth;
    kvr_egress *egress;
    char **keys; /* per worker spec */
} loaded;

static void loaded_free(loaded *l, size_t n)
{
    kvr_auth_free(l->auth);
    kvr_egress_free(l->egress);
    for (size_t i = 0; l->keys && i < n; i++)
        if (l->keys[i]) {
            memset(l->keys[i], 0, strlen(l->keys[i]));
            free(l->keys[i]);
        }
    free(l->keys);
}

static int load_outside(const kvr_config *c, loaded *l, kvr_errlist *errs)
{
    size_t before = errs->n;
    memset(l, 0, sizeof(*l));
    if (c->api_key_file)
        l->auth = kvr_auth_load(c->api_key_file, errs);
    l->egress = kvr_egress_new(c->egress_allow, c->negress_allow, c->egress_deny,
                               c->negress_deny, "egress", errs);
    l->keys = calloc(c->nworkers + 1, sizeof(*l->keys));
    if (!l->keys)
        kvr_errlist_add(errs, "out of memory");
    for (size_t i = 0; l->keys && i < c->nworkers; i++)
        l->keys[i] = worker_key(&c->workers[i], errs);
    return errs->n > before ? -1 : 0;
}

int kvr_app_apply(kvr_app *app, kvr_config *c, kvr_errlist *errs)
{
    loaded ext;
    if (load_outside(c, &ext, errs) < 0) {
        loaded_free(&ext, c->nworkers);
        return -1;
    }
    /* Policies that read the KV block index (precise) borrow it through their tunables. */
    c->route.p.kv = app->kv;
    for (size_t r = 0; r < c->nroutes; r++)
        c->routes[r].cfg.p.kv = app->kv;
    if (app->kv)
        kvr_kv_events_set_cfg(app->kv, &c->kv);
    if (app->tokenizer)
        kvr_tokenizer_set_cfg(app->tokenizer, &c->tokenize);
    if (app->auth) {
        /* Requests in flight may still name their key: retire, free at exit. */
        kvr_auth **r = realloc(app->auth_retired, (app->nauth_retired + 1) * sizeof(*r));
        if (r) {
            app->auth_retired = r;
            app->auth_retired[app->nauth_retired++] = app->auth;
        }
    }
    app->auth = ext.auth;
    ext.auth = NULL;
    kvr_egress_free(app->egress);
    app->egress = ext.egress;
    ext.egress = NULL;
    /* Rate limits restart their windows on reload (documented); the queue keeps its waiters. */
    kvr_ratelimits_free(app->ratelimits);
    app->ratelimits = kvr_ratelimits_new(c->rate_limits, c->nrate_limits);
    if (app->admission)
        kvr_admission_set_max(app->admission, c->max_queue);
    size_t ngone;
    kvr_worker **gone = drop_gone(app, c, &ngone);
    if (!gone) {
        kvr_errlist_add(errs, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < c->nworkers; i++) {
        const kvr_worker_spec *ws = &c->workers[i];
        kvr_worker *w = sync_worker(app, ws, errs);
        if (w) {
            kvr_worker_set_api_key(w, ext.keys[i]);
            w->max_inflight = ws->max_inflight;
            w->role = ws->role;
            w->bootstrap_port = ws->bootstrap_port ? (uint16_t)ws->bootstrap_port : 8998;
            /* Ranks on one endpoint each keep their own batches; per-rank endpoints
             * (rank_port_offset) carry only theirs. */
            int shared = ws->dp_url && !ws->kv_rank_port_offset;
            kvr_kv_events_spec kv = {ws->kv_endpoint, ws->kv_replay_endpoint, ws->kv_topic,
                                     ws->dp_rank, shared ? (int)ws->data_parallel_size : 0};
            if (app->kv && kvr_kv_events_configure(app->kv, w, ws->kv_endpoint ? &kv : NULL) < 0)
                KVR_ERROR("msg=\"KV-event endpoint refused\" worker=%s endpoint=%s", w->url,
                          ws->kv_endpoint);
            /* The old endpoint's occupancy says nothing about the new one's cache. */
            if (kvr_worker_set_lmcache(w, ws->lmcache_endpoint))
                kvr_metric_remove_matching(app->m.lmcache_occupancy, "worker", w->url);
        }
    }
    for (size_t i = 0; i < app->napi_workers; i++)
        sync_api_worker(app, &app->api_workers[i], errs);
    loaded_free(&ext, c->nworkers);
    app->discovering = c->nroutes == 0 && !c->model;
    app->wctx.discover = app->discovering;
    int rc = errs->n ? -1 : kvr_app_build_routes(app, c, errs);
    unref_all(gone, ngone);
    if (rc == 0)
        app->live = c;
    return rc;
}

static kvr_worker *add_one(kvr_app *app, const kvr_api_worker *aw, const char *const *models,
                           size_t nmodels, kvr_errlist *errs)
{
    kvr_api_worker *list = realloc(app->api_workers, (app->napi_workers + 1) * sizeof(*list));
    if (!list) {
        kvr_errlist_add(errs, "out of memory");
        return NULL;
    }
    app->api_workers = list;
    kvr_api_worker *cp = &list[app->napi_workers];
    *cp = (kvr_api_worker){.url = strdup(aw->url), .name = strdup(aw->name),
                           .weight = aw->weight > 0 ? aw->weight : 1, .role = aw->role,
                           .bootstrap_port = aw->bootstrap_port,
                           .routes = calloc(aw->nroutes + 1, sizeof(char *)),
                           .routes_set = aw->routes_set, .source = aw->source,
                           .dp_url = aw->dp_url ? strdup(aw->dp_url) : NULL,
                           .dp_rank = aw->dp_rank,
                           .data_parallel_size = aw->data_parallel_size};
    int oom = !cp->url || !cp->name || !cp->routes || (aw->dp_url && !cp->dp_url);
    for (size_t i = 0; !oom && i < aw->nroutes; i++)
        oom = !(cp->routes[cp->nroutes++] = strdup(aw->routes[i]));
    kvr_worker *w = NULL;
    if (oom)
        kvr_errlist_add(errs, "out of memory");
    else
        app->napi_workers++;
    if (!oom && (w = sync_api_worker(app, cp, errs))) {
        if (models)
            kvr_worker_set_models(w, models, nmodels);
        if (kvr_app_build_routes(app, app->live, errs) == 0) {
            KVR_INFO("msg=\"worker added at run time\" worker=%s name=%s routes=%zu", w->url,
                     w->name, cp->nroutes);
            return w;
        }
        kvr_worker_ref(w);
        kvr_registry_remove(app->reg, w); /* unknown to any route: nothing else to undo */
        kvr_worker_unref(w);
    }
    if (!oom)
        app->napi_workers--;
    kvr_api_worker_free(cp);
    return NULL;
}

kvr_worker *kvr_app_add_worker(kvr_app *app, const kvr_api_worker *aw,
                               const char *const *models, size_t nmodels, kvr_errlist *errs)
{
    if (aw->data_parallel_size <= 1 || aw->dp_url)
        return add_one(app, aw, models, nmodels, errs);
    /* A data-parallel engine joins as its ranks ("URL#r", named "NAME#r"), all or none. */
    kvr_worker *ranks[KVR_MAX_DP_SIZE];
    size_t k = 0, n = aw->data_parallel_size < KVR_MAX_DP_SIZE ? aw->data_parallel_size
                                                                 : KVR_MAX_DP_SIZE;
    char url[2200], name[2200];
    for (; k < n; k++) {
        kvr_api_worker rk = *aw;
        snprintf(url, sizeof(url), "%s#%zu", aw->url, k);
        snprintf(name, sizeof(name), "%s#%zu", aw->name, k);
        rk.url = url;
        rk.name = name;
        rk.dp_url = aw->url;
        rk.dp_rank = (int)k;
        if (!(ranks[k] = add_one(app, &rk, models, nmodels, errs)))
            break;
    }
    if (k == n)
        return ranks[0];
    while (k-- > 0)
        kvr_app_remove_worker(app, ranks[k]);
    return NULL;
}

int kvr_app_remove_worker(kvr_app *app, kvr_worker *w)
{
    kvr_api_worker *aw = kvr_app_api_worker(app, w);
    if (!aw)
        return -1;
    kvr_api_worker_free(aw);
    *aw = app->api_workers[--app->napi_workers];
    kvr_worker_ref(w);
    retire(app, w);
    kvr_errlist errs = {0};
    if (kvr_app_build_routes(app, app->live, &errs) < 0)
        KVR_WARN("msg=\"rebuilding routes failed; the removed worker stays a target until the "
                 "next change\" error=\"%s\"", errs.n ? errs.msg[0] : "");
    kvr_errlist_free(&errs);
    kvr_worker_unref(w);
    return 0;
}

void kvr_app_rediscover(kvr_app *app)
{
    if (!app->discovering)
        return;
    kvr_errlist errs = {0};
    if (app->live && kvr_app_build_routes(app, app->live, &errs) < 0)
        KVR_WARN("msg=\"rebuilding discovered routes failed\" error=\"%s\"",
                 errs.n ? errs.msg[0] : "");
    kvr_errlist_free(&errs);
}

static int str_differ(const char *a, const char *b)
{
    return !a != !b || (a && strcmp(a, b) != 0);
}

/* Kubernetes discovery starts once, with the settings read at start. */
static int k8s_changed(const kvr_k8s_cfg *a, const kvr_k8s_cfg *b)
{
    if (a->nservices != b->nservices || str_differ(a->ns, b->ns) ||
        str_differ(a->port, b->port) || str_differ(a->api_url, b->api_url))
        return 1;
    for (size_t i = 0; i < a->nservices; i++)
        if (strcmp(a->services[i], b->services[i]) != 0)
            return 1;
    return 0;
}

/* Settings read once at start: a reload that changes them says so. */
static void log_ignored(const kvr_config *old, const kvr_config *c)
{
    struct {
        const char *name;
        int changed;
    } s[] = {
        {"listen.host", strcmp(old->host, c->host) != 0},
        {"listen.port", old->port != c->port},
        {"admin.host", strcmp(old->admin_host, c->admin_host) != 0},
        {"admin.port", old->admin_port != c->admin_port},
        {"health_interval_ms", old->health_interval_ms != c->health_interval_ms},
        {"scrape_interval", old->scrape_interval_s != c->scrape_interval_s},
        {"lmcache_interval_ms", old->lmcache_interval_ms != c->lmcache_interval_ms},
        {"discovery_interval", old->discovery_interval_s != c->discovery_interval_s},
        {"otlp_endpoint", !old->otlp.endpoint != !c->otlp.endpoint ||
                              (c->otlp.endpoint && strcmp(old->otlp.endpoint, c->otlp.endpoint))},
        {"access_log", !old->access_log != !c->access_log ||
                           (c->access_log && strcmp(old->access_log, c->access_log))},
        {"access_log_buffer_bytes", old->access_log_buffer_bytes != c->access_log_buffer_bytes},
        {"status_ttft_samples", old->status_ttft_samples != c->status_ttft_samples},
        {"discovery.kubernetes", k8s_changed(&old->k8s, &c->k8s)},
    };
    for (size_t i = 0; i < sizeof(s) / sizeof(s[0]); i++)
        if (s[i].changed)
            KVR_WARN("msg=\"reload: setting needs a restart, ignored\" setting=%s", s[i].name);
}

int kvr_app_reload(kvr_app *app, kvr_errlist *errs)
{
    kvr_config *c = calloc(1, sizeof(*c));
    const char *res[] = {"error"};
    if (!c) {
        kvr_errlist_add(errs, "out of memory");
        kvr_metric_inc(app->m.reloads, res, 1);
        return -1;
    }
    kvr_config_default(c);
    int rc = kvr_config_load(c, app->argc, app->argv, errs);
    kvr_config *prev = app->live;
    /* The configuration is the whole fleet again: workers added at run time go, but for
     * those Kubernetes discovery owns (its watch still reports them). */
    kvr_api_worker *api = app->api_workers;
    size_t napi = app->napi_workers;
    app->api_workers = NULL;
    app->napi_workers = 0;
    size_t nkeep = 0;
    for (size_t i = 0; i < napi; i++)
        nkeep += api[i].source != NULL;
    if (nkeep && (app->api_workers = calloc(nkeep, sizeof(*app->api_workers)))) {
        for (size_t i = 0; i < napi; i++)
            if (api[i].source) {
                app->api_workers[app->napi_workers++] = api[i];
                api[i] = (kvr_api_worker){0}; /* moved */
            }
    }
    if (rc == 0)
        rc = kvr_app_apply(app, c, errs);
    if (rc != 0) {
        /* The kept ones go back where they were. */
        for (size_t i = 0, k = 0; i < napi && k < app->napi_workers; i++)
            if (!api[i].url)
                api[i] = app->api_workers[k++];
        free(app->api_workers);
        app->api_workers = api;
        app->napi_workers = napi;
    } else {
        for (size_t i = 0; i < napi; i++)
            kvr_api_worker_free(&api[i]);
        free(api);
    }
    if (rc != 0) {
        for (size_t i = 0; i < errs->n; i++)
            KVR_WARN("msg=\"reload refused\" error=\"%s\"", errs->msg[i]);
        kvr_config_free(c);
        free(c);
        kvr_metric_inc(app->m.reloads, res, 1);
        return -1;
    }
    log_ignored(&app->cfg, c);
    kvr_discovery_start(&app->wctx); /* a reload may switch to discovered routes */
    if (prev && prev != &app->cfg) {
        kvr_config_free(prev);
        free(prev);
    }
    app->generation++;
    res[0] = "ok";
    kvr_metric_inc(app->m.reloads, res, 1);
    kvr_metric_set(app->m.generation, NULL, (double)app->generation);
    KVR_INFO("msg=\"config reloaded\" generation=%llu routes=%zu workers=%zu",
             (unsigned long long)app->generation, app->routes->n, kvr_registry_count(app->reg));
    return 0;
}
