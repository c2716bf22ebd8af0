/* Data-plane dispatch by path, then method. */
#include "api/router.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/auth.h"
#include "api/ops.h"
#include "api/validate.h"
#include "app/reply.h"
#include "proxy/proxy.h"
#include "routing/fields.h"
#include "routing/text_scan.h"
#include "util/json_read.h"

typedef enum { R_MODELS, R_HEALTHZ, R_READYZ, R_METRICS } route;

/* GET/HEAD endpoints kvroute answers itself; the proxied ones are routing/keys.h's. */
static const struct {
    const char *path;
    route r;
} routes[] = {
    {"/v1/models", R_MODELS},
    {"/healthz", R_HEALTHZ},
    {"/readyz", R_READYZ},
    {"/metrics", R_METRICS},
};

#define RESPONSES_PREFIX "/v1/responses/"
#define RESPONSES_PREFIX_LEN 14

/* The `endpoint` label of paths that carry an id, or that no endpoint serves: a bounded set
 * of values whatever clients send. NULL: the path itself (an endpoint's fixed path). */
static const char *endpoint_label(const char *path)
{
    kvr_endpoint ep;
    if (kvr_endpoint_find(path, &ep) == 0)
        return NULL;
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++)
        if (strcmp(path, routes[i].path) == 0)
            return NULL;
    if (strncmp(path, "/v1/models/", 11) == 0)
        return "/v1/models/{id}";
    if (strncmp(path, RESPONSES_PREFIX, RESPONSES_PREFIX_LEN) == 0) {
        const char *sub = strchr(path + RESPONSES_PREFIX_LEN, '/');
        if (!sub)
            return "/v1/responses/{id}";
        if (strcmp(sub, "/cancel") == 0)
            return "/v1/responses/{id}/cancel";
        if (strcmp(sub, "/input_items") == 0)
            return "/v1/responses/{id}/input_items";
    }
    return "other";
}

/* The route a request's `model` names (NULL: it sent none), or NULL when no route serves it:
 * the request was then answered (503 while discovery has found nothing yet, 400 without a
 * model when several routes exist, 404 for an unknown model). */
static kvr_route *route_for(kvr_app *app, kvr_http_req *r, const char *model)
{
    kvr_route *route = model ? kvr_app_route(app, model)
                       : app->routes->n == 1 ? app->routes->routes[0] : NULL;
    char msg[300];
    if (route)
        return route;
    if (app->discovering && app->routes->n == 0) {
        /* Discovery has not succeeded yet: a temporary state, not an unknown model. */
        char ra[24];
        snprintf(ra, sizeof(ra), "%llu", (unsigned long long)app->cfg.retry_after_s);
        kvr_http_header h = {"Retry-After", 11, ra, strlen(ra)};
        kvr_reply_error(app, r, NULL, 503,
                        "no model is known yet: no worker has answered /v1/models", NULL,
                        "no_eligible_worker", &h, 1);
    } else if (!model) {
        snprintf(msg, sizeof(msg), "you must provide a model parameter: kvroute serves %zu "
                 "models", app->routes->n);
        kvr_reply_error(app, r, NULL, 400, msg, "model", "invalid_value", NULL, 0);
    } else {
        snprintf(msg, sizeof(msg), "The model '%.200s' does not exist or is not served here",
                 model);
        kvr_reply_error(app, r, NULL, 404, msg, "model", "model_not_found", NULL, 0);
    }
    return NULL;
}

static void invalid_json(kvr_app *app, kvr_http_req *r, const json_error_t *jerr,
                         const char *body, size_t blen)
{
    /* Valid JSON that is no object or array (null, "x", 1): the same answer as for an array,
     * rather than a syntax error the body does not have. A broken object or array is not
     * read again to find that out. */
    size_t i = 0;
    while (i < blen && (body[i] == ' ' || body[i] == '\t' || body[i] == '\r' || body[i] == '\n'))
        i++;
    int scalar = 0;
    if (i < blen && body[i] != '{' && body[i] != '[') {
        json_t *any = json_loadb(body, blen, JSON_DECODE_ANY, NULL);
        scalar = any != NULL;
        json_decref(any);
    }
    if (scalar) {
        kvr_reply_error(app, r, NULL, 400, "the request body must be a JSON object", NULL,
                        "invalid_value", NULL, 0);
        return;
    }
    char msg[300];
    snprintf(msg, sizeof(msg), "invalid JSON body: %s (line %d, column %d)", jerr->text,
             jerr->line, jerr->column);
    kvr_reply_error(app, r, NULL, 400, msg, NULL, "invalid_json", NULL, 0);
}

/* 1 when whichever route the request names builds its routing text from the body's tree
 * (every route's policy reads the text, whatever the session: cache_aware, precise,
 * pipeline, cost): the body is then read into the tree at once, instead of scanned first
 * and read again. Chat and completions never need it: their text comes from the scan
 * (routing/text_scan.h). count_tokens builds no keys. */
