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

static const char k_excess[] = "bytes after the end of the response (a body longer than its "
                               "Content-Length)";

/* ---- fast path ---- */

/* Heads up to this size are tried on the fast path (typical ones are 150-400 bytes). */
#define FAST_HEAD_MAX 8192

static int g_fast = 1;

void kvr_resp_fast_path(int on)
{
    g_fast = on;
}

/* A field value's bytes as http_parser (2.9.4, non-strict) takes them without a doubt:
 * visible, blank or obs-text; never CR, LF, NUL or another control byte. */
static const unsigned char g_value_bad[256] = {
    [0x00 ... 0x08] = 1, [0x0a ... 0x1f] = 1, [0x7f] = 1,
};

static int value_ok(const char *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (g_value_bad[(unsigned char)v[i]])
            return 0;
    return 1;
}

/* The CRLF CRLF that ends the head in data[0, len), or NULL. Line by line: heads are a few
 * short lines, where memchr beats glibc's memmem by far. */
static const char *head_end(const char *data, size_t len)
{
    for (const char *p = data, *stop = data + len; p < stop;) {
        const char *nl = memchr(p, '\n', (size_t)(stop - p));
        if (!nl || stop - nl < 3)
            return NULL;
        if (nl > data && nl[-1] == '\r' && nl[1] == '\r' && nl[2] == '\n')
            return nl - 1;
        p = nl + 1;
    }
    return NULL;
}

/* always_inline: with a literal `lit` (lower case) the length folds to a constant, and the
 * comparison runs only for a name of the right length and first letter (every response
 * header passes here). */
static inline __attribute__((always_inline)) int ieq(const char *a, size_t n, const char *lit)
{
    return __builtin_strlen(lit) == n && (a[0] | 0x20) == lit[0] && strncasecmp(a, lit, n) == 0;
}

/* Whether `a` (n bytes) starts with `lit` but is longer: http_parser matches the names and
 * tokens it knows character by character, so near-misses are left to it. */
static inline __attribute__((always_inline)) int longer_than(const char *a, size_t n,
                                                             const char *lit)
{
    size_t l = __builtin_strlen(lit);
    return n > l && (a[0] | 0x20) == lit[0] && strncasecmp(a, lit, l) == 0;
}

/* Whether a header name starts with one http_parser gives a meaning (2.9.4: h_matching_*)
 * but is longer. */
static int longer_than_special(const char *a, size_t n)
{
    return longer_than(a, n, "content-length") || longer_than(a, n, "transfer-encoding") ||
           longer_than(a, n, "connection") || longer_than(a, n, "proxy-connection") ||
           longer_than(a, n, "upgrade");
}

/* Connection's tokens, read only in the shape http_parser 2.9.4 (h_matching_connection_*)
 * reads the same way: elements of 1*tchar, each after optional SP/HTAB and before optional SP,
 * none empty. Outside it http_parser's reading is its own: a first element may start with any
 * byte, an empty or non-token element stops all matching (",,close" is not close), a tab after
 * "close" unmakes it. v is the value without its leading whitespace but with its trailing one.
 * Returns 1 with *close set when one token is "close"; 0 (leave the head to http_parser) for
 * any other shape, and on "upgrade" or a token that only starts like one it matches. */
static int connection_ok(const char *v, size_t n, int *close)
{
    const char *end = v + n;
    if (!n)
        return 1; /* an empty value names nothing */
    for (;;) { /* one element, then its comma */
        while (v < end && is_ows(*v))
            v++;
        const char *a = v;
        while (v < end && *v != ',' && !is_ows(*v))
            v++;
        size_t tl = (size_t)(v - a);
        if (!tl || !kvr_http_is_token(a, tl))
            return 0;
        while (v < end && *v == ' ')
            v++;
        if (ieq(a, tl, "close"))
            *close = 1;
        else if (ieq(a, tl, "upgrade") || longer_than(a, tl, "close") ||
                 longer_than(a, tl, "keep-alive") || longer_than(a, tl, "upgrade"))
            return 0;
        if (v == end)
            return 1;
        if (*v++ != ',')
            return 0;
    }
}

/* Reads a whole head at data (the response's first bytes) when it is the usual kind (see the
 * header); returns its length, or 0 to leave everything to http_parser. */
