/* The /workers endpoints of the admin listener. */
#include "api/workers_admin.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/admin.h"
#include "config/config.h"
#include "events/kvevents.h"
#include "upstream/egress.h"
#include "util/json_read.h"
#include "util/log.h"
#include "util/time.h"
#include "workers/discovery.h"
#include "workers/fetch.h"

#define URL_MAX 1024
#define WORKER_NAME_MAX 256
#define ROUTES_MAX 256
#define MODELS_MAX 256
#define MODELS_BODY_CAP (4u << 20)

/* The routes that target `w`, and what they learned about it, summed. */
static json_t *worker_routes(kvr_app *app, const kvr_worker *w, kvr_policy_worker_stats *sum)
{
    json_t *names = json_array();
    memset(sum, 0, sizeof(*sum));
    for (size_t i = 0; i < app->routes->n; i++) {
        kvr_route *rt = app->routes->routes[i];
        if (!kvr_route_target_of(rt, w))
            continue;
        json_array_append_new(names, json_string(rt->name));
        kvr_policy_worker_stats st;
        kvr_route_worker_stats(rt, w, &st);
        sum->index_blocks += st.index_blocks;
        sum->sessions += st.sessions;
        if (st.index_capacity > sum->index_capacity)
            sum->index_capacity = st.index_capacity;
    }
    return names;
}

/* What lmcache_aware knows of `w`'s cache; null without an endpoint. */
static json_t *worker_lmcache(const kvr_worker *w, uint64_t now)
{
    static const char *const states[] = {"neutral", "available", "unavailable"};
    if (!w->lmcache_endpoint)
        return json_null();
    json_t *o = json_pack("{s:s,s:s}", "endpoint", w->lmcache_endpoint, "state",
                          states[kvr_worker_lmcache(w, now)]);
    int answered = w->lmcache_occupancy >= 0;
    json_object_set_new(o, "occupancy", answered ? json_real(w->lmcache_occupancy) : json_null());
    json_object_set_new(o, "cache_available",
                        answered ? json_boolean(w->lmcache_available) : json_null());
    json_object_set_new(o, "age_ms", answered && now >= w->lmcache_ok_ms
                                         ? json_integer((json_int_t)(now - w->lmcache_ok_ms))
                                         : json_null());
    return o;
}

/* One worker as GET /workers lists it. */
static json_t *worker_row(kvr_app *app, const kvr_worker *w, uint64_t now)
{
    kvr_policy_worker_stats st;
    json_t *routes = worker_routes(app, w, &st);
    json_t *o = json_pack("{s:s,s:s,s:f,s:s,s:s,s:b,s:b,s:s,s:b,s:I,s:I,s:I,s:I,s:I,s:f,s:f,s:f,"
                          "s:I,s:o}",
                          "url", w->url, "name", w->name, "weight", w->weight, "role",
                          kvr_worker_role_name(w->role), "source",
                          kvr_app_worker_source(app, w), "eligible",
                          kvr_worker_eligible(w), "healthy", kvr_worker_healthy(w), "breaker",
                          kvr_breaker_state_name(kvr_worker_breaker(w)->state), "draining", w->draining,
                          "inflight", (json_int_t)w->inflight, "requests",
                          (json_int_t)w->requests, "index_blocks", (json_int_t)st.index_blocks,
                          "index_capacity", (json_int_t)st.index_capacity, "sessions",
                          (json_int_t)st.sessions, "queue", w->queue, "running", w->running,
                          "kv_usage", w->kv_usage, "kv_tokens", (json_int_t)w->kv_tokens,
                          "routes", routes);
    json_object_set_new(o, "lmcache", worker_lmcache(w, now));
    /* A data-parallel rank: which one, and the engine URL its requests go to. */
    json_object_set_new(o, "data_parallel_rank", w->dp_rank >= 0 ? json_integer(w->dp_rank)
                                                                 : json_null());
    json_object_set_new(o, "engine_url", json_string(kvr_worker_base(w)));
    if (w->role == KVR_ROLE_PREFILL) /* what SGLang-mode requests name as bootstrap_port */
        json_object_set_new(o, "bootstrap_port", json_integer(w->bootstrap_port));
    if (app->kv && kvr_kv_events_configured(app->kv, w->id)) {
        kvr_kv_worker_stats ks;
        kvr_kv_index_worker_stats(kvr_kv_events_index(app->kv), w->id, &ks);
        json_object_set_new(o, "kv_events",
                            json_string(kvr_kv_trust_name(kvr_kv_events_trust(app->kv, w->id))));
        json_object_set_new(o, "kv_blocks",
                            json_pack("{s:I,s:I,s:I,s:I}", "GPU", (json_int_t)ks.blocks[0], "CPU",
                                      (json_int_t)ks.blocks[1], "speculative",
                                      (json_int_t)ks.speculative, "block_size",
                                      (json_int_t)ks.block_size));
    } else {
        json_object_set_new(o, "kv_events", json_null());
    }
    return o;
}

