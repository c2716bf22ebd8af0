/* The route table: from a configuration's routes (or --model, or the workers' model lists)
 * plus the workers added at run time, keeping what each route learned. */
#include <stdlib.h>
#include <string.h>

#include "app/app.h"

static kvr_worker *find_worker(const kvr_app *app, const char *name)
{
    kvr_worker *w = kvr_registry_find_name(app->reg, name);
    return w ? w : kvr_registry_find_url(app->reg, name);
}

void kvr_api_worker_free(kvr_api_worker *aw)
{
    for (size_t i = 0; i < aw->nroutes; i++)
        free(aw->routes[i]);
    free(aw->routes);
    free(aw->url);
    free(aw->name);
    free(aw->dp_url);
    memset(aw, 0, sizeof(*aw));
}

kvr_api_worker *kvr_app_api_worker(const kvr_app *app, const kvr_worker *w)
{
    for (size_t i = 0; i < app->napi_workers; i++)
        if (strcmp(app->api_workers[i].url, w->url) == 0)
            return &app->api_workers[i];
    return NULL;
}

/* `s` is the route's public name or one of its aliases (`rs`: its file spec, or NULL). */
static int names_route(const char *s, const char *name, const kvr_route_spec *rs)
{
    if (strcmp(s, name) == 0)
        return 1;
    for (size_t a = 0; rs && a < rs->naliases; a++)
        if (strcmp(s, rs->aliases[a]) == 0)
            return 1;
    return 0;
}

/* The model a worker added at run time is sent on a route: the route's name (NULL), an alias
 * or a configured target's model, whichever it lists first (`*lists` = 1); else the first
 * configured target's. */
static const char *api_model(const kvr_worker *w, const char *name, const kvr_route_spec *rs,
                             int *lists)
{
    *lists = 1;
    if (kvr_worker_lists(w, name))
        return NULL;
    for (size_t a = 0; rs && a < rs->naliases; a++)
        if (kvr_worker_lists(w, rs->aliases[a]))
            return rs->aliases[a];
    for (size_t t = 0; rs && t < rs->ntargets; t++)
        if (rs->targets[t].model && kvr_worker_lists(w, rs->targets[t].model))
            return rs->targets[t].model;
    *lists = 0;
    return rs && rs->ntargets ? rs->targets[0].model : NULL;
}

/* Whether registry worker `w` is a target of the route `name` (`rs`: its file spec, or NULL)
 * and with which upstream model (`*model`, NULL = the route's name). A configured worker: as
 * `dflt` says. One added at run time: when its routes name the route; without routes, as
 * `dflt` says or when it lists the route's model. */
static int joins(const kvr_app *app, const kvr_worker *w, int dflt, const char *name,
                 const kvr_route_spec *rs, const char **model)
{
    const kvr_api_worker *aw = kvr_app_api_worker(app, w);
    *model = NULL;
    if (!aw)
        return dflt;
    int lists;
    *model = api_model(w, name, rs, &lists);
    if (!aw->routes_set)
        return dflt || lists;
    for (size_t i = 0; i < aw->nroutes; i++)
        if (names_route(aw->routes[i], name, rs))
            return 1;
    return 0;
}

static void route_def(const kvr_route_cfg *rc, kvr_route_def *d, const char *name)
{
    *d = (kvr_route_def){
        .name = name,
        .ops = kvr_policy_find(rc->policy),
        .cfg = &rc->p,
        .response_pins = rc->p.max_sessions,
        .response_pin_ttl_ms = rc->p.session_ttl_s * 1000,
    };
}

/* Makes one route; `prev` is the route of that name being replaced (state kept). A route
 * with prefill-role targets is disaggregated: its own policy is then the prefill side's. */
static int add_route(kvr_app *app, kvr_route_table *t, const kvr_route_def *d0,
                     const kvr_route_cfg *rc, kvr_errlist *errs)
{
    kvr_route_def dd = *d0, *d = &dd;
    int prefill = 0;
    for (size_t i = 0; i < d->ntargets; i++)
        prefill |= d->targets[i].worker && d->targets[i].worker->role == KVR_ROLE_PREFILL;
    if (prefill) {
        dd.ops = kvr_policy_find(rc->prefill_policy);
        dd.decode_ops = kvr_policy_find(rc->decode_policy);
        dd.pd_mode = strcmp(rc->pd_mode, kvr_pd_mode_name(KVR_PD_SGLANG)) == 0 ? KVR_PD_SGLANG
                                                                             : KVR_PD_VLLM;
    }
    kvr_route *prev = kvr_route_table_find(app->routes, d->name);
    if (prev && strcmp(prev->name, d->name) != 0)
        prev = NULL; /* found by an alias: another route */
    kvr_route *r = kvr_route_new(d, prev);
    if (!r) {
        kvr_errlist_add(errs, "route '%s': out of memory", d->name);
        return -1;
    }
    kvr_route_table_add(t, r);
    return 0;
}

