/* Data-plane dispatch by path, then method. */
#include "api/router.h"

#include <string.h>

#include <stdio.h>

#include "api/auth.h"
#include "api/ops.h"
#include "api/validate.h"
#include "app/reply.h"
#include "proxy/proxy.h"
#include "util/json_read.h"

typedef enum {
    R_CHAT, R_COMPLETIONS, R_RESPONSES, R_MESSAGES, R_COUNT_TOKENS, R_MODELS, R_HEALTHZ,
    R_READYZ, R_METRICS
} route;

static const struct {
    const char *path;
    route r;
    int post; /* 1: POST only; 0: GET/HEAD only */
} routes[] = {
    {"/v1/chat/completions", R_CHAT, 1}, {"/v1/completions", R_COMPLETIONS, 1},
    {"/v1/responses", R_RESPONSES, 1},   {"/v1/messages", R_MESSAGES, 1},
    {"/v1/messages/count_tokens", R_COUNT_TOKENS, 1}, {"/v1/models", R_MODELS, 0},
    {"/healthz", R_HEALTHZ, 0},          {"/readyz", R_READYZ, 0},
    {"/metrics", R_METRICS, 0},
};

/* A proxied endpoint: parse and validate the body once, find the route its `model` names,
 * and hand the request to the proxy. */
static void proxied(kvr_app *app, kvr_http_req *r, kvr_endpoint ep)
{
    size_t blen;
    const char *body = kvr_http_req_body(r, &blen);
    json_error_t jerr;
    json_t *j = kvr_json_read(body, blen, &jerr);
    char msg[300];
    if (!j) {
        snprintf(msg, sizeof(msg), "invalid JSON body: %s (line %d, column %d)", jerr.text,
                 jerr.line, jerr.column);
        kvr_reply_error(app, r, NULL, 400, msg, NULL, "invalid_json", NULL, 0);
        return;
    }
    const char *param = NULL;
    if (kvr_api_validate(j, ep, msg, sizeof(msg), &param)) {
        json_decref(j);
        kvr_reply_error(app, r, NULL, 400, msg, param, "invalid_value", NULL, 0);
        return;
    }
    const char *model = json_string_value(json_object_get(j, "model"));
    kvr_route *route = kvr_app_route(app, model);
    if (!route && app->discovering && app->routes->n == 0) {
        /* Discovery has not succeeded yet: a temporary state, not an unknown model. */
        char ra[24];
        snprintf(ra, sizeof(ra), "%llu", (unsigned long long)app->cfg.retry_after_s);
        kvr_http_header h = {"Retry-After", 11, ra, strlen(ra)};
        json_decref(j);
        kvr_reply_error(app, r, NULL, 503,
                        "no model is known yet: no worker has answered /v1/models", NULL,
                        "no_eligible_worker", &h, 1);
        return;
    }
    if (!route) {
        snprintf(msg, sizeof(msg), "The model '%.200s' does not exist or is not served here",
                 model);
        json_decref(j);
        kvr_reply_error(app, r, NULL, 404, msg, "model", "model_not_found", NULL, 0);
        return;
    }
    kvr_proxy_forward(app, r, ep, route, j);
    json_decref(j);
}

/* Client keys guard every /v1/ path (and /metrics with --metrics-require-key); /healthz and /readyz
 * stay open for load balancers. Returns 1 when the request may go on (its tag then names the
 * key), 0 when it was answered 401. */
static int authenticated(kvr_app *app, kvr_http_req *r, const char *path)
{
    kvr_http_req_set_tag(r, "-");
    int guarded = strncmp(path, "/v1/", 4) == 0 ||
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
    if (!authenticated(app, r, path))
        return;
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
        if (strcmp(path, routes[i].path) != 0)
            continue;
        int ok = routes[i].post ? strcmp(method, "POST") == 0
                                : (strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0);
        if (!ok) {
            kvr_http_header allow = {"Allow", 5, routes[i].post ? "POST" : "GET, HEAD",
                                     routes[i].post ? 4 : 9};
            kvr_reply_error(app, r, NULL, 405, "method not allowed for this endpoint", NULL,
                          "method_not_allowed", &allow, 1);
            return;
        }
        switch (routes[i].r) {
        case R_CHAT:
            proxied(app, r, KVR_EP_CHAT);
            return;
        case R_COMPLETIONS:
            proxied(app, r, KVR_EP_COMPLETIONS);
            return;
        case R_RESPONSES:
            proxied(app, r, KVR_EP_RESPONSES);
            return;
        case R_MESSAGES:
            proxied(app, r, KVR_EP_MESSAGES);
            return;
        case R_COUNT_TOKENS:
            proxied(app, r, KVR_EP_COUNT_TOKENS);
            return;
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
    if (strncmp(path, "/v1/models/", 11) == 0 &&
        (strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0)) {
        kvr_api_model(app, r, path + 11);
        return;
    }
    kvr_reply_error(app, r, NULL, 404, "unknown path", NULL, "not_found", NULL, 0);
}