static void list_workers(kvr_app *app, kvr_http_req *r)
{
    uint64_t now = kvr_now_ms();
    json_t *arr = json_array();
    for (size_t i = 0; i < kvr_registry_count(app->reg); i++)
        json_array_append_new(arr, worker_row(app, kvr_registry_at(app->reg, i), now));
    const char *policy = app->routes->n ? app->routes->routes[0]->ops->name
                                        : app->cfg.route.policy;
    kvr_admin_reply(r, 200, json_pack("{s:s,s:o}", "policy", policy, "workers", arr));
}

static int hexval(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* Percent-decodes `n` bytes of a path segment (a worker named by its URL arrives encoded). */
static int pct_decode(const char *s, size_t n, char *out, size_t cap)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '%' && i + 2 < n && hexval(s[i + 1]) >= 0 && hexval(s[i + 2]) >= 0) {
            c = (char)(hexval(s[i + 1]) * 16 + hexval(s[i + 2]));
            i += 2;
        }
        if (k + 1 >= cap || c == '\0')
            return -1;
        out[k++] = c;
    }
    out[k] = '\0';
    return 0;
}

/* ---- POST /workers ------------------------------------------------------------------ */

static int parse_fail(kvr_api_worker *out, char *msg, size_t cap, const char *text,
                      const char *field)
{
    kvr_api_worker_free(out);
    snprintf(msg, cap, text, field);
    return 400;
}

static int printable(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            return 0;
    return 1;
}

