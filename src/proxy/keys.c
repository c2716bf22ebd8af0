/* Routing keys of an inbound request. */
#include "proxy/keys.h"

#include <string.h>

#include "routing/keys.h"

static const char *get_header(void *ctx, const char *name, size_t *len)
{
    const char *v = kvr_http_req_header(ctx, name);
    if (v)
        *len = strlen(v);
    return v;
}

int kvr_request_keys_build(kvr_app *app, const kvr_route *route, const json_t *body,
                           kvr_endpoint ep, kvr_http_req *r, kvr_request_keys *out)
{
    memset(out, 0, sizeof(*out));
    kvr_buf_init(&out->session, 0);
    kvr_buf_init(&out->text, app->cfg.max_routing_text_bytes);
    if (!route->ops->uses_keys)
        return 0;
    int rc = kvr_route_keys_build(body, (kvr_route_kind)ep, get_header, r,
                                  &app->session_sources, &out->text, &out->session);
    if (out->session.len) {
        out->k.session = out->session.data;
        out->k.session_len = out->session.len;
    }
    if (out->text.len) {
        out->k.text = out->text.data;
        out->k.text_len = out->text.len;
    }
    return rc < 0 ? -1 : 0;
}

void kvr_request_keys_free(kvr_request_keys *rk)
{
    kvr_buf_free(&rk->session);
    kvr_buf_free(&rk->text);
    memset(&rk->k, 0, sizeof(rk->k));
}
