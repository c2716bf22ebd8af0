/* The public kvr_upstream interface over the two clients (impl.h): the native HTTP/1.1 client
 * serves http:// URLs unless the options ask for libcurl (--upstream-client curl); libcurl
 * serves https:// (TLS) and URLs with userinfo always. One kvr_upstream instance serves every
 * caller of the process (proxy attempts, health checks, scrapes, discovery, /tokenize calls,
 * LMCache polls, OTLP export), so --upstream-client switches them all; an attempt handle
 * carries which client owns it, and nothing outside src/upstream knows. */
#include <stdlib.h>

#include "upstream/impl.h"

struct kvr_upstream {
    uv_loop_t *loop;
    kvr_upc *curl;   /* always there (https://) */
    kvr_upn *native; /* NULL with --upstream-client curl */
};

kvr_upstream *kvr_upstream_new(uv_loop_t *loop, const kvr_upstream_opts *opts)
{
    kvr_upstream_opts o;
    if (opts)
        o = *opts;
    else
        kvr_upstream_opts_default(&o);
    kvr_upstream *u = calloc(1, sizeof(*u));
    if (!u)
        abort();
    u->loop = loop;
    u->curl = kvr_upc_new(loop, &o);
    if (o.client == KVR_UP_CLIENT_NATIVE)
        u->native = kvr_upn_new(loop, &o);
    return u;
}

void kvr_upstream_close(kvr_upstream *u)
{
    if (u->native)
        kvr_upn_close(u->native);
    kvr_upc_close(u->curl);
    free(u);
}

kvr_upstream_attempt *kvr_upstream_start(kvr_upstream *u, const char *method, const char *url,
                                         const kvr_http_header *h, size_t n, const char *body,
                                         size_t len, const kvr_upstream_cbs *cbs, void *ud)
{
    if (u->native && kvr_upn_serves(url))
        return kvr_upn_start(u->native, method, url, h, n, body, len, cbs, ud);
    return kvr_upc_start(u->curl, method, url, h, n, body, len, cbs, ud);
}

void kvr_upstream_resume(kvr_upstream_attempt *a)
{
    if (!a)
        return;
    if (a->native)
        kvr_upn_resume(a);
    else
        kvr_upc_resume(a);
}

void kvr_upstream_cancel(kvr_upstream_attempt *a)
{
    if (!a)
        return;
    if (a->native)
        kvr_upn_cancel(a);
    else
        kvr_upc_cancel(a);
}

int kvr_upstream_body_sent(kvr_upstream_attempt *a, size_t len)
{
    return a->native ? kvr_upn_body_sent(a, len) : kvr_upc_body_sent(a, len);
}

size_t kvr_upstream_active(const kvr_upstream *u)
{
    return kvr_upc_active(u->curl) + (u->native ? kvr_upn_active(u->native) : 0);
}

uv_loop_t *kvr_upstream_loop(const kvr_upstream *u)
{
    return u->loop;
}
