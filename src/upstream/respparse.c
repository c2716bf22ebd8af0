/* http_parser in response mode behind a pull interface (see respparse.h). Every event pauses
 * the parser from inside its callback (http_parser_pause), so http_parser_execute() returns
 * the bytes consumed up to that event and the next call continues from there: the pause
 * contract of http_parser 2.9.4 (README "Pausing"; a paused data callback returns with its
 * bytes consumed, a paused final Content-Length piece leaves its last byte to be fed again,
 * which then completes the message). */
#include "upstream/respparse.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

static int is_ows(char c)
{
    return c == ' ' || c == '\t';
}

static kvr_resp *R(http_parser *p)
{
    return p->data;
}

static void stop(http_parser *p, kvr_resp_ev ev)
{
    R(p)->ev = (int)ev;
    http_parser_pause(p, 1);
}

static int grow(kvr_resp *r)
{
    if (r->nhdrs < r->hcap)
        return 0;
    size_t n = r->hcap ? r->hcap * 2 : 16;
    kvr_http_header *h = realloc(r->hdrs, n * sizeof(*h));
    if (!h)
        return -1;
    r->hdrs = h;
    size_t *o = realloc(r->hoff, n * sizeof(*o));
    if (!o)
        return -1;
    r->hoff = o;
    r->hcap = n;
    return 0;
}

static int fail(kvr_resp *r, const char *why)
{
    r->failed = 1;
    r->err = why;
    return -1; /* a nonzero callback result: http_parser stops with HPE_CB_* */
}

/* A name arrives in fragments (reads split it); so does a value. The value follows its name
 * directly in `head`, so one offset per header is enough. */
static int on_header_field(http_parser *p, const char *at, size_t len)
{
    kvr_resp *r = R(p);
    if (r->head_done)
        return 0; /* a trailer field: not delivered */
    if (r->in_value || r->nhdrs == 0) { /* http_parser calls on_header_value even for "" */
        if (grow(r) < 0)
            return fail(r, "out of memory");
        r->hoff[r->nhdrs] = r->head.len;
        r->hdrs[r->nhdrs] = (kvr_http_header){NULL, 0, NULL, 0};
        r->nhdrs++;
        r->in_value = 0;
    }
    if (kvr_buf_append(&r->head, at, len) < 0)
        return fail(r, "response head too large");
    r->hdrs[r->nhdrs - 1].name_len += len;
    return 0;
}

static int on_header_value(http_parser *p, const char *at, size_t len)
{
    kvr_resp *r = R(p);
    if (r->head_done || r->nhdrs == 0)
        return 0;
    r->in_value = 1;
    if (kvr_buf_append(&r->head, at, len) < 0)
        return fail(r, "response head too large");
    r->hdrs[r->nhdrs - 1].value_len += len;
    return 0;
}

static void clear_head(kvr_resp *r)
{
    kvr_buf_reset(&r->head);
    r->nhdrs = 0;
    r->in_value = 0;
}

/* Offsets become pointers once the head is complete (the buffer may move while it grows);
 * blanks around names and values are trimmed (a value's leading blanks are already gone). */
static void finish_head(kvr_resp *r)
{
    for (size_t i = 0; i < r->nhdrs; i++) {
        kvr_http_header *h = &r->hdrs[i];
        const char *n = r->head.data + r->hoff[i];
        size_t nl = h->name_len;
        const char *v = n + nl;
        size_t vl = h->value_len;
        while (nl && is_ows(n[nl - 1]))
            nl--;
        while (vl && is_ows(*v))
            v++, vl--;
        while (vl && is_ows(v[vl - 1]))
            vl--;
        *h = (kvr_http_header){n, nl, v, vl};
    }
}

/* Transfer-Encoding may name only `chunked`: kvroute asks for no other coding (it sends no TE
 * header), and relaying, say, gzip-coded bytes as the body would hand clients bytes they cannot
 * read without the header that says so (RFC 9112 §6.1). */
static int codings_ok(const kvr_resp *r)
{
    for (size_t i = 0; i < r->nhdrs; i++) {
        const kvr_http_header *h = &r->hdrs[i];
        if (h->name_len != 17 || strncasecmp(h->name, "transfer-encoding", 17) != 0)
            continue;
        const char *v = h->value, *end = v + h->value_len;
        while (v < end) {
            const char *c = memchr(v, ',', (size_t)(end - v));
            const char *e = c ? c : end;
            const char *a = v, *b = e;
            while (a < b && is_ows(*a))
                a++;
            while (b > a && is_ows(b[-1]))
                b--;
            if (b - a != 7 || strncasecmp(a, "chunked", 7) != 0)
                return 0;
            v = c ? c + 1 : end;
        }
    }
    return 1;
}

static int on_headers_complete(http_parser *p)
{
    kvr_resp *r = R(p);
    int s = (int)p->status_code;
    if (s >= 100 && s < 200 && s != 101) {
        /* interim (100 Continue, 103 Early Hints): skipped, the final head follows; it has no
         * body whatever its headers say (RFC 9110 §15.2), so 1 = no body */
        clear_head(r);
        return 1;
    }
    if (s == 101)
        return fail(r, "unexpected 101 Switching Protocols");
    if (s < 100)
        return fail(r, "malformed status line");
    if (s > 599) /* RFC 9110 §15: status codes are 100-599 */
        return fail(r, "status code out of range");
    r->status = s;
    r->head_done = 1;
    finish_head(r);
    if (!codings_ok(r))
        return fail(r, "unsupported transfer coding (only chunked is decoded)");
    stop(p, KVR_RESP_HEAD);
    return r->skip_body ? 1 : 0; /* 1: no body (http_parser's HEAD convention) */
}