static size_t fast_head(kvr_resp *r, const char *data, size_t len)
{
    if (len < 17 || memcmp(data, "HTTP/1.1 ", 9) != 0)
        return 0;
    const char *end = head_end(data, len < FAST_HEAD_MAX ? len : FAST_HEAD_MAX);
    if (!end)
        return 0;
    for (int i = 9; i < 12; i++)
        if (data[i] < '0' || data[i] > '9')
            return 0;
    int status = (data[9] - '0') * 100 + (data[10] - '0') * 10 + (data[11] - '0');
    if (status < 200 || status > 599 || status == 204 || status == 304 || data[12] != ' ')
        return 0;
    const char *nl = memchr(data + 12, '\n', (size_t)(end + 2 - (data + 12)));
    if (!nl || nl[-1] != '\r' || !value_ok(data + 13, (size_t)(nl - 1 - (data + 13))))
        return 0;
    /* the fields, copied as one block: the names and values point into it */
    const char *fields = nl + 1;
    size_t flen = (size_t)(end + 2 - fields);
    clear_head(r);
    if (kvr_buf_append(&r->head, fields, flen) < 0)
        return 0;
    const char *p = r->head.data, *stop = p + flen;
    unsigned long long cl = 0;
    int have_cl = 0, close = 0;
    while (p < stop) {
        const char *le = memchr(p, '\n', (size_t)(stop - p));
        if (!le || le == p || le[-1] != '\r')
            goto slow;
        const char *colon = memchr(p, ':', (size_t)(le - 1 - p));
        if (!colon || colon == p)
            goto slow;
        if (!kvr_http_is_token(p, (size_t)(colon - p)))
            goto slow;
        const char *v = colon + 1, *ve = le - 1;
        if (!value_ok(v, (size_t)(ve - v)))
            goto slow;
        while (v < ve && is_ows(*v))
            v++;
        while (ve > v && is_ows(ve[-1]))
            ve--;
        size_t nl2 = (size_t)(colon - p), vl = (size_t)(ve - v);
        if (longer_than_special(p, nl2))
            goto slow;
        if (ieq(p, nl2, "content-length")) {
            if (have_cl || !vl || vl > 18)
                goto slow;
            for (const char *t = ve; t < le - 1; t++)
                if (*t != ' ')
                    goto slow; /* http_parser ends a length at a space only */
            for (size_t i = 0; i < vl; i++) {
                if (v[i] < '0' || v[i] > '9')
                    goto slow;
                cl = cl * 10 + (unsigned long long)(v[i] - '0');
            }
            have_cl = 1;
        } else if (ieq(p, nl2, "transfer-encoding") || ieq(p, nl2, "proxy-connection") ||
                   ieq(p, nl2, "upgrade")) {
            goto slow;
        } else if (ieq(p, nl2, "connection") &&
                   !connection_ok(v, (size_t)(le - 1 - v), &close)) {
            goto slow;
        }
        if (grow(r) < 0)
            goto slow;
        r->hdrs[r->nhdrs++] = (kvr_http_header){p, nl2, v, vl};
        p = le + 1;
    }
    if (!have_cl || !cl)
        goto slow; /* a body to the close, or none: http_parser's rules */
    r->status = status;
    r->head_done = 1;
    r->fast = 1;
    r->fast_close = close;
    r->remaining = cl;
    return (size_t)(end + 4 - data);
slow:
    clear_head(r);
    return 0;
}

/* The body of a fast-path response: counted off. Like http_parser's (see the top), the last
 * piece leaves its last byte to be fed again, which then ends the response. */
static kvr_resp_ev fast_feed(kvr_resp *r, size_t len, size_t *used, const char *data,
                             const char **piece, size_t *piece_len)
{
    if (!len)
        return KVR_RESP_MORE;
    if (!r->remaining) {
        *used = 1;
        r->done = 1;
        return KVR_RESP_DONE;
    }
    size_t n = len < r->remaining ? len : (size_t)r->remaining;
    r->remaining -= n;
    *piece = data;
    *piece_len = n;
    *used = r->remaining ? n : n - 1;
    return KVR_RESP_BODY;
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
    r->fed = r->fast = r->fast_close = 0;
    r->remaining = 0;
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
    if (r->fast)
        return fast_feed(r, len, used, data, piece, piece_len);
    if (!len)
        return KVR_RESP_MORE; /* a zero-length execute means EOF to http_parser */
    if (!r->fed && g_fast && !r->skip_body) {
        size_t n = fast_head(r, data, len);
        if (n) {
            *used = n;
            return KVR_RESP_HEAD;
        }
    }
    r->fed = 1;
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
    if (r->fast) {
        r->failed = 1;
        r->err = "connection closed before the response body ended";
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
    if (r->fast) {
        if (len > r->remaining) {
            *why = k_excess;
            return -1;
        }
        return 0;
    }
    http_parser p = r->p;
    dry d = {0};
    p.data = &d;
    http_parser_pause(&p, 0);
    size_t n = http_parser_execute(&p, &dry_settings, data, len);
    enum http_errno e = HTTP_PARSER_ERRNO(&p);
    if (e == HPE_PAUSED && d.done) {
        if (n < len) {
            *why = k_excess;
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
    if (r->fast)
        return r->done && !r->failed && !r->fast_close;
    return r->done && !r->failed && http_should_keep_alive(&r->p);
}
