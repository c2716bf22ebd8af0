/* http_parser glue: one request at a time. Header names, values and the target arrive in
 * fragments (a read can end anywhere), so they are copied into the request's header buffer
 * and only turned into pointers once the headers are complete. The parser is paused in
 * on_message_complete so the bytes after a request (pipelining) stay with the connection.
 *
 * Three checks http_parser's non-strict build skips are added here: header-name bytes must be
 * tchar (it accepts "Content-Length : 2"), a header value's first byte must not be a control
 * byte (it checks only the bytes after it), and the two bytes after each chunk's data must be
 * CRLF (it consumes any two bytes there). */
#include <stdlib.h>
#include <string.h>

#include "http/internal.h"
#include "util/time.h"

static kvr_http_conn *conn_of(http_parser *p)
{
    return p->data;
}

static int fail(kvr_http_conn *c, int status, const char *msg)
{
    if (!c->err_status) {
        c->err_status = status;
        c->err_msg = msg;
    }
    return -1;
}

static int oom(kvr_http_conn *c)
{
    return fail(c, 503, "out of memory");
}

void kvr_http__parse_reset(kvr_http_conn *c)
{
    kvr_http_req *r = &c->req;
    http_parser_init(&c->parser, HTTP_REQUEST);
    c->parser.data = c;
    c->scan_state = KVR_HTTP_SCAN_PRE;
    c->scan_first = 0;
    c->scan_bytes = c->scan_lines = 0;
    c->hs = 0;
    c->headers_done = 0;
    c->trailer_bytes = 0;
    c->chunk_left = 0;
    c->chunk_data_done = 0;
    c->crlf_expect = 0;
    c->expect_continue = 0;
    c->err_status = 0;
    c->err_msg = NULL;
    kvr_buf_reset(&r->hbuf);
    if (c->srv) /* NULL once the server is gone and only a handler-owned request remains */
        c->srv->body_total -= r->body_held;
    r->body_held = 0;
    if (r->body.alloc > KVR_HTTP_KEEP_ALLOC)
        kvr_buf_free(&r->body);
    kvr_buf_reset(&r->body);
    r->nhdrs = 0;
    r->target_len = r->path_off = 0;
    r->method = "";
    r->minor = 1;
    r->keep_alive = 0;
    r->head = 0;
    r->start_ns = 0;
    memset(&r->cbs, 0, sizeof(r->cbs));
    r->cbs_ud = NULL;
    r->tag = NULL;
    r->endpoint = NULL;
    r->gone = r->gone_told = r->started = r->want_drain = 0;
    r->framing = KVR_HTTP_F_NONE;
    r->close_after = 0;
    r->resp_len = -1;
    r->resp_sent = 0;
}

/* Checks the CRLF that must follow chunk data against the bytes in [q, end). */
static int crlf_check(kvr_http_conn *c, const char *q, const char *end)
{
    while (c->crlf_expect && q < end) {
        if (*q != (c->crlf_expect == 2 ? '\r' : '\n'))
            return -1;
        q++;
        c->crlf_expect--;
    }
    return 0;
}

static int on_message_begin(http_parser *p)
{
    kvr_http_conn *c = conn_of(p);
    c->state = KVR_HTTP_C_HEADERS;
    c->req.start_ns = kvr_now_ns();
    /* Absolute deadline from the first byte: re-armed by nothing until the headers end, so a
     * 1-byte-per-second trickle cannot keep the connection (reference B.1 timeouts). */
    kvr_http__arm_timer(c, c->srv->lim.header_timeout_ms);
    return 0;
}

static int on_url(http_parser *p, const char *at, size_t len)
{
    kvr_http_conn *c = conn_of(p);
    if (c->req.target_len == 0 && !kvr_http__method_allowed(p->method))
        return fail(c, 501, "method not implemented");
    if (kvr_buf_append(&c->req.hbuf, at, len) < 0)
        return oom(c);
    c->req.target_len += (uint32_t)len;
    return 0;
}

static int end_target(kvr_http_conn *c)
{
    kvr_http_req *r = &c->req;
    if (kvr_buf_append(&r->hbuf, "", 1) < 0)
        return oom(c);
    const char *q = memchr(r->hbuf.data, '?', r->target_len);
    uint32_t plen = q ? (uint32_t)(q - r->hbuf.data) : r->target_len;
    r->path_off = (uint32_t)r->hbuf.len;
    /* Copy of the path so that both it and the target are NUL-terminated. The source lives in
     * the buffer being appended to, which may move: copy through a bounce buffer. */
    char tmp[256];
    for (uint32_t i = 0; i < plen;) {
        uint32_t n = plen - i < sizeof(tmp) ? plen - i : (uint32_t)sizeof(tmp);
        memcpy(tmp, r->hbuf.data + i, n);
        if (kvr_buf_append(&r->hbuf, tmp, n) < 0)
            return oom(c);
        i += n;
    }
    if (kvr_buf_append(&r->hbuf, "", 1) < 0)
        return oom(c);
    return 0;
}

