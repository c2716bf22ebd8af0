/* The native HTTP/1.1 upstream client: attempts, the request (one vectored write: the head
 * built once into one buffer, then the caller's body buffer, never copied), the response
 * relayed as it is parsed (respparse.c) straight from the connection's read buffer, pause and
 * resume, the first-byte and stream-idle deadlines, and the re-send rule.
 *
 * Re-send rule (nginx's ngx_http_upstream_next on a cached keepalive connection, Envoy's
 * "reset before any response byte on a reused connection"): a request written on a pooled
 * connection that the worker closed or reset before any byte of the response arrived is
 * written again, once, on a fresh connection; it is neither a failure nor a retry (the worker
 * closed an idle connection as our write crossed its close: nothing was processed). A fresh
 * connection's failure is an ordinary one.
 *
 * Re-entrancy: callbacks may start, cancel and resume attempts. start never connects or writes
 * before it returns (the kick, an idle handle, finds the connection on the next loop
 * iteration), a resume asked for inside any callback of the client is deferred the same way,
 * and an attempt cancelled inside its own callback is recycled only once that callback
 * returned (UPN_A_DEAD). Failures found on the kick or in I/O callbacks call on_done directly. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "upstream/native_int.h"
#include "upstream/deadline.h"
#include "util/log.h"

/* ---- lists ---- */

static void active_link(kvr_upn *u, upn_attempt *a)
{
    a->prev = NULL;
    a->next = u->active_head;
    if (u->active_head)
        u->active_head->prev = a;
    u->active_head = a;
    u->active++;
}

static void active_unlink(kvr_upn *u, upn_attempt *a)
{
    if (a->prev)
        a->prev->next = a->next;
    else
        u->active_head = a->next;
    if (a->next)
        a->next->prev = a->prev;
    a->prev = a->next = NULL;
    u->active--;
}

static void recycle(upn_attempt *a)
{
    kvr_upn *u = a->u;
    a->state = UPN_A_FREE;
    a->cbs = (kvr_upstream_cbs){0};
    a->ud = NULL;
    a->body = NULL;
    a->held = NULL;
    if (a->req.alloc > KVR_UPN_KEEP_BYTES)
        kvr_buf_free(&a->req);
    if (a->url.alloc > KVR_UPN_KEEP_BYTES)
        kvr_buf_free(&a->url);
    kvr_resp_trim(&a->resp, KVR_UPN_KEEP_BYTES, KVR_UPN_KEEP_HEADERS);
    a->lnext = u->free_head;
    u->free_head = a;
}

/* An attempt that ended: back to the free list, unless the kick queue still holds it. */
static void release(upn_attempt *a)
{
    if (a->queued)
        a->state = UPN_A_ZOMBIE;
    else
        recycle(a);
}

static void kick_cb(uv_idle_t *h);

void kvr_upn__enqueue(upn_attempt *a)
{
    kvr_upn *u = a->u;
    if (!a->queued) {
        a->queued = 1;
        a->qnext = NULL;
        if (u->queue_tail)
            u->queue_tail->qnext = a;
        else
            u->queue_head = a;
        u->queue_tail = a;
    }
    if (!uv_is_active((uv_handle_t *)&u->kick))
        uv_idle_start(&u->kick, kick_cb);
}

/* ---- ending ---- */

static void detach(upn_attempt *a)
{
    upn_conn *c = a->c;
    if (c) {
        c->a = NULL;
        a->c = NULL;
    }
}

static void finish(upn_attempt *a, kvr_upstream_err kind, const char *msg)
{
    kvr_upn *u = a->u;
    kvr_upn__unwait(a);
    if (a->c) {
        upn_conn *c = a->c;
        detach(a);
        kvr_upn__conn_close(c);
    }
    uv_timer_stop(&a->timer);
    active_unlink(u, a);
    a->state = UPN_A_FINISHING;
    a->paused = 0;
    a->held = NULL;
    if (a->cbs.on_done)
        a->cbs.on_done(a->ud, kind, msg, a->got_headers);
    release(a);
}

void kvr_upn__conn_failed(upn_attempt *a, kvr_upstream_err kind, const char *msg)
{
    finish(a, kind, msg);
}