int kvr_admin_worker_parse(const json_t *body, kvr_api_worker *out, char *msg, size_t cap)
{
    memset(out, 0, sizeof(*out));
    out->weight = 1;
    if (!json_is_object(body))
        return parse_fail(out, msg, cap, "the body must be a JSON object%s", "");
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)body, k, v) {
        if (strcmp(k, "url") && strcmp(k, "name") && strcmp(k, "weight") &&
            strcmp(k, "routes") && strcmp(k, "role") && strcmp(k, "bootstrap_port") &&
            strcmp(k, "data_parallel_size"))
            return parse_fail(out, msg, cap,
                              "unknown field '%.64s' (url, name, weight, routes, role, "
                              "bootstrap_port, data_parallel_size)", k);
    }
    json_t *uv = json_object_get(body, "url");
    const char *url = json_string_value(uv);
    if (!url)
        return parse_fail(out, msg, cap,
                          uv ? "'%s' must be a string: the worker's base URL"
                             : "'%s' is required: the worker's base URL",
                          "url");
    if (strlen(url) > URL_MAX || !kvr_config_worker_url_ok(url))
        return parse_fail(out, msg, cap, "'%s' must be an http://HOST[:PORT] URL", "url");
    v = json_object_get(body, "name");
    const char *name = v ? json_string_value(v) : url;
    if (!name || !*name || strlen(name) > WORKER_NAME_MAX || !printable(name))
        return parse_fail(out, msg, cap, "'%s' must be a non-empty string of printable "
                          "characters, at most 256 bytes", "name");
    if (kvr_config_rank_name(name))
        return parse_fail(out, msg, cap, "'%s' may not end in #N: those are the names of "
                          "data-parallel ranks", "name");
    v = json_object_get(body, "weight");
    if (v && (!json_is_number(v) || !(json_number_value(v) > 0) ||
              json_number_value(v) > 1e6))
        return parse_fail(out, msg, cap, "'%s' must be a number in (0, 1000000]", "weight");
    if (v)
        out->weight = json_number_value(v);
    v = json_object_get(body, "data_parallel_size");
    if (v && (!json_is_integer(v) || json_integer_value(v) < 1 ||
              json_integer_value(v) > KVR_MAX_DP_SIZE))
        return parse_fail(out, msg, cap, "'%s' must be an integer in [1, 256]",
                          "data_parallel_size");
    if (v)
        out->data_parallel_size = (uint32_t)json_integer_value(v);
    v = json_object_get(body, "role");
    if (v && (!json_is_string(v) || kvr_worker_role_parse(json_string_value(v), &out->role)))
        return parse_fail(out, msg, cap, "'%s' must be \"both\", \"prefill\" or \"decode\"",
                          "role");
    v = json_object_get(body, "bootstrap_port");
    if (v && (!json_is_integer(v) || json_integer_value(v) < 1 ||
              json_integer_value(v) > 65535))
        return parse_fail(out, msg, cap, "'%s' must be a port number (1-65535)",
                          "bootstrap_port");
    if (v)
        out->bootstrap_port = (uint16_t)json_integer_value(v);
    const json_t *routes = json_object_get(body, "routes");
    if (routes && (!json_is_array(routes) || json_array_size(routes) > ROUTES_MAX))
        return parse_fail(out, msg, cap, "'%s' must be an array of at most 256 route names",
                          "routes");
    out->url = strdup(url);
    out->name = strdup(name);
    out->routes = calloc(json_array_size(routes) + 1, sizeof(char *));
    out->routes_set = routes != NULL;
    if (!out->url || !out->name || !out->routes)
        return parse_fail(out, msg, cap, "out of memory%s", "");
    size_t i;
    json_array_foreach(routes, i, v) {
        if (!json_is_string(v) || !json_string_length(v))
            return parse_fail(out, msg, cap, "'%s' must hold non-empty route names", "routes");
        if (!(out->routes[out->nroutes] = strdup(json_string_value(v))))
            return parse_fail(out, msg, cap, "out of memory%s", "");
        out->nroutes++;
    }
    return 0;
}

/* Why `aw` cannot join the fleet as it is now: 409 or 422 with `msg`, or 0 when it can. */
static int refused(kvr_app *app, const kvr_api_worker *aw, char *msg, size_t cap)
{
    size_t n = kvr_registry_count(app->reg);
    size_t ranks = aw->data_parallel_size > 1 ? aw->data_parallel_size : 1;
    if (n + ranks > KVR_ADMIN_WORKERS_MAX) {
        snprintf(msg, cap, "kvroute holds at most %d workers", KVR_ADMIN_WORKERS_MAX);
        return 409;
    }
    for (size_t i = 0; i < n; i++) {
        const kvr_worker *o = kvr_registry_at(app->reg, i);
        /* A data-parallel engine's URL and name stand for all its ranks. */
        if (kvr_config_same_url(o->url, aw->url) || strcmp(o->name, aw->name) == 0 ||
            strcmp(o->name, aw->url) == 0 || strcmp(o->url, aw->name) == 0 ||
            kvr_config_same_url(kvr_worker_base(o), aw->url) ||
            kvr_worker_in_engine(o, aw->name) || kvr_worker_in_engine(o, aw->url)) {
            snprintf(msg, cap, "worker '%.300s' (%.300s) already has this URL or name", o->name,
                     o->url);
            return 409;
        }
    }
    char why[300];
    if (!kvr_egress_check_url(app->egress, aw->url, why, sizeof(why))) {
        snprintf(msg, cap, "%.300s is refused by the egress policy: %s", aw->url, why);
        return 422;
    }
    for (size_t i = 0; i < aw->nroutes; i++)
        if (!kvr_app_route(app, aw->routes[i])) {
            snprintf(msg, cap, "no route is named '%.300s'", aw->routes[i]);
            return 422;
        }
    return 0;
}