static int on_body(http_parser *p, const char *at, size_t len)
{
    kvr_resp *r = R(p);
    if (!len || !r->head_done)
        return 0;
    r->piece = at;
    r->piece_len = len;
    stop(p, KVR_RESP_BODY);
    return 0;
}

static int on_message_complete(http_parser *p)
{
    kvr_resp *r = R(p);
    if (!r->head_done)
        return 0; /* the end of an interim response */
    r->done = 1;
    stop(p, KVR_RESP_DONE);
    return 0;
}

static const http_parser_settings settings = {
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

void kvr_resp_init(kvr_resp *r)
{
    memset(r, 0, sizeof(*r));
    kvr_buf_init(&r->head, KVR_RESP_HEAD_CAP);
    kvr_resp_reset(r, 0);
}

void kvr_resp_reset(kvr_resp *r, int head_request)
{
    http_parser_init(&r->p, HTTP_RESPONSE);
    r->p.data = r;
    r->status = 0;
    r->head_done = r->done = r->failed = 0;
    r->skip_body = head_request;
    r->err = NULL;
    r->ev = -1;
    r->piece = NULL;
    r->piece_len = 0;
    clear_head(r);
}

void kvr_resp_free(kvr_resp *r)
{
    kvr_buf_free(&r->head);
    free(r->hdrs);
    free(r->hoff);
    r->hdrs = NULL;
    r->hoff = NULL;
    r->hcap = r->nhdrs = 0;
}

void kvr_resp_trim(kvr_resp *r, size_t keep_bytes, size_t keep_headers)
{
    if (r->head.alloc > keep_bytes)
        kvr_buf_free(&r->head);
    if (r->hcap > keep_headers) {
        free(r->hdrs);
        free(r->hoff);
        r->hdrs = NULL;
        r->hoff = NULL;
        r->hcap = 0;
    }
    r->nhdrs = 0;
}

static kvr_resp_ev errored(kvr_resp *r)
{
    enum http_errno e = HTTP_PARSER_ERRNO(&r->p);
    if (!r->failed) {
        r->failed = 1;
        r->err = http_errno_description(e);
    }
    return KVR_RESP_ERROR;
}

kvr_resp_ev kvr_resp_feed(kvr_resp *r, const char *data, size_t len, size_t *used,
                          const char **piece, size_t *piece_len)
{
    *used = 0;
    if (r->failed)
        return KVR_RESP_ERROR;
    if (r->done)
        return KVR_RESP_DONE;
    if (!len)
        return KVR_RESP_MORE; /* a zero-length execute means EOF to http_parser */
    r->ev = -1;
    r->p.data = r;
    size_t n = http_parser_execute(&r->p, &settings, data, len);
    enum http_errno e = HTTP_PARSER_ERRNO(&r->p);
    *used = n > len ? len : n;
    if (e == HPE_PAUSED) {
        http_parser_pause(&r->p, 0);
        if (r->ev == KVR_RESP_BODY) {
            *piece = r->piece;
            *piece_len = r->piece_len;
        }
        return r->ev < 0 ? KVR_RESP_MORE : (kvr_resp_ev)r->ev;
    }
    if (e != HPE_OK)
        return errored(r);
    return KVR_RESP_MORE;
}

kvr_resp_ev kvr_resp_eof(kvr_resp *r)
{
    if (r->failed)
        return KVR_RESP_ERROR;
    if (r->done)
        return KVR_RESP_DONE;
    if (!r->head_done) {
        r->failed = 1;
        r->err = "connection closed before the response head ended";
        return KVR_RESP_ERROR;
    }
    r->ev = -1;
    r->p.data = r;
    (void)http_parser_execute(&r->p, &settings, NULL, 0);
    enum http_errno e = HTTP_PARSER_ERRNO(&r->p);
    if (e == HPE_PAUSED)
        http_parser_pause(&r->p, 0);
    if (r->done)
        return KVR_RESP_DONE;
    r->failed = 1;
    r->err = "connection closed before the response body ended";
    return KVR_RESP_ERROR;
}

/* ---- dry run ---- */

typedef struct dry {
    int done;
} dry;

static int dry_data(http_parser *p, const char *at, size_t len)
{
    (void)p;
    (void)at;
    (void)len;
    return 0;
}

static int dry_complete(http_parser *p)
{
    ((dry *)p->data)->done = 1;
    http_parser_pause(p, 1);
    return 0;
}

/* Only reached when a second response head follows the first: never valid here. */
static int dry_headers(http_parser *p)
{
    (void)p;
    return -1;
}

static const http_parser_settings dry_settings = {
    .on_header_field = dry_data,
    .on_header_value = dry_data,
    .on_headers_complete = dry_headers,
    .on_body = dry_data,
    .on_message_complete = dry_complete,
};

int kvr_resp_check_rest(const kvr_resp *r, const char *data, size_t len, const char **why)
{
    if (!len || r->failed || r->done)
        return 0;
    http_parser p = r->p;
    dry d = {0};
    p.data = &d;
    http_parser_pause(&p, 0);
    size_t n = http_parser_execute(&p, &dry_settings, data, len);
    enum http_errno e = HTTP_PARSER_ERRNO(&p);
    if (e == HPE_PAUSED && d.done) {
        if (n < len) {
            *why = "bytes after the end of the response (a body longer than its Content-Length)";
            return -1;
        }
        return 0;
    }
    if (e != HPE_OK) {
        *why = http_errno_description(e);
        return -1;
    }
    return 0;
}

int kvr_resp_keep_alive(const kvr_resp *r)
{
    return r->done && !r->failed && http_should_keep_alive(&r->p);
}