void kvr_upn__conn_broke(upn_attempt *a, int uverr)
{
    upn_conn *c = a->c;
    const kvr_upstream_opts *o = &a->u->opts;
    if (c && c->reused && !a->got_bytes && !a->resent && !a->u->closing &&
        o->resend_window_ms && uv_now(a->u->loop) - a->write_ms <= o->resend_window_ms) {
        KVR_DEBUG("upstream: pooled connection to %s closed before the response (%s): re-sent",
                  a->host->authority, uv_err_name(uverr));
        a->resent = 1;
        detach(a);
        kvr_upn__conn_close(c);
        a->state = UPN_A_WAITING;
        kvr_upn__acquire(a, 1);
        return;
    }
    if (uverr == UV_EOF)
        snprintf(a->errmsg, sizeof(a->errmsg), "connection closed %s",
                 a->got_headers ? "before the response body ended"
                                : "before the response head ended");
    else
        snprintf(a->errmsg, sizeof(a->errmsg), "connection to the worker failed: %s",
                 uv_strerror(uverr));
    finish(a, KVR_UP_RESET, a->errmsg);
}

/* The response ended well: the connection goes back to the pool when it may carry another
 * request (see npool.c), then on_done runs (so it may start the next attempt on it). */
static void complete(upn_attempt *a)
{
    upn_conn *c = a->c;
    const kvr_upstream_opts *o = &a->u->opts;
    int keep = kvr_resp_keep_alive(&a->resp) && a->sent && !a->eof && !c->rlen &&
               (!o->max_requests_per_connection || c->nreq < o->max_requests_per_connection);
    detach(a);
    kvr_upn__release(c, keep);
    finish(a, KVR_UP_OK, "ok");
}

/* ---- callbacks into the caller ---- */

/* After a callback: 1 when `a` must not be touched any more (cancelled inside, or gone). */
static int gone_after_cb(upn_attempt *a)
{
    if (a->state == UPN_A_ACTIVE)
        return 0;
    if (a->state == UPN_A_DEAD && !a->in_cb)
        release(a);
    return 1;
}

static int deliver_body(upn_attempt *a, const char *p, size_t n)
{
    kvr_upn *u = a->u;
    a->in_cb++;
    u->depth++;
    int r = a->cbs.on_body(a->ud, p, n);
    u->depth--;
    a->in_cb--;
    return r;
}

static void deliver_head(upn_attempt *a)
{
    kvr_upn *u = a->u;
    a->got_headers = 1;
    a->last_rx_ms = uv_now(u->loop); /* the idle deadline counts from here */
    if (!a->cbs.on_headers)
        return;
    a->in_cb++;
    u->depth++;
    a->cbs.on_headers(a->ud, a->resp.status, a->resp.hdrs, a->resp.nhdrs);
    u->depth--;
    a->in_cb--;
}

void kvr_upn__drive(upn_attempt *a)
{
    upn_conn *c = a->c;
    for (;;) {
        if (a->held) {
            if (deliver_body(a, a->held, a->held_len)) {
                if (gone_after_cb(a))
                    return;
                a->paused = 1; /* the bytes stay in c->rbuf; no read until the resume */
                kvr_upn__read_stop(c);
                return;
            }
            if (gone_after_cb(a))
                return;
            a->held = NULL;
            a->held_len = 0;
            continue;
        }
        if (c->rlen) {
            size_t used = 0, plen = 0;
            const char *piece = NULL;
            kvr_resp_ev ev =
                kvr_resp_feed(&a->resp, c->rbuf + c->roff, c->rlen, &used, &piece, &plen);
            c->roff += used;
            c->rlen -= used;
            switch (ev) {
            case KVR_RESP_MORE:
                if (!used && c->rlen) { /* cannot happen; never spin on it */
                    finish(a, KVR_UP_PROTOCOL, "response parser made no progress");
                    return;
                }
                continue;
            case KVR_RESP_HEAD: {
                const char *why = NULL;
                /* a first read that is already malformed fails before anything is relayed */
                if (kvr_resp_check_rest(&a->resp, c->rbuf + c->roff, c->rlen, &why) < 0) {
                    finish(a, KVR_UP_PROTOCOL, why);
                    return;
                }
                deliver_head(a);
                if (gone_after_cb(a))
                    return;
                continue;
            }
            case KVR_RESP_BODY:
                a->held = piece;
                a->held_len = plen;
                continue;
            case KVR_RESP_DONE:
                if (c->rlen) {
                    finish(a, KVR_UP_PROTOCOL, "bytes after the end of the response (a body "
                                               "longer than its Content-Length)");
                    return;
                }
                complete(a);
                return;
            case KVR_RESP_ERROR:
                finish(a, KVR_UP_PROTOCOL, a->resp.err ? a->resp.err : "malformed response");
                return;
            }
        }
        if (a->eof) {
            if (!a->got_bytes) {
                kvr_upn__conn_broke(a, UV_EOF);
                return;
            }
            if (kvr_resp_eof(&a->resp) == KVR_RESP_DONE) {
                complete(a); /* read to close (HTTP/1.0, Connection: close without length) */
                return;
            }
            finish(a, KVR_UP_RESET, a->resp.err);
            return;
        }
        kvr_upn__read_start(c);
        return;
    }
}