/* The answer about workers `ws` (one, or a data-parallel engine's ranks): a single worker's
 * row, or {url, name, data_parallel_size, workers: [rank rows]}. */
static json_t *rows_of(kvr_app *app, kvr_worker **ws, size_t n, const char *name)
{
    if (n == 1 && ws[0]->dp_rank < 0)
        return worker_row(app, ws[0], kvr_now_ms());
    json_t *rows = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(rows, worker_row(app, ws[i], kvr_now_ms()));
    return json_pack("{s:s,s:s,s:I,s:o}", "url", kvr_worker_base(ws[0]), "name", name,
                     "data_parallel_size", (json_int_t)n, "workers", rows);
}

/* Adds `aw` with its model list (NULL when not read) and answers 201 with its row. Checked
 * again here: the fleet may have changed while its models were read. */
static void add_now(kvr_app *app, kvr_http_req *r, const kvr_api_worker *aw,
                    const char *const *models, size_t n)
{
    char msg[700];
    int st = refused(app, aw, msg, sizeof(msg));
    if (st) {
        kvr_admin_reply_error(r, st, msg, NULL, 0);
        return;
    }
    kvr_errlist errs = {0};
    kvr_worker *w = kvr_app_add_worker(app, aw, models, n, &errs);
    kvr_worker *ws[KVR_MAX_DP_SIZE] = {w};
    if (w)
        kvr_admin_reply(r, 201, rows_of(app, ws, 1 + kvr_registry_ranks(app->reg, w, ws + 1,
                                                                        KVR_MAX_DP_SIZE - 1),
                                        aw->name));
    else
        kvr_admin_reply_error(r, 503, errs.n ? errs.msg[0] : "cannot add the worker", NULL, 0);
    kvr_errlist_free(&errs);
}

/* POST /workers waiting for the new worker's model list. */
typedef struct add_op {
    kvr_app *app;
    kvr_http_req *r; /* NULL once the client left (the request is then ended already) */
    kvr_api_worker aw;
} add_op;

static void add_gone(void *ud)
{
    add_op *op = ud;
    kvr_http_resp_abort(op->r);
    op->r = NULL;
}

static void add_models(void *ud, int status, const char *body, size_t len, int truncated,
                       kvr_upstream_err err)
{
    add_op *op = ud;
    const char *ids[MODELS_MAX];
    void *owner = NULL;
    int n = status == 200 && !truncated ? kvr_discovery_parse(body, len, ids, MODELS_MAX, &owner)
                                        : -1;
    if (op->r) {
        kvr_http_req_set_cbs(op->r, &(kvr_http_req_cbs){NULL, NULL}, NULL);
        if (n >= 0) {
            add_now(op->app, op->r, &op->aw, ids, (size_t)n);
        } else {
            char msg[600];
            snprintf(msg, sizeof(msg), "cannot read the model list of %.300s (GET /v1/models: "
                     "%s); give \"routes\" to add the worker anyway", op->aw.url,
                     status ? (status == 200 ? "not a model list" : "HTTP error")
                            : kvr_upstream_err_name(err));
            kvr_admin_reply_error(op->r, 502, msg, NULL, 0);
        }
    }
    json_decref(owner);
    kvr_api_worker_free(&op->aw);
    free(op);
}

/* Its routes come from the models it lists: read them before it takes any request. */
static void add_after_models(kvr_app *app, kvr_http_req *r, kvr_api_worker *aw)
{
    char url[URL_MAX + 16];
    size_t ul = strlen(aw->url);
    while (ul && aw->url[ul - 1] == '/')
        ul--;
    snprintf(url, sizeof(url), "%.*s/v1/models", (int)ul, aw->url);
    add_op *op = calloc(1, sizeof(*op));
    if (!op) {
        kvr_admin_reply_error(r, 503, "out of memory", NULL, 0);
        return;
    }
    *op = (add_op){app, r, *aw};
    memset(aw, 0, sizeof(*aw)); /* now the operation's */
    kvr_http_req_set_cbs(r, &(kvr_http_req_cbs){NULL, add_gone}, op);
    if (kvr_fetch(app->loop, app->up, url, NULL, MODELS_BODY_CAP, KVR_ADMIN_MODELS_TIMEOUT_MS,
                  add_models, op) < 0) {
        kvr_http_req_set_cbs(r, &(kvr_http_req_cbs){NULL, NULL}, NULL);
        kvr_admin_reply_error(r, 502, "cannot start reading the worker's /v1/models", NULL, 0);
        kvr_api_worker_free(&op->aw);
        free(op);
    }
}

