/* Data-plane dispatch by path, then method. */
#include "api/router.h"

#include <string.h>

#include "api/errors.h"
#include "api/ops.h"
#include "proxy/proxy.h"

typedef enum { R_CHAT, R_COMPLETIONS, R_RESPONSES, R_MODELS, R_HEALTHZ, R_READYZ, R_METRICS } route;

static const struct {
    const char *path;
    route r;
    int post; /* 1: POST only; 0: GET/HEAD only */
} routes[] = {
    {"/v1/chat/completions", R_CHAT, 1}, {"/v1/completions", R_COMPLETIONS, 1},
    {"/v1/responses", R_RESPONSES, 1},   {"/v1/models", R_MODELS, 0},
    {"/healthz", R_HEALTHZ, 0},          {"/readyz", R_READYZ, 0},
    {"/metrics", R_METRICS, 0},
};

void kvr_api_handle(kvr_http_req *r, void *ud)
{
    kvr_app *app = ud;
    const char *path = kvr_http_req_path(r), *method = kvr_http_req_method(r);
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
        if (strcmp(path, routes[i].path) != 0)
            continue;
        int ok = routes[i].post ? strcmp(method, "POST") == 0
                                : (strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0);
        if (!ok) {
            kvr_http_header allow = {"Allow", 5, routes[i].post ? "POST" : "GET, HEAD",
                                     routes[i].post ? 4 : 9};
            kvr_api_error(app, r, NULL, 405, "method not allowed for this endpoint", NULL,
                          "method_not_allowed", &allow, 1);
            return;
        }
        switch (routes[i].r) {
        case R_CHAT:
            kvr_proxy_handle(app, r, KVR_EP_CHAT);
            return;
        case R_COMPLETIONS:
            kvr_proxy_handle(app, r, KVR_EP_COMPLETIONS);
            return;
        case R_RESPONSES:
            kvr_proxy_handle(app, r, KVR_EP_RESPONSES);
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
    kvr_api_error(app, r, NULL, 404, "unknown path", NULL, "not_found", NULL, 0);
}