static int tree_needed(const kvr_app *app, kvr_endpoint ep)
{
    if (ep == KVR_EP_COUNT_TOKENS || ep == KVR_EP_CHAT || ep == KVR_EP_COMPLETIONS ||
        app->routes->n == 0)
        return 0;
    for (size_t i = 0; i < app->routes->n; i++) {
        const kvr_policy_ops *ops = app->routes->routes[i]->ops;
        if (!ops->uses_keys || ops->text_without_session)
            return 0;
    }
    return 1;
}

/* A proxied endpoint whose route will need the tree: read, validate, route, forward. */
static void proxied_tree(kvr_app *app, kvr_http_req *r, kvr_endpoint ep, const char *body,
                         size_t blen)
{
    json_error_t jerr;
    json_t *j = kvr_json_read(body, blen, &jerr);
    char msg[300];
    if (!j) {
        invalid_json(app, r, &jerr, body, blen);
        return;
    }
    const char *param = NULL;
    if (kvr_api_validate(j, ep, msg, sizeof(msg), &param)) {
        json_decref(j);
        kvr_reply_error(app, r, NULL, 400, msg, param, "invalid_value", NULL, 0);
        return;
    }
    kvr_route *route = route_for(app, r, json_string_value(json_object_get(j, "model")));
    if (route) {
        kvr_proxy_body b = {NULL, j};
        kvr_proxy_forward(app, r, ep, route, &b);
    }
    json_decref(j);
}

/* The kept messages, offered to a chat body's scan (kvr_text_cache_known): most messages of
 * a conversation's next turn are then taken as accepted before (found by hash) instead of
 * validated again. Routes that read routing texts keep them with their texts; the others
 * keep them without (kvr_text_cache_accept, in proxied()). */
static const kvr_json_known *known_messages(kvr_app *app, kvr_endpoint ep, kvr_json_known *kn)
{
    if (ep != KVR_EP_CHAT)
        return NULL;
    return kvr_text_cache_known(app->text_cache, kn) ? kn : NULL;
}

/* A proxied endpoint: scan and validate the body once (no tree: routing/fields.h), find the
 * route its `model` names, and hand the request to the proxy, which builds the routing text
 * when the route's policy reads it: from the scan for chat and completions, else from a
 * tree. */
static void proxied(kvr_app *app, kvr_http_req *r, kvr_endpoint ep)
{
    size_t blen;
    const char *body = kvr_http_req_body(r, &blen);
    if (tree_needed(app, ep)) {
        proxied_tree(app, r, ep, body, blen);
        return;
    }
    kvr_body_fields f;
    char msg[300];
    kvr_json_known kn;
    if (kvr_body_fields_scan_known(&f, body, blen, &app->session_sources,
                                   known_messages(app, ep, &kn)) < 0) {
        /* Not JSON: the reader says why and where, in the wording clients have seen. */
        json_error_t jerr;
        json_t *j = kvr_json_read(body, blen, &jerr);
        if (j) { /* cannot happen (same acceptance); answer as before if it ever does */
            json_decref(j);
            snprintf(jerr.text, sizeof(jerr.text), "invalid JSON");
        }
        invalid_json(app, r, &jerr, body, blen);
        return;
    }
    const char *param = NULL;
    if (kvr_api_validate_fields(&f, ep, msg, sizeof(msg), &param)) {
        kvr_reply_error(app, r, NULL, 400, msg, param, "invalid_value", NULL, 0);
        return;
    }
    char *model = NULL;
    if (kvr_body_strdup(&f, KVR_FIELD_MODEL, &model, NULL) < 0) {
        kvr_reply_error(app, r, NULL, 503, "out of memory", NULL, NULL, NULL, 0);
        return;
    }
    kvr_route *route = route_for(app, r, model);
    free(model);
    if (route && ep == KVR_EP_CHAT && !route->ops->uses_keys) {
        size_t n;
        const kvr_json_elem *msgs = kvr_body_messages(&f, &n);
        kvr_text_cache_accept(app->text_cache, body, msgs, n);
    }
    if (route) {
        kvr_proxy_body b = {&f, NULL};
        kvr_proxy_forward(app, r, ep, route, &b);
    }
}

/* A stored response's id as workers make them (OpenAI's "resp_…"): URL-safe characters
 * only, so the path forwarded to the worker names exactly that resource. */
static int response_id_ok(const char *id, size_t n)
{
    if (n == 0 || n > 256 || (id[0] == '.' && (n == 1 || (n == 2 && id[1] == '.'))))
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)id[i]) && !strchr("-._~", id[i]))
            return 0;
    return 1;
}

/* GET and DELETE /v1/responses/{id}, POST /v1/responses/{id}/cancel, GET
 * /v1/responses/{id}/input_items: to the worker that stored the response, found in the pins
 * of every route since these requests name no model. */