static void add_worker(kvr_app *app, kvr_http_req *r)
{
    size_t blen;
    const char *body = kvr_http_req_body(r, &blen);
    json_error_t jerr;
    json_t *j = kvr_json_read(body, blen, &jerr);
    char msg[700];
    kvr_api_worker aw;
    int st = j ? kvr_admin_worker_parse(j, &aw, msg, sizeof(msg)) : 400;
    json_decref(j);
    if (!j)
        snprintf(msg, sizeof(msg), "invalid JSON body: %s", jerr.text);
    if (st) {
        kvr_admin_reply_error(r, st, msg, NULL, 0);
        return;
    }
    /* Refused before its models are read, when it can be: no pointless request to it. */
    if (!aw.routes_set && !(app->live && app->live->model) &&
        !(st = refused(app, &aw, msg, sizeof(msg))))
        add_after_models(app, r, &aw);
    else if (st)
        kvr_admin_reply_error(r, st, msg, NULL, 0);
    else
        add_now(app, r, &aw, NULL, 0);
    kvr_api_worker_free(&aw);
}

void kvr_admin_workers(kvr_app *app, kvr_http_req *r)
{
    if (strcmp(kvr_http_req_method(r), "POST") == 0)
        add_worker(app, r);
    else
        list_workers(app, r);
}

/* ---- /workers/{name} ---------------------------------------------------------------- */

static void set_draining(kvr_worker *w, int on)
{
    if (w->draining != on)
        KVR_INFO("msg=\"%s\" worker=%s inflight=%lld", on ? "worker draining" : "worker undrained",
                 w->url, (long long)w->inflight);
    w->draining = on;
}

/* PATCH /workers/{name}: weight and drain, validated before anything changes; a data-parallel
 * engine's ranks all change. */
static void patch_worker(kvr_app *app, kvr_http_req *r, kvr_worker **ws, size_t nw,
                         const char *name)
{
    size_t blen;
    const char *body = kvr_http_req_body(r, &blen);
    json_t *j = kvr_json_read(body, blen, NULL), *v;
    const char *k, *bad = NULL;
    int drain = -1;
    double weight = 0;
    json_object_foreach(j, k, v) {
        if (strcmp(k, "weight") == 0 && json_is_number(v) && json_number_value(v) > 0 &&
            json_number_value(v) <= 1e6)
            weight = json_number_value(v);
        else if ((strcmp(k, "drain") == 0 || strcmp(k, "draining") == 0) && json_is_boolean(v))
            drain = json_is_true(v);
        else
            bad = k;
    }
    if (!json_is_object(j) || bad || (weight == 0 && drain < 0)) {
        json_decref(j);
        kvr_admin_reply_error(r, 400, "the body must be a JSON object with \"weight\" (a number "
                              "in (0, 1000000]) and/or \"drain\" (a boolean), nothing else",
                              NULL, 0);
        return;
    }
    json_decref(j);
    for (size_t i = 0; drain >= 0 && i < nw; i++)
        set_draining(ws[i], drain);
    if (weight > 0 && weight != ws[0]->weight) {
        double was = ws[0]->weight;
        for (size_t i = 0; i < nw; i++) {
            kvr_api_worker *aw = kvr_app_api_worker(app, ws[i]);
            ws[i]->weight = weight;
            if (aw)
                aw->weight = weight;
        }
        kvr_errlist errs = {0};
        if (kvr_app_build_routes(app, app->live, &errs) < 0) {
            for (size_t i = 0; i < nw; i++) {
                kvr_api_worker *aw = kvr_app_api_worker(app, ws[i]);
                ws[i]->weight = was;
                if (aw)
                    aw->weight = was;
            }
            kvr_admin_reply_error(r, 503, errs.n ? errs.msg[0] : "out of memory", NULL, 0);
            kvr_errlist_free(&errs);
            return;
        }
        KVR_INFO("msg=\"worker weight\" worker=%s weight=%g", name, weight);
    }
    kvr_admin_reply(r, 200, rows_of(app, ws, nw, name));
}