static int end_value(kvr_http_conn *c)
{
    kvr_http_req *r = &c->req;
    kvr_http_hoff *h = &r->offs[r->nhdrs - 1];
    /* http_parser drops leading OWS but keeps trailing OWS (RFC 9110 5.5 excludes both). */
    while (h->value_len && (r->hbuf.data[r->hbuf.len - 1] == ' ' ||
                            r->hbuf.data[r->hbuf.len - 1] == '\t')) {
        h->value_len--;
        r->hbuf.len--;
    }
    return kvr_buf_append(&r->hbuf, "", 1) < 0 ? oom(c) : 0;
}

static int new_header(kvr_http_conn *c)
{
    kvr_http_req *r = &c->req;
    size_t max = c->srv->lim.max_headers;
    if (r->nhdrs >= max)
        return fail(c, 431, "too many request header lines");
    if (r->nhdrs == r->hcap) {
        size_t n = r->hcap ? r->hcap * 2 : 16;
        if (n > max)
            n = max;
        kvr_http_hoff *o = realloc(r->offs, n * sizeof(*o));
        if (!o)
            return oom(c);
        r->offs = o;
        kvr_http_header *h = realloc(r->hdrs, n * sizeof(*h));
        if (!h)
            return oom(c);
        r->hdrs = h;
        r->hcap = n;
    }
    kvr_http_hoff *h = &r->offs[r->nhdrs++];
    h->name_off = (uint32_t)r->hbuf.len;
    h->name_len = h->value_off = h->value_len = 0;
    return 0;
}

/* Trailer fields (after a chunked body) are read and dropped; their bytes count against
 * max_header_bytes so that they cannot stream forever. */
static int trailer_bytes(kvr_http_conn *c, size_t len)
{
    c->trailer_bytes += len;
    if (c->trailer_bytes > c->srv->lim.max_header_bytes)
        return fail(c, 431, "request trailers exceed the size limit");
    return 0;
}

static int on_header_field(http_parser *p, const char *at, size_t len)
{
    kvr_http_conn *c = conn_of(p);
    kvr_http_req *r = &c->req;
    if (c->headers_done)
        return trailer_bytes(c, len);
    if (c->hs != 1) {
        if (c->hs == 0 ? end_target(c) : end_value(c))
            return -1;
        if (p->http_major != 1 || p->http_minor > 1)
            return fail(c, 505, "only HTTP/1.0 and HTTP/1.1 are supported");
        if (new_header(c))
            return -1;
        c->hs = 1;
    }
    if (!kvr_http_is_token(at, len))
        return fail(c, 400, "invalid character in a header name");
    if (kvr_buf_append(&r->hbuf, at, len) < 0)
        return oom(c);
    r->offs[r->nhdrs - 1].name_len += (uint32_t)len;
    return 0;
}

static int on_header_value(http_parser *p, const char *at, size_t len)
{
    kvr_http_conn *c = conn_of(p);
    kvr_http_req *r = &c->req;
    if (c->headers_done)
        return trailer_bytes(c, len);
    kvr_http_hoff *h = &r->offs[r->nhdrs - 1];
    if (c->hs == 1) {
        /* http_parser checks every value byte except the first (2.9.4 s_header_value_start
         * takes it unchecked), so "X: \0..." or "X: \x7f" would reach the handler and the
         * upstream; this call's first byte is the value's first byte. */
        unsigned char ch = len ? (unsigned char)at[0] : ' ';
        if ((ch < 0x20 && ch != '\t') || ch == 0x7f)
            return fail(c, 400, "invalid character in a header value");
        if (kvr_buf_append(&r->hbuf, "", 1) < 0)
            return oom(c);
        h->value_off = (uint32_t)r->hbuf.len;
        c->hs = 2;
    }
    if (kvr_buf_append(&r->hbuf, at, len) < 0)
        return oom(c);
    h->value_len += (uint32_t)len;
    return 0;
}