static int build_file_routes(kvr_app *app, const kvr_config *c, kvr_route_table *t,
                             kvr_errlist *errs)
{
    int rc = 0;
    for (size_t i = 0; i < c->nroutes && rc == 0; i++) {
        const kvr_route_spec *rs = &c->routes[i];
        kvr_route_target *tg = calloc(rs->ntargets + app->napi_workers + 1, sizeof(*tg));
        if (!tg) {
            kvr_errlist_add(errs, "out of memory");
            return -1;
        }
        for (size_t k = 0; k < rs->ntargets; k++) {
            kvr_worker *w = find_worker(app, rs->targets[k].worker);
            tg[k] = (kvr_route_target){w, (char *)rs->targets[k].model,
                                       rs->targets[k].weight > 0 ? rs->targets[k].weight
                                       : w ? w->weight : 1};
            if (!w) {
                kvr_errlist_add(errs, "route '%s': unknown worker '%s'", rs->name,
                                rs->targets[k].worker);
                rc = -1;
            }
        }
        size_t n = rs->ntargets;
        for (size_t a = 0; a < app->napi_workers; a++) {
            kvr_worker *w = kvr_registry_find_url(app->reg, app->api_workers[a].url);
            const char *model;
            if (w && joins(app, w, 0, rs->name, rs, &model))
                tg[n++] = (kvr_route_target){w, (char *)model, w->weight};
        }
        kvr_route_def d;
        route_def(&rs->cfg, &d, rs->name);
        d.aliases = rs->aliases;
        d.naliases = rs->naliases;
        d.targets = tg;
        d.ntargets = n;
        if (rc == 0)
            rc = add_route(app, t, &d, &rs->cfg, errs);
        free(tg);
    }
    return rc;
}

/* One route over every worker (--model), or one per listed model (discovery). */
static int build_cli_routes(kvr_app *app, const kvr_config *c, kvr_route_table *t,
                            kvr_errlist *errs)
{
    size_t nw = kvr_registry_count(app->reg);
    kvr_route_target *tg = calloc(nw ? nw : 1, sizeof(*tg));
    if (!tg) {
        kvr_errlist_add(errs, "out of memory");
        return -1;
    }
    int rc = 0;
    kvr_route_def d;
    const char *um;
    if (c->model) {
        size_t n = 0;
        for (size_t i = 0; i < nw; i++) {
            kvr_worker *w = kvr_registry_at(app->reg, i);
            if (joins(app, w, 1, c->model, NULL, &um))
                tg[n++] = (kvr_route_target){w, (char *)um, w->weight};
        }
        route_def(&c->route, &d, c->model);
        d.targets = tg;
        d.ntargets = n;
        rc = add_route(app, t, &d, &c->route, errs);
    } else {
        /* Each model once, in the order the workers list them (a worker added at run time
         * for named routes: only the models named). */
        for (size_t i = 0; i < nw && rc == 0; i++) {
            kvr_worker *wi = kvr_registry_at(app->reg, i);
            for (size_t m = 0; m < wi->nmodels && rc == 0; m++) {
                const char *model = wi->models[m];
                if (kvr_route_table_find(t, model) || !joins(app, wi, 1, model, NULL, &um))
                    continue;
                size_t n = 0;
                for (size_t j = 0; j < nw; j++) {
                    kvr_worker *w = kvr_registry_at(app->reg, j);
                    if (joins(app, w, kvr_worker_lists(w, model), model, NULL, &um))
                        tg[n++] = (kvr_route_target){w, (char *)um, w->weight};
                }
                route_def(&c->route, &d, model);
                d.targets = tg;
                d.ntargets = n;
                rc = add_route(app, t, &d, &c->route, errs);
            }
        }
    }
    free(tg);
    return rc;
}

int kvr_app_build_routes(kvr_app *app, const kvr_config *c, kvr_errlist *errs)
{
    kvr_route_table *t = kvr_route_table_new();
    int rc = c->nroutes ? build_file_routes(app, c, t, errs) : build_cli_routes(app, c, t, errs);
    if (rc < 0) {
        kvr_route_table_free(t);
        return -1;
    }
    /* Requests in progress hold their own references: swapping cuts nothing. */
    kvr_route_table *old = app->routes;
    app->routes = t;
    kvr_route_table_free(old);
    return 0;
}

