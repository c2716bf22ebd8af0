/* Read-only accessors of a request handed to the handler, and its callbacks. */
#include <string.h>
#include <strings.h>

#include "http/internal.h"

const char *kvr_http_req_method(const kvr_http_req *r)
{
    return r->method;
}

const char *kvr_http_req_path(const kvr_http_req *r)
{
    return r->hbuf.data + r->path_off;
}

const char *kvr_http_req_target(const kvr_http_req *r)
{
    return r->hbuf.data;
}

int kvr_http_req_minor_version(const kvr_http_req *r)
{
    return r->minor;
}

const char *kvr_http_req_body(const kvr_http_req *r, size_t *len)
{
    if (len)
        *len = r->body.len;
    return r->body.data ? r->body.data : "";
}

void kvr_http_req_set_tag(kvr_http_req *r, const char *tag)
{
    r->tag = tag;
}

const char *kvr_http_req_tag(const kvr_http_req *r)
{
    return r->tag;
}

void kvr_http_req_set_endpoint(kvr_http_req *r, const char *endpoint)
{
    r->endpoint = endpoint;
}

const char *kvr_http_req_endpoint(const kvr_http_req *r)
{
    return r->endpoint ? r->endpoint : kvr_http_req_path(r);
}

void kvr_http_req_release_body(kvr_http_req *r)
{
    if (r->conn && r->conn->srv)
        r->conn->srv->body_total -= r->body_held;
    r->body_held = 0;
    kvr_buf_free(&r->body);
}

size_t kvr_http_req_header_count(const kvr_http_req *r)
{
    return r->nhdrs;
}

const kvr_http_header *kvr_http_req_header_at(const kvr_http_req *r, size_t i)
{
    return i < r->nhdrs ? &r->hdrs[i] : NULL;
}

const char *kvr_http_req_header(const kvr_http_req *r, const char *name)
{
    size_t n = strlen(name);
    for (size_t i = 0; i < r->nhdrs; i++) {
        const kvr_http_header *h = &r->hdrs[i];
        if (h->name_len == n && strncasecmp(h->name, name, n) == 0)
            return h->value;
    }
    return NULL;
}

const char *kvr_http_req_peer(const kvr_http_req *r)
{
    return r->conn->peer;
}

uint64_t kvr_http_req_start_ns(const kvr_http_req *r)
{
    return r->start_ns;
}

void kvr_http_req_set_cbs(kvr_http_req *r, const kvr_http_req_cbs *cbs, void *ud)
{
    if (cbs)
        r->cbs = *cbs;
    else
        memset(&r->cbs, 0, sizeof(r->cbs));
    r->cbs_ud = ud;
}

int kvr_http_req_client_gone(const kvr_http_req *r)
{
    return r->gone;
}