static void delete_worker(kvr_app *app, kvr_http_req *r, kvr_worker **ws, size_t nw,
                          const char *name)
{
    kvr_worker *w = ws[0];
    if (!kvr_app_api_worker(app, w)) {
        kvr_admin_reply_error(r, 409, "this worker is configured: drain it, or remove it from "
                              "the configuration and reload", NULL, 0);
        return;
    }
    if (kvr_app_api_worker(app, w)->source) {
        kvr_admin_reply_error(r, 409, "this worker comes from Kubernetes discovery: it leaves "
                              "when its endpoint does (drain it meanwhile)", NULL, 0);
        return;
    }
    int64_t inflight = 0;
    for (size_t i = 0; i < nw; i++)
        inflight += ws[i]->inflight;
    int group = nw > 1 || w->dp_rank >= 0;
    json_t *out = json_pack("{s:s,s:s,s:b,s:I}", "name", group ? name : w->name, "url",
                            group ? kvr_worker_base(w) : w->url, "removed", 1, "inflight",
                            (json_int_t)inflight);
    for (size_t i = 0; i < nw; i++) /* every rank of a data-parallel engine */
        if (kvr_app_api_worker(app, ws[i]))
            kvr_app_remove_worker(app, ws[i]);
    kvr_admin_reply(r, 200, out);
}

/* The workers `name` designates: one worker by name or URL, else every rank of the
 * data-parallel engine of that name or URL. Returns how many (0 = none). */
static size_t designated(kvr_app *app, const char *name, kvr_worker **out, size_t cap)
{
    kvr_worker *w = kvr_registry_find_name(app->reg, name);
    if (!w)
        w = kvr_registry_find_url(app->reg, name);
    if (w) {
        out[0] = w;
        return 1;
    }
    return kvr_registry_find_engine(app->reg, name, out, cap);
}

void kvr_admin_worker(kvr_app *app, kvr_http_req *r)
{
    const char *rest = kvr_http_req_path(r) + 9, *method = kvr_http_req_method(r);
    int post = strcmp(method, "POST") == 0;
    const char *slash = post ? strrchr(rest, '/') : NULL;
    int on = slash && strcmp(slash, "/drain") == 0;
    char name[2048];
    if ((post && (!slash || (!on && strcmp(slash, "/undrain") != 0))) ||
        pct_decode(rest, slash ? (size_t)(slash - rest) : strlen(rest), name, sizeof(name)) < 0) {
        kvr_admin_reply_error(r, 404, "unknown admin path", NULL, 0);
        return;
    }
    kvr_worker *ws[KVR_MAX_DP_SIZE];
    size_t nw = designated(app, name, ws, KVR_MAX_DP_SIZE);
    if (!nw) {
        kvr_admin_reply_error(r, 404, "no such worker", NULL, 0);
        return;
    }
    if (strcmp(method, "PATCH") == 0) {
        patch_worker(app, r, ws, nw, name);
    } else if (strcmp(method, "DELETE") == 0) {
        delete_worker(app, r, ws, nw, name);
    } else {
        int64_t inflight = 0;
        for (size_t i = 0; i < nw; i++) {
            set_draining(ws[i], on);
            inflight += ws[i]->inflight;
        }
        int group = nw > 1 || ws[0]->dp_rank >= 0;
        kvr_admin_reply(r, 200, json_pack("{s:s,s:s,s:b,s:I}", "name", group ? name : ws[0]->name,
                                          "url", group ? kvr_worker_base(ws[0]) : ws[0]->url,
                                          "draining", on, "inflight", (json_int_t)inflight));
    }
}
