/* Admin endpoints: dispatch, routes, reload and routing explanation (the /workers ones are
 * workers_admin.c's). */
#include "api/admin.h"

#include <ctype.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/reply.h"
#include "api/status.h"
#include "api/validate.h"
#include "api/workers_admin.h"
#include "cluster/cluster.h"
#include "events/kvevents.h"
#include "proxy/keys.h"
#include "proxy/tokenize.h"
#include "routing/scorers.h"
#include "util/json_read.h"
#include "util/log.h"
#include "util/oai_error.h"
#include "util/time.h"
#include "workers/registry.h"

static char *g_token;

int kvr_admin_load_token(kvr_app *app, char *err, size_t cap)
{
    const char *path = app->cfg.admin_token_file;
    if (!path)
        return 0;
    FILE *f = fopen(path, "r");
    char line[1024] = "";
    if (!f) {
        snprintf(err, cap, "--admin-token-file %s: cannot read it", path);
        return -1;
    }
    if (!fgets(line, sizeof(line), f))
        line[0] = '\0'; /* an empty file: said below */
    fclose(f);
    char *s = line, *e = line + strlen(line);
    while (*s && isspace((unsigned char)*s))
        s++;
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = '\0';
    if (!*s) {
        snprintf(err, cap, "--admin-token-file %s: the token is empty", path);
        return -1;
    }
    g_token = strdup(s);
    return g_token ? 0 : -1;
}

static int authorized(kvr_http_req *r)
{
    if (!g_token)
        return 1;
    const char *h = kvr_http_req_header(r, "authorization");
    if (!h || strncasecmp(h, "Bearer ", 7) != 0)
        return 0;
    const char *t = h + 7;
    size_t a = strlen(t), b = strlen(g_token);
    /* Compare every byte whatever the first difference, so timing tells nothing. */
    unsigned char diff = (unsigned char)(a != b);
    for (size_t i = 0; i < b; i++)
        diff |= (unsigned char)(g_token[i] ^ (i < a ? t[i] : 0));
    return diff == 0;
}

void kvr_admin_reply(kvr_http_req *r, int status, json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    kvr_http_resp_simple(r, status, "application/json", NULL, 0, s ? s : "{}",
                         s ? strlen(s) : 2);
    free(s);
}

static void reply_error(kvr_http_req *r, int status, const char *msg, const char *param,
                        const char *code, const kvr_http_header *h, size_t n)
{
    kvr_buf b;
    kvr_buf_init(&b, 0);
    kvr_oai_error_json(&b, status, msg, param, code);
    kvr_http_resp_simple(r, status, "application/json", h, n, b.data, b.len);
    kvr_buf_free(&b);
}

void kvr_admin_reply_error(kvr_http_req *r, int status, const char *msg,
                           const kvr_http_header *h, size_t n)
{
    reply_error(r, status, msg, NULL, NULL, h, n);
}

void kvr_admin_reply_error_code(kvr_http_req *r, int status, const char *msg, const char *param,
                                const char *code)
{
    reply_error(r, status, msg, param, code, NULL, 0);
}

static void routes(kvr_app *app, kvr_http_req *r)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < app->routes->n; i++) {
        kvr_route *rt = app->routes->routes[i];
        json_t *aliases = json_array(), *targets = json_array();
        for (size_t a = 0; a < rt->naliases; a++)
            json_array_append_new(aliases, json_string(rt->aliases[a]));
        for (size_t t = 0; t < rt->ntargets; t++) {
            const kvr_route_target *tg = &rt->targets[t];
            kvr_policy_worker_stats st;
            kvr_route_worker_stats(rt, tg->worker, &st);
            json_array_append_new(
                targets,
                json_pack("{s:s,s:s,s:s,s:s,s:f,s:b,s:I,s:I,s:I}", "worker", tg->worker->name,
                          "url", tg->worker->url, "role", kvr_worker_role_name(tg->worker->role),
                          "model", tg->model, "weight", tg->weight, "eligible",
                          kvr_worker_eligible(tg->worker), "inflight",
                          (json_int_t)tg->worker->inflight, "index_blocks",
                          (json_int_t)st.index_blocks, "sessions", (json_int_t)st.sessions));
        }
        kvr_policy_stats ps;
        kvr_route_stats(rt, &ps);
        json_t *row = json_pack("{s:s,s:o,s:s,s:o,s:I,s:I}", "name", rt->name, "aliases",
                                aliases, "policy", rt->ops->name, "targets", targets,
                                "index_blocks", (json_int_t)ps.index_blocks, "sessions",
                                (json_int_t)ps.sessions);
        /* A disaggregated route's policy is its prefill side's; the decode side has its own. */
        if (rt->pd)
            json_object_set_new(row, "pd",
                                json_pack("{s:s,s:s,s:s}", "mode",
                                          kvr_pd_mode_name(rt->pd->mode),
                                          "prefill_policy", rt->ops->name, "decode_policy",
                                          rt->pd->decode->ops->name));
        json_array_append_new(arr, row);
    }
    kvr_admin_reply(r, 200, json_pack("{s:I,s:o}", "generation", (json_int_t)app->generation,
                                      "routes", arr));
}