static int on_headers_complete(http_parser *p)
{
    kvr_http_conn *c = conn_of(p);
    kvr_http_req *r = &c->req;
    if (c->hs == 0 ? end_target(c) : c->hs == 2 ? end_value(c) : 0)
        return -1;
    c->headers_done = 1;
    for (size_t i = 0; i < r->nhdrs; i++) {
        const kvr_http_hoff *o = &r->offs[i];
        r->hdrs[i] = (kvr_http_header){r->hbuf.data + o->name_off, o->name_len,
                                       r->hbuf.data + o->value_off, o->value_len};
        if (o->value_off == 0) /* name without a value callback: empty value */
            r->hdrs[i].value = "";
    }
    r->method = http_method_str((enum http_method)p->method);
    r->minor = p->http_minor;
    r->head = p->method == HTTP_HEAD;
    const char *msg = NULL;
    int st = kvr_http__validate(c, &msg);
    if (st)
        return fail(c, st, msg);
    r->keep_alive = http_should_keep_alive(p);
    int has_body = (p->flags & F_CHUNKED) ||
                   ((p->flags & F_CONTENTLENGTH) && p->content_length > 0);
    if (has_body && !(p->flags & F_CHUNKED)) { /* validated: within --max-body-bytes */
        size_t n = (size_t)p->content_length;
        if (n > c->srv->lim.max_total_body_bytes - c->srv->body_total)
            return fail(c, 503, "too many request body bytes held at once; retry later");
        c->srv->body_total += n;
        r->body_held = n;
    }
    if (has_body) {
        c->state = KVR_HTTP_C_BODY;
        kvr_http__arm_timer(c, c->srv->lim.body_timeout_ms);
        if (c->expect_continue) {
            static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
            if (kvr_http__queue(c, cont, sizeof(cont) - 1) < 0)
                return oom(c);
        }
    }
    return 0;
}

static int on_body(http_parser *p, const char *at, size_t len)
{
    kvr_http_conn *c = conn_of(p);
    kvr_http_req *r = &c->req;
    if (len > c->srv->lim.max_body_bytes - r->body.len)
        return fail(c, 413, "request body is larger than the limit");
    int chunked = (p->flags & F_CHUNKED) != 0; /* else held since the headers */
    if (chunked && len > c->srv->lim.max_total_body_bytes - c->srv->body_total)
        return fail(c, 503, "too many request body bytes held at once; retry later");
    if (kvr_buf_append(&r->body, at, len) < 0)
        return oom(c);
    if (chunked) {
        c->srv->body_total += len;
        r->body_held += len;
        c->chunk_left -= len < c->chunk_left ? len : c->chunk_left;
        if (c->chunk_left == 0 && !c->chunk_data_done) {
            c->chunk_data_done = 1;
            c->crlf_expect = 2;
            if (crlf_check(c, at + len, c->slice_end) < 0)
                return fail(c, 400, "chunk data not followed by CRLF");
        }
    }
    return 0;
}

static int on_chunk_header(http_parser *p)
{
    kvr_http_conn *c = conn_of(p);
    c->chunk_left = p->content_length;
    c->chunk_data_done = 0;
    return 0;
}

static int on_message_complete(http_parser *p)
{
    kvr_http_conn *c = conn_of(p);
    kvr_http__stop_timer(c);
    http_parser_pause(p, 1);
    return 0;
}

const http_parser_settings kvr_http__settings = {
    .on_message_begin = on_message_begin,
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
    .on_chunk_header = on_chunk_header,
};

static int map_errno(const kvr_http_conn *c, enum http_errno e, const char **msg)
{
    *msg = http_errno_description(e);
    switch (e) {
    case HPE_HEADER_OVERFLOW:
        return 431;
    case HPE_INVALID_CONTENT_LENGTH:
        if (c->headers_done) /* http_parser reports a chunk-size overflow this way */
            *msg = "invalid chunk size";
        return 400;
    case HPE_INVALID_METHOD:
        *msg = "invalid request method";
        return 400;
    default:
        return 400;
    }
}

size_t kvr_http__execute(kvr_http_conn *c, const char *p, size_t n, int *res)
{
    *res = 0;
    if (c->scan_state != KVR_HTTP_SCAN_DONE) {
        int st = kvr_http__scan(c, p, n);
        if (st) {
            c->err_status = st;
            *res = -1;
            return 0;
        }
    }
    if (c->crlf_expect && crlf_check(c, p, p + n) < 0) {
        fail(c, 400, "chunk data not followed by CRLF");
        *res = -1;
        return 0;
    }
    c->slice_end = p + n;
    size_t k = http_parser_execute(&c->parser, &kvr_http__settings, p, n);
    enum http_errno e = HTTP_PARSER_ERRNO(&c->parser);
    if (e == HPE_PAUSED) {
        *res = 1;
        return k;
    }
    if (e != HPE_OK || c->err_status) {
        if (!c->err_status) {
            const char *msg;
            int st = map_errno(c, e, &msg);
            fail(c, st, msg);
        }
        *res = -1;
    }
    return k;
}