/* ---- deadlines (one timer per attempt, re-armed lazily, as the libcurl client's) ---- */

static int running(const upn_attempt *a)
{
    return a->state == UPN_A_WAITING || a->state == UPN_A_CONNECTING ||
           a->state == UPN_A_ACTIVE;
}

static void timer_cb(uv_timer_t *t)
{
    upn_attempt *a = t->data;
    kvr_upn *u = a->u;
    if (!running(a))
        return;
    uint64_t next;
    const char *msg;
    kvr_upstream_err e = kvr_up_deadline_check(&u->opts, uv_now(u->loop), a->start_ms,
                                               a->last_rx_ms, a->got_headers, a->paused, &next,
                                               &msg);
    if (e != KVR_UP_OK)
        finish(a, e, msg);
    else if (next)
        uv_timer_start(t, timer_cb, next, 0);
}

/* ---- the connection is ready ---- */

void kvr_upn__use_conn(upn_attempt *a, upn_conn *c)
{
    if (!c->rbuf && !(c->rbuf = kvr_upn__rbuf_get(a->u))) {
        kvr_upn__conn_close(c);
        a->fail_kind = KVR_UP_OTHER;
        a->fail_msg = "out of memory";
        kvr_upn__enqueue(a);
        return;
    }
    a->c = c;
    c->a = a;
    a->state = UPN_A_ACTIVE;
    a->got_bytes = a->eof = a->sent = 0;
    kvr_resp_reset(&a->resp, a->is_head);
    c->reused = c->nreq > 0;
    c->nreq++;
    c->roff = c->rlen = 0;
    a->write_ms = uv_now(a->u->loop);
    int rc = kvr_upn__write(c, a->req.data, a->req.len, a->body, a->body_len);
    if (rc < 0) {
        /* reported from the kick: this may run inside another attempt's ending */
        detach(a);
        kvr_upn__conn_close(c);
        snprintf(a->errmsg, sizeof(a->errmsg), "cannot write to the worker: %s",
                 uv_strerror(rc));
        a->fail_kind = KVR_UP_RESET;
        a->fail_msg = a->errmsg;
        kvr_upn__enqueue(a);
        return;
    }
    kvr_upn__read_start(c);
}

/* ---- the kick ---- */

static void resume_now(upn_attempt *a)
{
    a->resume_req = 0;
    if (!a->paused || a->state != UPN_A_ACTIVE || !a->c)
        return;
    a->paused = 0;
    kvr_upn *u = a->u;
    a->last_rx_ms = uv_now(u->loop);
    if (u->opts.stream_idle_timeout_ms && !uv_is_active((uv_handle_t *)&a->timer))
        uv_timer_start(&a->timer, timer_cb, u->opts.stream_idle_timeout_ms, 0);
    kvr_upn__drive(a);
}

static void kick_cb(uv_idle_t *h)
{
    kvr_upn *u = h->data;
    uv_idle_stop(h);
    upn_attempt *a = u->queue_head;
    u->queue_head = u->queue_tail = NULL;
    while (a) {
        upn_attempt *next = a->qnext;
        a->qnext = NULL;
        a->queued = 0;
        if (a->state == UPN_A_ZOMBIE) {
            recycle(a);
        } else if (running(a)) {
            if (a->fail_kind != KVR_UP_OK) {
                kvr_upstream_err k = a->fail_kind;
                a->fail_kind = KVR_UP_OK;
                finish(a, k, a->fail_msg);
            } else if (a->acquire_req) {
                a->acquire_req = 0;
                kvr_upn__acquire(a, 0);
            } else if (a->resume_req) {
                resume_now(a);
            }
        }
        a = next;
    }
}

/* ---- request ---- */

static int ieq(const char *a, size_t al, const char *lit)
{
    size_t n = strlen(lit);
    return al == n && strncasecmp(a, lit, n) == 0;
}