static void reload(kvr_app *app, kvr_http_req *r)
{
    kvr_errlist errs = {0};
    if (!app->cfg.config_file) {
        /* As SIGHUP: nothing to re-read. Re-applying the command line alone would only drop
         * the workers added at run time. */
        kvr_admin_reply(r, 409, json_pack("{s:s,s:I,s:[s]}", "result", "error", "generation",
                                          (json_int_t)app->generation, "errors",
                                          "no --config file to reload"));
    } else if (kvr_app_reload(app, &errs) == 0) {
        kvr_admin_reply(r, 200, json_pack("{s:s,s:I}", "result", "ok", "generation",
                                (json_int_t)app->generation));
    } else {
        json_t *list = json_array();
        for (size_t i = 0; i < errs.n; i++)
            json_array_append_new(list, json_string(errs.msg[i]));
        kvr_admin_reply(r, 422, json_pack("{s:s,s:I,s:o}", "result", "error", "generation",
                                (json_int_t)app->generation, "errors", list));
    }
    kvr_errlist_free(&errs);
}

static int endpoint_of(kvr_http_req *r, const json_t *body, kvr_endpoint *ep)
{
    const char *t = strchr(kvr_http_req_target(r), '?');
    if (t) {
        if (strstr(t, "endpoint=chat"))
            return *ep = KVR_EP_CHAT, 0;
        if (strstr(t, "endpoint=completions"))
            return *ep = KVR_EP_COMPLETIONS, 0;
        if (strstr(t, "endpoint=responses"))
            return *ep = KVR_EP_RESPONSES, 0;
        if (strstr(t, "endpoint=messages"))
            return *ep = KVR_EP_MESSAGES, 0;
        if (strstr(t, "endpoint="))
            return -1;
    }
    /* Anthropic clients always send anthropic-version; OpenAI's chat has no top-level system. */
    int anthropic =
        kvr_http_req_header(r, "anthropic-version") || json_object_get(body, "system");
    *ep = json_object_get(body, "messages") ? (anthropic ? KVR_EP_MESSAGES : KVR_EP_CHAT)
          : json_object_get(body, "prompt") ? KVR_EP_COMPLETIONS
                                             : KVR_EP_RESPONSES;
    return 0;
}

/* POST /debug/route in progress (it may wait for the prompt's token ids). */
typedef struct dbg {
    kvr_app *app;
    kvr_http_req *r;
    kvr_route *rt;
    kvr_request_keys keys;
    char *pin;
    size_t pin_len;
    kvr_tokenize_op *tok;
    int sync;
} dbg;

static void dbg_free(dbg *d)
{
    if (d->tok)
        kvr_tokenize_cancel(d->tok);
    kvr_request_keys_free(&d->keys);
    if (d->rt)
        kvr_route_unref(d->rt);
    free(d->pin);
    free(d);
}

static void dbg_gone(void *ud)
{
    dbg_free(ud);
}

/* pipeline: every scorer's value and their weighted sum; cost: the terms of its prediction. */
static void explain_scores(json_t *row, const kvr_explain_row *ex)
{
    if (ex->scored == 1) {
        json_t *sc = json_object();
        for (int s = 0; s < KVR_NSCORERS; s++)
            json_object_set_new(sc, kvr_scorer_name(s), json_real(ex->scorers[s]));
        json_object_set_new(row, "scorers", sc);
        json_object_set_new(row, "score", json_real(ex->score));
    } else if (ex->scored == 2) {
        json_object_set_new(row, "prefill_pending_tokens", json_real(ex->prefill_pending));
        json_object_set_new(row, "uncached_tokens", json_real(ex->prefill_uncached));
        json_object_set_new(row, "seconds_per_token", json_real(ex->seconds_per_token));
        json_object_set_new(row, "cost_s", json_real(ex->score));
    }
}

/* A disaggregated route's two picks: the prefill one (as explained above) and the decode
 * one its decode side would make now. */
