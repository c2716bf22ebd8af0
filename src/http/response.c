/* Response framing and the write path to the client.
 *
 * Output is appended to the connection's `out` buffer and written by a uv_prepare callback
 * that runs once per loop iteration before polling, so everything produced in one iteration
 * (status line, headers, several SSE events) leaves in one write. While a write is in flight
 * new output keeps accumulating in `out`; when the write completes the two buffers swap and the
 * accumulated bytes go out in one write. One write per event halved SSE throughput in the
 * reference measurements (B.3); this is the coalescing that fixed it. The two buffers are
 * reused, so steady-state streaming does not allocate. */
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "http/internal.h"
#include "util/log.h"
#include "util/oai_error.h"

const char *kvr_http_reason(int status)
{
    switch (status) {
    case 100: return "Continue";
    case 101: return "Switching Protocols";
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 206: return "Partial Content";
    case 301: return "Moved Permanently";
    case 302: return "Found";
    case 303: return "See Other";
    case 304: return "Not Modified";
    case 307: return "Temporary Redirect";
    case 308: return "Permanent Redirect";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 406: return "Not Acceptable";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 410: return "Gone";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
    }
}

/* ---- small appenders (no printf on the per-response path) ---- */

static int put(kvr_buf *b, const char *s, size_t n)
{
    return kvr_buf_append(b, s, n);
}

#define PUT_LIT(b, lit) put((b), (lit), sizeof(lit) - 1)

static int put_str(kvr_buf *b, const char *s)
{
    return put(b, s, strlen(s));
}