int kvr_upn_serves(const char *url)
{
    if (!url || strncasecmp(url, "http://", 7) != 0)
        return 0;
    const char *h = url + 7;
    size_t al = strcspn(h, "/?#");
    return memchr(h, '@', al) == NULL;
}

/* "METHOD target HTTP/1.1", Host, the caller's headers minus the ones framing belongs to,
 * Content-Length when there is a body or the method carries one (as libcurl sends it). */
static int build_head(upn_attempt *a, const char *method, const char *auth, size_t al,
                      const char *target, size_t tl, const kvr_http_header *h, size_t n,
                      size_t len)
{
    kvr_buf *b = &a->req;
    kvr_buf_reset(b);
    int rc = kvr_buf_puts(b, method) | kvr_buf_append(b, " ", 1);
    if (!tl || target[0] == '?')
        rc |= kvr_buf_append(b, "/", 1);
    rc |= kvr_buf_append(b, target, tl) | kvr_buf_puts(b, " HTTP/1.1\r\nHost: ") |
          kvr_buf_append(b, auth, al) | kvr_buf_append(b, "\r\n", 2);
    for (size_t i = 0; i < n; i++) {
        const char *nm = h[i].name;
        size_t nl = h[i].name_len;
        if (ieq(nm, nl, "host") || ieq(nm, nl, "content-length") || ieq(nm, nl, "expect") ||
            ieq(nm, nl, "transfer-encoding") || ieq(nm, nl, "connection"))
            continue;
        rc |= kvr_buf_append(b, nm, nl) | kvr_buf_append(b, ": ", h[i].value_len ? 2 : 1) |
              kvr_buf_append(b, h[i].value, h[i].value_len) | kvr_buf_append(b, "\r\n", 2);
    }
    if (len || !strcmp(method, "POST") || !strcmp(method, "PUT") || !strcmp(method, "PATCH")) {
        char num[24];
        size_t k = sizeof(num);
        do
            num[--k] = (char)('0' + len % 10);
        while ((len /= 10) && k);
        rc |= kvr_buf_append(b, "Content-Length: ", 16) |
              kvr_buf_append(b, num + k, sizeof(num) - k) | kvr_buf_append(b, "\r\n", 2);
    }
    rc |= kvr_buf_append(b, "\r\n", 2);
    return rc < 0 ? -1 : 0;
}

static upn_attempt *attempt_new(kvr_upn *u)
{
    upn_attempt *a = u->free_head;
    if (a) {
        u->free_head = a->lnext;
        a->lnext = NULL;
        return a;
    }
    a = calloc(1, sizeof(*a));
    if (!a)
        return NULL;
    a->hdr.native = 1;
    a->u = u;
    kvr_buf_init(&a->req, 0);
    kvr_buf_init(&a->url, 0);
    kvr_resp_init(&a->resp);
    uv_timer_init(u->loop, &a->timer);
    a->timer.data = a;
    u->open_handles++;
    return a;
}

kvr_upstream_attempt *kvr_upn_start(kvr_upn *u, const char *method, const char *url,
                                    const kvr_http_header *h, size_t n, const char *body,
                                    size_t len, const kvr_upstream_cbs *cbs, void *ud)
{
    if (u->closing || !cbs || !cbs->on_body || !cbs->on_done || !method || !*method ||
        !kvr_upn_serves(url) || (len && !body))
        return NULL;
    for (const char *p = method; *p; p++)
        if ((unsigned char)*p <= 0x20 || *p == 0x7f)
            return NULL;
    for (const char *p = url; *p; p++)
        if ((unsigned char)*p <= 0x20 || *p == 0x7f)
            return NULL;
    for (size_t i = 0; i < n; i++)
        if (!kvr_up__header_ok(&h[i]))
            return NULL;
    const char *auth = url + 7;
    size_t al = strcspn(auth, "/?#");
    const char *target = auth + al;
    size_t tl = strcspn(target, "#");
    upn_host *host = kvr_upn__host(u, auth, al);
    if (!host)
        return NULL;
    upn_attempt *a = attempt_new(u);
    if (!a)
        return NULL;
    kvr_buf_reset(&a->url);
    if (build_head(a, method, auth, al, target, tl, h, n, len) < 0 ||
        kvr_buf_append(&a->url, url, strlen(url) + 1) < 0) {
        recycle(a);
        return NULL;
    }
    a->host = host;
    a->c = NULL;
    a->body = body;
    a->body_len = len;
    a->is_head = strcmp(method, "HEAD") == 0;
    a->got_headers = a->got_bytes = a->paused = a->sent = a->resent = a->eof = 0;
    a->resume_req = a->on_wait = 0;
    a->in_cb = 0;
    a->held = NULL;
    a->held_len = 0;
    a->fail_kind = KVR_UP_OK;
    a->fail_msg = NULL;
    a->cbs = *cbs;
    a->ud = ud;
    active_link(u, a);
    a->start_ms = a->last_rx_ms = uv_now(u->loop);
    uint64_t ms = kvr_up_deadline_first(&u->opts);
    if (ms)
        uv_timer_start(&a->timer, timer_cb, ms, 0);
    a->state = UPN_A_WAITING;
    a->acquire_req = 1;
    kvr_upn__enqueue(a);
    return &a->hdr;
}