static json_t *pd_picks(kvr_route *rt, const kvr_pick *pf, const kvr_route_keys *k)
{
    kvr_pick dp = {0};
    const kvr_route_target *t;
    kvr_route *dr = rt->pd->decode;
    int ok = kvr_route_pick(dr, NULL, 0, k, NULL, 0, &dp, &t) == 0;
    return json_pack("{s:s,s:{s:s,s:s?,s:s?,s:f},s:{s:s,s:s?,s:s?}}", "mode",
                     kvr_pd_mode_name(rt->pd->mode), "prefill", "policy",
                     rt->ops->name, "worker", pf->worker ? pf->worker->url : NULL, "decision",
                     pf->decision, "match", pf->match, "decode", "policy", dr->ops->name,
                     "worker", ok ? dp.worker->url : NULL, "decision", ok ? dp.decision : NULL);
}

static void dbg_answer(dbg *d)
{
    kvr_http_req *r = d->r;
    kvr_route *rt = d->rt;
    kvr_http_req_set_cbs(r, &(kvr_http_req_cbs){NULL, NULL}, NULL);
    kvr_pick pick = {0};
    const kvr_explain_row *ex = NULL;
    size_t n = 0, nex = 0, exc[KVR_ADMIN_WORKERS_MAX];
    /* A disaggregated route's own policy picks its prefill worker among the prefill ones. */
    nex = kvr_route_role_exclude(rt, 1, exc, 0, sizeof(exc) / sizeof(exc[0]));
    int local = 0; /* no prefill worker: a decode worker would prefill it (pd_local_prefill) */
    int rc = kvr_route_explain(rt, exc, nex, &d->keys.k, d->pin, d->pin_len, &pick, &ex, &n);
    if (rc < 0 && rt->pd) {
        local = 1;
        nex = kvr_route_role_exclude(rt, 0, exc, 0, sizeof(exc) / sizeof(exc[0]));
        rc = kvr_route_explain(rt, exc, nex, &d->keys.k, d->pin, d->pin_len, &pick, &ex, &n);
        pick.decision = "pd_local_prefill";
    }
    if (rc < 0) {
        dbg_free(d);
        kvr_admin_reply_error(r, 503, "no eligible worker", NULL, 0);
        return;
    }
    json_t *rows = json_array();
    for (size_t i = 0; i < n; i++) {
        json_t *row = json_pack("{s:s,s:s,s:f,s:I,s:I,s:b,s:b,s:s?,s:f}", "url",
                                ex[i].worker->url, "name", ex[i].worker->name, "match",
                                ex[i].match, "matched_bytes", (json_int_t)ex[i].matched_bytes,
                                "inflight", (json_int_t)ex[i].inflight, "overloaded",
                                ex[i].overloaded, "session_owner", ex[i].session_owner, "index",
                                ex[i].index, "weight", ex[i].weight);
        if (ex[i].trust) {
            json_object_set_new(row, "kv_events", json_string(ex[i].trust));
            json_object_set_new(row, "kv_blocks", json_integer((json_int_t)ex[i].kv_blocks));
        }
        explain_scores(row, &ex[i]);
        json_array_append_new(rows, row);
    }
    json_t *out = json_pack("{s:s,s:s,s:s?,s:s?,s:f,s:s?,s:I,s:I,s:I,s:o}", "route", rt->name,
                            "policy", rt->ops->name, "decision", pick.decision, "worker",
                            pick.worker ? pick.worker->url : NULL, "match", pick.match, "index",
                            pick.index, "session_key_bytes", (json_int_t)d->keys.k.session_len,
                            "routing_text_bytes", (json_int_t)d->keys.k.text_len,
                            "prompt_tokens", (json_int_t)d->keys.k.ntokens, "workers", rows);
    if (rt->pd && !local)
        json_object_set_new(out, "pd", pd_picks(rt, &pick, &d->keys.k));
    dbg_free(d);
    kvr_admin_reply(r, 200, out);
}

static void dbg_tokens(void *ud, const uint32_t *ids, size_t n, kvr_tokenize_source src)
{
    dbg *d = ud;
    (void)src;
    d->tok = NULL;
    if (ids && n)
        kvr_request_keys_set_tokens(&d->keys, ids, n);
    if (!d->sync)
        dbg_answer(d);
}