static int put_u64(kvr_buf *b, uint64_t v)
{
    char tmp[24];
    size_t i = sizeof(tmp);
    do {
        tmp[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    return put(b, tmp + i, sizeof(tmp) - i);
}

static int put_hex(kvr_buf *b, uint64_t v)
{
    static const char hex[] = "0123456789abcdef";
    char tmp[20];
    size_t i = sizeof(tmp);
    do {
        tmp[--i] = hex[v & 15];
        v >>= 4;
    } while (v);
    return put(b, tmp + i, sizeof(tmp) - i);
}

/* IMF-fixdate (RFC 9110 5.6.7), recomputed at most once per second; locale-independent. */
static const char *http_date(kvr_http_server *s)
{
    static const char days[7][4] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
    static const char mons[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                     "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    time_t now = time(NULL);
    if (now != s->date_sec || !s->date[0]) {
        struct tm tm;
        gmtime_r(&now, &tm);
        snprintf(s->date, sizeof(s->date), "%s, %02d %s %04d %02d:%02d:%02d GMT",
                 days[tm.tm_wday % 7], tm.tm_mday, mons[tm.tm_mon % 12], tm.tm_year + 1900,
                 tm.tm_hour, tm.tm_min, tm.tm_sec);
        s->date_sec = now;
    }
    return s->date;
}

static int put_status_line(kvr_buf *b, kvr_http_server *s, int status)
{
    int rc = PUT_LIT(b, "HTTP/1.1 ");
    rc |= put_u64(b, (uint64_t)status);
    rc |= put(b, " ", 1);
    rc |= put_str(b, kvr_http_reason(status));
    rc |= PUT_LIT(b, "\r\nDate: ");
    rc |= put_str(b, http_date(s));
    rc |= PUT_LIT(b, "\r\n");
    return rc;
}

static int ieq(const char *a, size_t alen, const char *lit, size_t n)
{
    return alen == n && strncasecmp(a, lit, n) == 0;
}

/* Headers the server owns (framing and connection management) or that would split the
 * response if copied (CR, LF or NUL in a value, a non-token name). */
static int skip_header(const kvr_http_header *h)
{
    size_t n = h->name_len;
    if (ieq(h->name, n, "content-length", 14) || ieq(h->name, n, "transfer-encoding", 17) ||
        ieq(h->name, n, "connection", 10) || ieq(h->name, n, "keep-alive", 10) ||
        ieq(h->name, n, "date", 4))
        return 1;
    if (n == 0 || !kvr_http_is_token(h->name, n)) {
        KVR_WARN("http: dropping response header with an invalid name");
        return 1;
    }
    /* libc's memchr: a word or a vector at a time (every header of every response) */
    size_t vl = h->value_len;
    if (vl && (memchr(h->value, '\n', vl) || memchr(h->value, '\r', vl) ||
               memchr(h->value, '\0', vl))) {
        KVR_WARN("http: dropping response header %.*s: CR, LF or NUL in its value", (int)n,
                 h->name);
        return 1;
    }
    return 0;
}

/* ---- write path ---- */

size_t kvr_http__pending(const kvr_http_conn *c)
{
    size_t n = c->out.len;
    if (c->writing)
        n += uv_stream_get_write_queue_size((const uv_stream_t *)&c->tcp);
    return n;
}

static void write_now(kvr_http_conn *c);

static void on_wtimer(uv_timer_t *t)
{
    kvr_http_conn *c = t->data;
    KVR_DEBUG("http: client %s read nothing for %llu ms; closing", c->peer,
              (unsigned long long)c->srv->lim.idle_timeout_ms);
    kvr_http__conn_close(c);
}

/* Everything queued so far has reached the socket: shut down if closing, tell a paused producer
 * to resume, resume parsing pipelined requests held back by output. */
static void after_write(kvr_http_conn *c)
{
    if (c->close_after_flush && !c->out.len) {
        kvr_http__start_shutdown(c);
        return;
    }
    size_t hw = c->srv->lim.write_high_water;
    kvr_http_req *r = &c->req;
    if (r->owned && !r->gone && r->want_drain && kvr_http__pending(c) <= hw / 4) {
        r->want_drain = 0;
        if (r->cbs.on_drain)
            r->cbs.on_drain(r->cbs_ud);
    }
    if (c->wait_out && c->state == KVR_HTTP_C_IDLE && kvr_http__pending(c) <= hw)
        kvr_http__conn_resume(c);
}

static void write_cb(uv_write_t *w, int status)
{
    kvr_http_conn *c = w->data;
    c->writing = 0;
    if (c->wbuf.alloc > KVR_HTTP_KEEP_ALLOC)
        kvr_buf_free(&c->wbuf);
    else
        kvr_buf_reset(&c->wbuf);
    if (status < 0) {
        if (status != UV_ECANCELED) {
            KVR_DEBUG("http: write to %s failed: %s", c->peer, uv_strerror(status));
            kvr_http__conn_close(c);
        }
        return;
    }
    if (c->state == KVR_HTTP_C_CLOSED)
        return;
    uv_timer_stop(&c->wtimer);
    if (c->out.len)
        write_now(c); /* calls after_write() itself once everything is out */
    else
        after_write(c);
}

/* Writes what is queued. First a direct uv_try_write(): when the socket takes it all (the usual
 * case for a small response) there is no write request, callback or extra epoll_ctl. What is
 * left goes to uv_write() and keeps accumulating in `out` until it completes. */
static void write_now(kvr_http_conn *c)
{
    if (c->writing || c->state == KVR_HTTP_C_CLOSED || !c->out.len)
        return;
    uv_buf_t b = uv_buf_init(c->out.data, (unsigned)c->out.len);
    int n = uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
    if (n == (int)c->out.len) {
        if (c->out.alloc > KVR_HTTP_KEEP_ALLOC)
            kvr_buf_free(&c->out);
        else
            kvr_buf_reset(&c->out);
        after_write(c);
        return;
    }
    if (n < 0 && n != UV_EAGAIN) {
        KVR_DEBUG("http: write to %s failed: %s", c->peer, uv_strerror(n));
        kvr_http__conn_close(c);
        return;
    }
    if (n > 0)
        kvr_buf_consume(&c->out, (size_t)n);
    kvr_buf t = c->wbuf;
    c->wbuf = c->out;
    c->out = t;
    b = uv_buf_init(c->wbuf.data, (unsigned)c->wbuf.len);
    c->wreq.data = c;
    int rc = uv_write(&c->wreq, (uv_stream_t *)&c->tcp, &b, 1, write_cb);
    if (rc < 0) {
        KVR_DEBUG("http: write to %s failed: %s", c->peer, uv_strerror(rc));
        kvr_buf_reset(&c->wbuf);
        kvr_http__conn_close(c);
        return;
    }
    c->writing = 1;
    /* Send timeout (nginx send_timeout): a client that stops reading is dropped after the
     * idle timeout instead of holding the connection and its upstream forever. */
    uv_timer_start(&c->wtimer, on_wtimer, c->srv->lim.idle_timeout_ms, 0);
}

void kvr_http__prepare_cb(uv_prepare_t *h)
{
    kvr_http_server *s = h->data;
    kvr_http_conn *c;
    while ((c = s->flush_head) != NULL) {
        s->flush_head = c->fnext;
        c->fnext = NULL;
        c->in_flush = 0;
        write_now(c);
    }
    uv_prepare_stop(h);
}

void kvr_http__flush_later(kvr_http_conn *c)
{
    kvr_http_server *s = c->srv;
    if (c->in_flush || c->writing || !c->out.len || c->state == KVR_HTTP_C_CLOSED)
        return;
    c->in_flush = 1;
    c->fnext = s->flush_head;
    s->flush_head = c;
    if (!uv_is_active((uv_handle_t *)&s->prepare))
        uv_prepare_start(&s->prepare, kvr_http__prepare_cb);
}

void kvr_http__unflush(kvr_http_conn *c)
{
    if (!c->in_flush || !c->srv)
        return;
    for (kvr_http_conn **pp = &c->srv->flush_head; *pp; pp = &(*pp)->fnext) {
        if (*pp == c) {
            *pp = c->fnext;
            break;
        }
    }
    c->fnext = NULL;
    c->in_flush = 0;
}

int kvr_http__queue(kvr_http_conn *c, const void *p, size_t n)
{
    if (kvr_buf_append(&c->out, p, n) < 0)
        return -1;
    kvr_http__flush_later(c);
    return 0;
}

void kvr_http__close_after_flush(kvr_http_conn *c)
{
    if (c->state == KVR_HTTP_C_CLOSED || c->state == KVR_HTTP_C_LINGER)
        return;
    c->state = KVR_HTTP_C_CLOSING;
    c->close_after_flush = 1;
    c->wait_out = 0;
    kvr_buf_reset(&c->in);
    kvr_http__stop_timer(c);
    if (!c->writing && !c->out.len)
        kvr_http__start_shutdown(c);
    else
        kvr_http__flush_later(c);
}

/* A complete error response with an OpenAI-style JSON body that ends the connection (in
 * Anthropic's shape once the headers named one of its paths: its clients parse only that). */
static int queue_error(kvr_http_conn *c, int status, const char *msg)
{
    kvr_buf body;
    kvr_buf_init(&body, 4096);
    const char *path = c->headers_done ? kvr_http_req_path(&c->req) : NULL;
    int rc = kvr_error_json_for(&body, path, status, NULL, msg ? msg : kvr_http_reason(status),
                                NULL, NULL);
    kvr_buf *b = &c->out;
    size_t mark = b->len;
    rc |= put_status_line(b, c->srv, status);
    rc |= PUT_LIT(b, "Content-Type: application/json\r\nContent-Length: ");
    rc |= put_u64(b, body.len);
    rc |= PUT_LIT(b, "\r\nConnection: close\r\n");
    if (status == 415) /* RFC 9110 15.5.16: the codings a request body may have: none */
        rc |= PUT_LIT(b, "Accept-Encoding: identity\r\n");
    rc |= PUT_LIT(b, "\r\n");
    rc |= put(b, body.data ? body.data : "", body.len);
    kvr_buf_free(&body);
    if (rc) {
        b->len = mark;
        return -1;
    }
    kvr_http__flush_later(c);
    return 0;
}

static void count_refusal(kvr_http_server *s, int status)
{
    if (!s)
        return;
    size_t i = 0;
    while (i < s->nrefused && s->refused[i].status != status)
        i++;
    if (i == s->nrefused) {
        if (i == KVR_HTTP_REFUSALS_MAX)
            return; /* more statuses than the HTTP layer has */
        s->refused[s->nrefused++].status = status;
    }
    s->refused[i].n++;
}

void kvr_http__send_error(kvr_http_conn *c, int status, const char *msg)
{
    if (c->state == KVR_HTTP_C_CLOSED || c->state == KVR_HTTP_C_CLOSING ||
        c->state == KVR_HTTP_C_LINGER)
        return;
    KVR_DEBUG("http: %d to %s: %s", status, c->peer, msg ? msg : "");
    count_refusal(c->srv, status);
    if (queue_error(c, status, msg) < 0) {
        kvr_http__conn_close(c);
        return;
    }
    kvr_http__close_after_flush(c);
}

/* ---- response API ---- */

static int resp_start(kvr_http_req *r, int status, const char *ctype, const kvr_http_header *h,
                      size_t n, int64_t content_length)
{
    if (!r || !r->owned || r->gone || r->started || status < 200 || status > 599)
        return -1;
    kvr_http_conn *c = r->conn;
    kvr_http_server *s = c->srv;
    int keep = r->keep_alive && !s->draining && !c->eof;
    int framing;
    if (r->head || status == 204 || status == 304)
        framing = KVR_HTTP_F_NONE;
    else if (content_length >= 0)
        framing = KVR_HTTP_F_LENGTH;
    else if (r->minor >= 1)
        framing = KVR_HTTP_F_CHUNKED;
    else {
        framing = KVR_HTTP_F_EOF; /* HTTP/1.0 cannot take chunked: the close ends the body */
        keep = 0;
    }

    kvr_buf *b = &c->out;
    size_t mark = b->len;
    int rc = put_status_line(b, s, status);
    if (ctype) {
        rc |= PUT_LIT(b, "Content-Type: ");
        rc |= put_str(b, ctype);
        rc |= PUT_LIT(b, "\r\n");
    }
    for (size_t i = 0; i < n; i++) {
        if (skip_header(&h[i]))
            continue;
        rc |= put(b, h[i].name, h[i].name_len);
        rc |= PUT_LIT(b, ": ");
        rc |= put(b, h[i].value, h[i].value_len);
        rc |= PUT_LIT(b, "\r\n");
    }
    /* A HEAD or 304 response may state the length the GET would have (RFC 9110 8.6); 204
     * must not. */
    if (content_length >= 0 && status != 204 &&
        (framing == KVR_HTTP_F_LENGTH || framing == KVR_HTTP_F_NONE)) {
        rc |= PUT_LIT(b, "Content-Length: ");
        rc |= put_u64(b, (uint64_t)content_length);
        rc |= PUT_LIT(b, "\r\n");
    } else if (framing == KVR_HTTP_F_CHUNKED) {
        rc |= PUT_LIT(b, "Transfer-Encoding: chunked\r\n");
    }
    rc |= keep ? PUT_LIT(b, "Connection: keep-alive\r\n\r\n")
               : PUT_LIT(b, "Connection: close\r\n\r\n");
    if (rc) {
        b->len = mark;
        KVR_WARN("http: response to %s does not fit the output buffer; closing", c->peer);
        kvr_http__conn_close(c);
        return -1;
    }
    r->started = 1;
    r->framing = framing;
    r->keep_alive = keep;
    r->resp_len = framing == KVR_HTTP_F_LENGTH ? content_length : -1;
    r->resp_sent = 0;
    kvr_http__flush_later(c);
    /* A head alone above the high-water mark: the handler sees it pending and waits for
     * on_drain, which must then come (a 100 KB header block used to stall the stream). */
    if (kvr_http__pending(c) > s->lim.write_high_water)
        r->want_drain = 1;
    return 0;
}

int kvr_http_resp_start(kvr_http_req *r, int status, const kvr_http_header *h, size_t n,
                        int64_t content_length)
{
    return resp_start(r, status, NULL, h, n, content_length);
}

int kvr_http_resp_write(kvr_http_req *r, const void *data, size_t len)
{
    if (!r || !r->owned || r->gone || !r->started)
        return -1;
    kvr_http_conn *c = r->conn;
    size_t hw = c->srv->lim.write_high_water;
    int over = 0;
    if (len && r->framing != KVR_HTTP_F_NONE) {
        if (r->framing == KVR_HTTP_F_LENGTH &&
            (uint64_t)len > (uint64_t)r->resp_len - r->resp_sent) {
            KVR_WARN("http: handler wrote past Content-Length %lld to %s; truncating",
                     (long long)r->resp_len, c->peer);
            len = (size_t)((uint64_t)r->resp_len - r->resp_sent);
            r->close_after = 1;
            over = 1;
        }
        kvr_buf *b = &c->out;
        size_t mark = b->len;
        int rc = 0;
        if (r->framing == KVR_HTTP_F_CHUNKED && len) {
            rc |= put_hex(b, len);
            rc |= PUT_LIT(b, "\r\n");
            rc |= put(b, data, len);
            rc |= PUT_LIT(b, "\r\n");
        } else if (len) {
            rc |= put(b, data, len);
        }
        if (rc) {
            b->len = mark;
            KVR_WARN("http: output to %s over its cap (handler ignored backpressure); closing",
                     c->peer);
            kvr_http__conn_close(c);
            return -1;
        }
        r->resp_sent += len;
        kvr_http__flush_later(c);
    }
    if (over)
        return -1;
    if (kvr_http__pending(c) > hw) {
        r->want_drain = 1;
        return 1;
    }
    return 0;
}

size_t kvr_http_resp_pending(const kvr_http_req *r)
{
    if (!r || !r->owned || r->gone)
        return 0;
    return kvr_http__pending(r->conn);
}

void kvr_http_resp_end(kvr_http_req *r)
{
    if (!r || !r->owned)
        return;
    kvr_http_conn *c = r->conn;
    int keep = 0;
    if (!r->gone) {
        if (!r->started) {
            KVR_WARN("http: handler ended %s %s without a response; sending 500", r->method,
                     r->hbuf.data ? r->hbuf.data : "");
            if (queue_error(c, 500, "the server produced no response") < 0)
                kvr_http__conn_close(c);
        } else {
            if (r->framing == KVR_HTTP_F_CHUNKED &&
                kvr_http__queue(c, "0\r\n\r\n", 5) < 0) {
                kvr_http__conn_close(c);
            } else if (r->framing == KVR_HTTP_F_LENGTH &&
                       r->resp_sent < (uint64_t)r->resp_len) {
                KVR_WARN("http: response to %s ended %llu bytes short of its Content-Length; "
                         "closing",
                         c->peer, (unsigned long long)((uint64_t)r->resp_len - r->resp_sent));
                r->close_after = 1;
            }
            keep = r->keep_alive && !r->close_after && r->framing != KVR_HTTP_F_EOF;
            kvr_http_server *s = c->srv;
            if (s && s->lim.close_after_requests && ++c->nresp >= s->lim.close_after_requests)
                keep = 0;
        }
    }
    kvr_http__req_release(r, keep);
}

void kvr_http_resp_abort(kvr_http_req *r)
{
    if (!r || !r->owned)
        return;
    kvr_http__req_release(r, 0);
}

void kvr_http_resp_simple(kvr_http_req *r, int status, const char *content_type,
                          const kvr_http_header *extra, size_t n, const void *body, size_t len)
{
    if (resp_start(r, status, content_type, extra, n, (int64_t)len) == 0 && len)
        kvr_http_resp_write(r, body, len);
    kvr_http_resp_end(r);
}