void kvr_upn_resume(kvr_upstream_attempt *ah)
{
    upn_attempt *a = (upn_attempt *)ah;
    if (!a || a->state != UPN_A_ACTIVE)
        return;
    if (a->u->depth > 0) {
        /* inside a callback (maybe on_body itself, before it returns 1): next iteration */
        a->resume_req = 1;
        kvr_upn__enqueue(a);
        return;
    }
    resume_now(a);
}

void kvr_upn_cancel(kvr_upstream_attempt *ah)
{
    upn_attempt *a = (upn_attempt *)ah;
    if (!a || !running(a))
        return; /* already ending (e.g. called from its own on_done) */
    kvr_upn *u = a->u;
    uv_timer_stop(&a->timer);
    active_unlink(u, a);
    a->cbs = (kvr_upstream_cbs){0};
    kvr_upn__unwait(a);
    if (a->c) {
        upn_conn *c = a->c;
        detach(a);
        kvr_upn__conn_close(c); /* the worker sees the disconnect now */
    }
    a->held = NULL;
    a->paused = 0;
    if (a->in_cb) {
        a->state = UPN_A_DEAD;
        return;
    }
    release(a);
}

int kvr_upn_body_sent(kvr_upstream_attempt *ah, size_t len)
{
    upn_attempt *a = (upn_attempt *)ah;
    return a->sent && len <= a->body_len;
}

size_t kvr_upn_active(const kvr_upn *u)
{
    return u->active;
}

/* ---- client ---- */

kvr_upn *kvr_upn_new(uv_loop_t *loop, const kvr_upstream_opts *opts)
{
    kvr_upn *u = calloc(1, sizeof(*u));
    if (!u)
        abort();
    u->loop = loop;
    if (opts)
        u->opts = *opts;
    else
        kvr_upstream_opts_default(&u->opts);
    uv_idle_init(loop, &u->kick);
    u->kick.data = u;
    u->open_handles = 1;
    return u;
}

void kvr_upn__handle_closed(kvr_upn *u)
{
    if (--u->open_handles == 0 && u->closing)
        free(u);
}

static void client_closed(uv_handle_t *h)
{
    kvr_upn__handle_closed(h->data);
}

static void attempt_closed(uv_handle_t *h)
{
    upn_attempt *a = h->data;
    kvr_upn *u = a->u;
    free(a);
    kvr_upn__handle_closed(u);
}

void kvr_upn_close(kvr_upn *u)
{
    u->closing = 1;
    while (u->active_head)
        kvr_upn_cancel(&u->active_head->hdr);
    for (upn_attempt *a = u->queue_head, *next; a; a = next) {
        next = a->qnext;
        a->queued = 0;
        a->qnext = NULL;
        if (a->state == UPN_A_ZOMBIE)
            recycle(a);
    }
    u->queue_head = u->queue_tail = NULL;
    kvr_upn__hosts_shutdown(u);
    while (u->rbuf_free) {
        char *b = u->rbuf_free;
        memcpy(&u->rbuf_free, b, sizeof(void *));
        free(b);
    }
    u->nrbuf_free = 0;
    while (u->free_head) {
        upn_attempt *a = u->free_head;
        u->free_head = a->lnext;
        kvr_buf_free(&a->req);
        kvr_buf_free(&a->url);
        kvr_resp_free(&a->resp);
        uv_close((uv_handle_t *)&a->timer, attempt_closed);
    }
    uv_close((uv_handle_t *)&u->kick, client_closed);
}