static void debug_route(kvr_app *app, kvr_http_req *r)
{
    size_t blen;
    const char *body = kvr_http_req_body(r, &blen);
    json_error_t jerr;
    json_t *j = kvr_json_read(body, blen, &jerr);
    kvr_endpoint ep;
    char msg[300];
    const char *param = NULL;
    if (!j) {
        snprintf(msg, sizeof(msg), "invalid JSON body: %s", jerr.text);
        kvr_admin_reply_error_code(r, 400, msg, NULL, "invalid_json");
        return;
    }
    if (endpoint_of(r, j, &ep) < 0) {
        json_decref(j);
        kvr_admin_reply_error_code(r, 400,
                                   "endpoint must be chat, completions, responses or messages",
                                   "endpoint", "invalid_value");
        return;
    }
    if (kvr_api_validate(j, ep, msg, sizeof(msg), &param)) {
        json_decref(j);
        kvr_admin_reply_error_code(r, 400, msg, param, "invalid_value");
        return;
    }
    kvr_route *rt = kvr_app_route(app, json_string_value(json_object_get(j, "model")));
    if (!rt) {
        json_decref(j);
        kvr_admin_reply_error_code(r, 404, "the body's model names no route", "model",
                                   "model_not_found");
        return;
    }
    dbg *d = calloc(1, sizeof(*d));
    size_t pin_len = 0;
    const char *pin = ep == KVR_EP_RESPONSES ? kvr_route_previous_response_id(j, &pin_len) : NULL;
    if (!d || (pin && !(d->pin = strndup(pin, pin_len))) ||
        kvr_request_keys_build(app, rt, j, ep, r, &d->keys) < 0) {
        json_decref(j);
        if (d)
            dbg_free(d);
        kvr_admin_reply_error(r, 503, "out of memory", NULL, 0);
        return;
    }
    json_decref(j);
    d->app = app;
    d->r = r;
    d->pin_len = pin ? pin_len : 0;
    d->rt = rt;
    kvr_route_ref(rt);
    /* precise needs the prompt's token ids, fetched as the proxy would. */
    if (rt->ops->uses_tokens) {
        kvr_http_req_cbs cbs = {NULL, dbg_gone};
        kvr_http_req_set_cbs(r, &cbs, d);
        d->sync = 1;
        kvr_request_keys_tokenize(app, rt, ep, r, &d->keys, dbg_tokens, d, &d->tok);
        d->sync = 0;
        if (d->tok)
            return;
    }
    dbg_answer(d);
}

/* GET /cluster: the replicas sharing this one's Redis (cluster/cluster.h), or
 * {"enabled": false} without --redis. */
static void cluster(kvr_app *app, kvr_http_req *r)
{
    if (!app->cluster) {
        kvr_admin_reply(r, 200, json_pack("{s:b}", "enabled", 0));
        return;
    }
    json_t *j = kvr_cluster_json(app->cluster);
    json_object_set_new(j, "enabled", json_true());
    kvr_admin_reply(r, 200, j);
}

/* 1 when `method` is one of `allow` ("GET, POST"). */
static int allowed(const char *allow, const char *method)
{
    size_t n = strlen(method);
    for (const char *p = allow; (p = strstr(p, method)); p += n)
        if ((p == allow || p[-1] == ' ') && (p[n] == ',' || p[n] == '\0'))
            return 1;
    return 0;
}

static const struct {
    const char *path;
    int prefix;         /* 1: path is a prefix followed by a non-empty rest */
    const char *allow;  /* its methods, as the Allow header lists them */
    void (*fn)(kvr_app *app, kvr_http_req *r);
} admin_routes[] = {
    {"/workers/", 1, "POST, PATCH, DELETE", kvr_admin_worker},
    {"/workers", 0, "GET, POST", kvr_admin_workers},
    {"/routes", 0, "GET", routes},
    {"/reload", 0, "POST", reload},
    {"/debug/route", 0, "POST", debug_route},
    {"/status", 0, "GET, HEAD", kvr_admin_status},
    {"/cluster", 0, "GET", cluster},
};

void kvr_admin_handle(kvr_http_req *r, void *ud)
{
    kvr_app *app = ud;
    const char *path = kvr_http_req_path(r), *method = kvr_http_req_method(r);
    /* The status page's own files carry no data: served without the token (the page asks
     * for it and sends it with every GET /status). */
    if (kvr_admin_web(r))
        return;
    if (!authorized(r)) {
        kvr_http_header h = {"WWW-Authenticate", 16, "Bearer", 6};
        kvr_admin_reply_error(r, 401, "missing or wrong admin bearer token", &h, 1);
        return;
    }
    for (size_t i = 0; i < sizeof(admin_routes) / sizeof(admin_routes[0]); i++) {
        size_t n = strlen(admin_routes[i].path);
        int match = admin_routes[i].prefix
                        ? strncmp(path, admin_routes[i].path, n) == 0 && path[n]
                        : strcmp(path, admin_routes[i].path) == 0;
        if (!match)
            continue;
        const char *allow = admin_routes[i].allow;
        if (!allowed(allow, method)) {
            kvr_http_header h = {"Allow", 5, allow, strlen(allow)};
            char msg[64];
            snprintf(msg, sizeof(msg), "use %s", allow);
            kvr_admin_reply_error(r, 405, msg, &h, 1);
            return;
        }
        admin_routes[i].fn(app, r);
        return;
    }
    kvr_admin_reply_error(r, 404, "unknown admin path", NULL, 0);
}