static void stored_response(kvr_app *app, kvr_http_req *r, const char *path,
                            const char *method)
{
    const char *id = path + RESPONSES_PREFIX_LEN, *sub = strchr(id, '/');
    size_t n = sub ? (size_t)(sub - id) : strlen(id);
    const char *allow = !sub ? "GET, DELETE"
                        : strcmp(sub, "/cancel") == 0 ? "POST"
                        : strcmp(sub, "/input_items") == 0 ? "GET"
                                                             : NULL;
    if (!allow) {
        kvr_reply_error(app, r, NULL, 404, "unknown path", NULL, "not_found", NULL, 0);
        return;
    }
    if (!strstr(allow, method)) {
        kvr_http_header h = {"Allow", 5, allow, strlen(allow)};
        kvr_reply_error(app, r, NULL, 405, "method not allowed for this endpoint", NULL,
                        "method_not_allowed", &h, 1);
        return;
    }
    for (size_t i = 0; response_id_ok(id, n) && i < app->routes->n; i++) {
        kvr_route *rt = app->routes->routes[i];
        size_t wid;
        kvr_worker *w;
        if (kvr_route_find_response(rt, id, n, &wid) &&
            (w = kvr_registry_get(app->reg, wid)) && kvr_route_target_of(rt, w)) {
            kvr_proxy_forward_pinned(app, r, rt, w);
            return;
        }
    }
    char msg[320];
    snprintf(msg, sizeof(msg), "Response with id '%.*s' not found.", (int)(n > 200 ? 200 : n),
             id);
    kvr_reply_error(app, r, NULL, 404, msg, NULL, NULL, NULL, 0);
}

/* Client keys guard every /v1/ path (and /metrics with --metrics-require-key); /healthz and /readyz
 * stay open for load balancers. Returns 1 when the request may go on (its tag then names the
 * key), 0 when it was answered 401. */
static int authenticated(kvr_app *app, kvr_http_req *r, const char *path)
{
    kvr_http_req_set_tag(r, "-");
    kvr_endpoint ep;
    int guarded = strncmp(path, "/v1/", 4) == 0 || kvr_endpoint_find(path, &ep) == 0 ||
                  (app->cfg.metrics_require_key && strcmp(path, "/metrics") == 0);
    if (!app->auth || !guarded)
        return 1;
    const char *name = NULL;
    kvr_auth_result res = kvr_auth_check(app->auth, r, &name);
    if (res == KVR_AUTH_OK) {
        kvr_http_req_set_tag(r, name);
        return 1;
    }
    const char *lv[] = {kvr_auth_reason(res)};
    kvr_metric_inc(app->m.auth_failures, lv, 1);
    kvr_http_header h = {"WWW-Authenticate", 16, "Bearer", 6};
    kvr_reply_error_typed(app, r, NULL, 401,
                          res == KVR_AUTH_MISSING
                              ? "Missing API key: send it as Authorization: Bearer KEY or "
                                "x-api-key: KEY"
                              : "Incorrect API key provided",
                          "invalid_request_error", NULL, "invalid_api_key", &h, 1);
    return 0;
}

void kvr_api_handle(kvr_http_req *r, void *ud)
{
    kvr_app *app = ud;
    const char *path = kvr_http_req_path(r), *method = kvr_http_req_method(r);
    kvr_http_req_set_endpoint(r, endpoint_label(path));
    if (!authenticated(app, r, path))
        return;
    kvr_endpoint ep;
    if (kvr_endpoint_find(path, &ep) == 0) {
        if (strcmp(method, "POST") == 0) {
            proxied(app, r, ep);
            return;
        }
        kvr_http_header allow = {"Allow", 5, "POST", 4};
        kvr_reply_error(app, r, NULL, 405, "method not allowed for this endpoint", NULL,
                        "method_not_allowed", &allow, 1);
        return;
    }
    int get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
        if (strcmp(path, routes[i].path) != 0)
            continue;
        if (!get) {
            kvr_http_header allow = {"Allow", 5, "GET, HEAD", 9};
            kvr_reply_error(app, r, NULL, 405, "method not allowed for this endpoint", NULL,
                            "method_not_allowed", &allow, 1);
            return;
        }
        switch (routes[i].r) {
        case R_MODELS:
            kvr_api_models(app, r);
            return;
        case R_HEALTHZ:
            kvr_api_healthz(app, r);
            return;
        case R_READYZ:
            kvr_api_readyz(app, r);
            return;
        case R_METRICS:
            kvr_api_metrics(app, r);
            return;
        }
    }
    if (strncmp(path, "/v1/models/", 11) == 0 && get) {
        kvr_api_model(app, r, path + 11);
        return;
    }
    if (strncmp(path, RESPONSES_PREFIX, RESPONSES_PREFIX_LEN) == 0) {
        stored_response(app, r, path, method);
        return;
    }
    /* Unknown paths, /v1/ ones included, are never forwarded: a worker may serve more than
     * kvroute can route or guard. */
    kvr_reply_error(app, r, NULL, 404, "unknown path", NULL, "not_found", NULL, 0);
}
