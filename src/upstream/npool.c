/* The native client's connections: one host per worker authority, a keep-alive pool per host
 * (most recently used first, as nginx's upstream keepalive cache), connecting with the egress
 * check on every resolved address, and the socket's reads and writes.
 *
 * Pool rules: a connection goes back to its host after a response that allows keep-alive
 * (RFC 9112 §9.3: HTTP/1.1 without `Connection: close`, or 1.0 with keep-alive) when the whole
 * request was written, no byte followed the response and --upstream-max-requests-per-connection
 * is not reached; it is given at once to the oldest attempt waiting for one
 * (--max-worker-connections), else kept idle unless the host already keeps
 * --upstream-max-idle, for --upstream-idle-timeout-ms at most. An idle connection keeps being
 * read: the worker closing it (its own keep-alive timeout) or any stray byte closes it at once,
 * as nginx's ngx_http_upstream_keepalive_close_handler does, so few stale connections are ever
 * picked (and a stale one is re-sent once, native.c). */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "upstream/native_int.h"

static void conn_maybe_free(upn_conn *c)
{
    if (c->state != UPN_C_CLOSED || c->refs)
        return;
    kvr_upn *u = c->u;
    if (c->ai)
        uv_freeaddrinfo(c->ai);
    kvr_upn__rbuf_put(u, c->rbuf);
    free(c);
    kvr_upn__handle_closed(u);
}

static void timer_closed(uv_handle_t *h)
{
    upn_conn *c = h->data;
    c->refs--;
    conn_maybe_free(c);
}

static void sock_closed(uv_handle_t *h)
{
    upn_sock *s = h->data;
    upn_conn *c = s->c;
    if (c->s == s)
        c->s = NULL;
    free(s);
    c->refs--;
    conn_maybe_free(c);
}

static void sock_close(upn_conn *c)
{
    upn_sock *s = c->s;
    if (!s || uv_is_closing((uv_handle_t *)&s->tcp))
        return;
    c->reading = 0;
    uv_close((uv_handle_t *)&s->tcp, sock_closed); /* pending writes end with UV_ECANCELED */
}

static void idle_unlink(upn_conn *c)
{
    upn_host *h = c->host;
    if (c->prev)
        c->prev->next = c->next;
    else
        h->idle_head = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->prev = c->next = NULL;
    h->nidle--;
}

void kvr_upn__unwait(upn_attempt *a)
{
    upn_host *h = a->host;
    if (!a->on_wait || !h)
        return;
    upn_attempt **pp = &h->wait_head, *prev = NULL;
    while (*pp && *pp != a) {
        prev = *pp;
        pp = &(*pp)->wnext;
    }
    if (*pp) {
        *pp = a->wnext;
        if (h->wait_tail == a)
            h->wait_tail = prev;
    }
    a->wnext = NULL;
    a->on_wait = 0;
}

static upn_attempt *wait_pop(upn_host *h)
{
    upn_attempt *a = h->wait_head;
    if (!a)
        return NULL;
    h->wait_head = a->wnext;
    if (!h->wait_head)
        h->wait_tail = NULL;
    a->wnext = NULL;
    a->on_wait = 0;
    return a;
}

void kvr_upn__conn_close(upn_conn *c)
{
    if (c->state == UPN_C_CLOSED)
        return;
    upn_host *h = c->host;
    kvr_upn *u = c->u;
    if (c->state == UPN_C_IDLE)
        idle_unlink(c);
    if (c->a) {
        c->a->c = NULL;
        c->a = NULL;
    }
    c->state = UPN_C_CLOSED;
    h->nconns--;
    uv_timer_stop(&c->timer);
    uv_close((uv_handle_t *)&c->timer, timer_closed);
    if (c->gai_busy)
        uv_cancel((uv_req_t *)&c->gai); /* its callback still runs, with UV_ECANCELED */
    sock_close(c);
    /* a slot is free: the oldest waiter gets it on the next loop iteration */
    long cap = u->opts.max_host_connections;
    if (!u->closing && h->wait_head && (cap <= 0 || h->nconns < (size_t)cap)) {
        upn_attempt *w = wait_pop(h);
        w->acquire_req = 1;
        kvr_upn__enqueue(w);
    }
}

/* ---- reading and writing ---- */

static void alloc_cb(uv_handle_t *hd, size_t suggested, uv_buf_t *buf)
{
    upn_sock *s = hd->data;
    upn_conn *c = s->c;
    (void)suggested;
    if (!c->rbuf) { /* idle: any byte or the EOF closes it */
        buf->base = c->u->scratch;
        buf->len = sizeof(c->u->scratch);
        return;
    }
    if (!c->rlen)
        c->roff = 0;
    size_t end = c->roff + c->rlen;
    buf->base = c->rbuf + end;
    buf->len = KVR_UPN_RBUF - end; /* 0 (never expected): libuv reports UV_ENOBUFS */
}

static void read_cb(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    upn_sock *s = st->data;
    upn_conn *c = s->c;
    (void)buf;
    if (c->state == UPN_C_CLOSED || c->s != s || nread == 0)
        return;
    if (c->state == UPN_C_IDLE || !c->a || !c->rbuf) {
        /* an idle connection the worker closed, or stray bytes: not reusable */
        kvr_upn__conn_close(c);
        return;
    }
    upn_attempt *a = c->a;
    if (nread > 0) {
        c->rlen += (size_t)nread;
        a->got_bytes = 1;
        a->last_rx_ms = uv_now(c->u->loop);
        kvr_upn__drive(a);
        return;
    }
    kvr_upn__read_stop(c);
    if (nread == UV_EOF) {
        a->eof = 1;
        kvr_upn__drive(a);
        return;
    }
    kvr_upn__conn_broke(a, (int)nread);
}

void kvr_upn__read_start(upn_conn *c)
{
    if (c->reading || !c->s)
        return;
    if (uv_read_start((uv_stream_t *)&c->s->tcp, alloc_cb, read_cb) == 0)
        c->reading = 1;
}

void kvr_upn__read_stop(upn_conn *c)
{
    if (!c->reading || !c->s)
        return;
    uv_read_stop((uv_stream_t *)&c->s->tcp);
    c->reading = 0;
}

static void write_cb(uv_write_t *req, int status)
{
    upn_sock *s = req->data;
    upn_conn *c = s->c;
    c->writing = 0;
    if (c->release_pending) { /* its response ended first: now it may carry another request */
        c->release_pending = 0;
        if (c->state != UPN_C_CLOSED && c->s == s && !c->a)
            kvr_upn__release(c, status == 0);
        return;
    }
    if (c->state == UPN_C_CLOSED || c->s != s || !c->a)
        return;
    upn_attempt *a = c->a;
    if (status == 0) {
        a->sent = 1;
        return;
    }
    /* Once response bytes came, the reader decides (a worker may answer, e.g. 413, without
     * reading the whole body); before that the connection is broken. */
    if (!a->got_bytes)
        kvr_upn__conn_broke(a, status);
}

int kvr_upn__write(upn_conn *c, const char *head, size_t hlen, const char *body, size_t blen)
{
    uv_buf_t b[2] = {uv_buf_init((char *)head, (unsigned)hlen),
                     uv_buf_init((char *)body, (unsigned)blen)};
    unsigned nb = blen ? 2 : 1;
    /* Written at once when the socket takes it all (the usual case): uv_write() would also
     * write at once, but its completion re-arms the reading watcher (libuv 1.44's uv__drain
     * stops POLLOUT, which queues an epoll_ctl MOD): one syscall per request saved. A hard
     * error is left to uv_write() so that write_cb reports it as before. */
    int n = uv_try_write((uv_stream_t *)&c->s->tcp, b, nb);
    if (n >= 0 && (size_t)n == hlen + blen) {
        if (c->a)
            c->a->sent = 1;
        return 0;
    }
    if (n > 0) {
        size_t done = (size_t)n;
        if (done >= hlen) {
            b[0] = uv_buf_init((char *)body + (done - hlen), (unsigned)(blen - (done - hlen)));
            nb = 1;
        } else {
            b[0] = uv_buf_init((char *)head + done, (unsigned)(hlen - done));
        }
    }
    c->s->wreq.data = c->s;
    int rc = uv_write(&c->s->wreq, (uv_stream_t *)&c->s->tcp, b, nb, write_cb);
    if (rc == 0) {
        c->writing = 1;
        /* libuv writes at once when it can: then the request is out even though write_cb
         * runs only on the next loop iteration (a fast answer may come first) */
        if (uv_stream_get_write_queue_size((uv_stream_t *)&c->s->tcp) == 0 && c->a)
            c->a->sent = 1;
    }
    return rc;
}

/* ---- connecting ---- */

static void connect_timeout_cb(uv_timer_t *t)
{
    upn_conn *c = t->data;
    if ((c->state == UPN_C_RESOLVING || c->state == UPN_C_CONNECTING) && c->a)
        kvr_upn__conn_failed(c->a, KVR_UP_CONNECT_TIMEOUT,
                             "no connection within connect_timeout_ms");
}

static void idle_timeout_cb(uv_timer_t *t)
{
    upn_conn *c = t->data;
    if (c->state == UPN_C_IDLE)
        kvr_upn__conn_close(c);
}

static void connect_cb(uv_connect_t *req, int status);

/* Next address: each one passes the egress hook first (a name that now resolves into a denied
 * range is refused). When none is left the attempt fails: egress_denied when the hook refused
 * them all, else connect. */
static void try_next(upn_conn *c)
{
    kvr_upn *u = c->u;
    upn_attempt *a = c->a;
    const kvr_upstream_opts *o = &u->opts;
    for (;;) {
        const struct sockaddr *sa = NULL;
        if (c->host->is_lit) {
            if (!c->tried_lit) {
                c->tried_lit = 1;
                sa = (const struct sockaddr *)&c->host->lit;
            }
        } else if (c->ai_next) {
            sa = c->ai_next->ai_addr;
            c->ai_next = c->ai_next->ai_next;
        }
        if (!sa) {
            if (c->denied && !c->last_err) {
                kvr_upn__conn_failed(a, KVR_UP_EGRESS_DENIED,
                                     "the egress policy refused every address of the worker");
            } else {
                snprintf(a->errmsg, sizeof(a->errmsg), "cannot connect to %s: %s",
                         c->host->authority, uv_strerror(c->last_err ? c->last_err : UV_EAI_NONAME));
                kvr_upn__conn_failed(a, KVR_UP_CONNECT, a->errmsg);
            }
            return;
        }
        if (o->allow_connect && !o->allow_connect(o->allow_connect_ud, a->url.data, sa)) {
            c->denied = 1;
            continue;
        }
        upn_sock *s = malloc(sizeof(*s));
        if (!s) {
            kvr_upn__conn_failed(a, KVR_UP_OTHER, "out of memory");
            return;
        }
        int rc = uv_tcp_init(u->loop, &s->tcp);
        if (rc < 0) {
            free(s);
            c->last_err = rc;
            continue;
        }
        s->tcp.data = s;
        s->c = c;
        s->creq.data = s;
        c->refs++;
        c->s = s;
        rc = uv_tcp_connect(&s->creq, &s->tcp, sa, connect_cb);
        if (rc < 0) {
            c->last_err = rc;
            sock_close(c);
            c->s = NULL;
            continue;
        }
        c->state = UPN_C_CONNECTING;
        return;
    }
}

static void connect_cb(uv_connect_t *req, int status)
{
    upn_sock *s = req->data;
    upn_conn *c = s->c;
    if (status == UV_ECANCELED || c->state != UPN_C_CONNECTING || c->s != s || !c->a)
        return;
    if (status < 0) {
        c->last_err = status;
        sock_close(c);
        c->s = NULL;
        try_next(c);
        return;
    }
    uv_timer_stop(&c->timer);
    uv_tcp_nodelay(&s->tcp, 1);
    c->state = UPN_C_ACTIVE;
    kvr_upn__use_conn(c->a, c);
}

static void gai_cb(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
    upn_conn *c = req->data;
    c->gai_busy = 0;
    c->refs--;
    if (c->state == UPN_C_CLOSED) {
        if (res)
            uv_freeaddrinfo(res);
        conn_maybe_free(c);
        return;
    }
    if (status < 0) {
        if (res)
            uv_freeaddrinfo(res);
        snprintf(c->a->errmsg, sizeof(c->a->errmsg), "cannot resolve %s: %s", c->host->name,
                 uv_strerror(status));
        kvr_upn__conn_failed(c->a, KVR_UP_CONNECT, c->a->errmsg);
        return;
    }
    c->ai = c->ai_next = res;
    c->state = UPN_C_CONNECTING;
    try_next(c);
}

/* A new connection for `a`, counted against the host's cap at once. */
static void conn_new(upn_host *h, upn_attempt *a)
{
    kvr_upn *u = a->u;
    upn_conn *c = calloc(1, sizeof(*c));
    if (!c) {
        kvr_upn__conn_failed(a, KVR_UP_OTHER, "out of memory");
        return;
    }
    c->u = u;
    c->host = h;
    h->nconns++;
    u->open_handles++; /* the connection as a whole */
    uv_timer_init(u->loop, &c->timer);
    c->timer.data = c;
    c->refs = 1;
    c->a = a;
    a->c = c;
    a->state = UPN_A_CONNECTING;
    if (u->opts.connect_timeout_ms)
        uv_timer_start(&c->timer, connect_timeout_cb, u->opts.connect_timeout_ms, 0);
    if (h->is_lit) {
        c->state = UPN_C_CONNECTING;
        try_next(c);
        return;
    }
    c->state = UPN_C_RESOLVING;
    struct addrinfo hints;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_ADDRCONFIG;
    c->gai.data = c;
    int rc = uv_getaddrinfo(u->loop, &c->gai, gai_cb, h->name, h->port, &hints);
    if (rc < 0) {
        snprintf(a->errmsg, sizeof(a->errmsg), "cannot resolve %s: %s", h->name, uv_strerror(rc));
        kvr_upn__conn_failed(a, KVR_UP_CONNECT, a->errmsg);
        return;
    }
    c->gai_busy = 1;
    c->refs++;
}

void kvr_upn__acquire(upn_attempt *a, int fresh_only)
{
    upn_host *h = a->host;
    kvr_upn *u = a->u;
    if (!fresh_only && h->idle_head) {
        upn_conn *c = h->idle_head;
        idle_unlink(c);
        uv_timer_stop(&c->timer);
        c->state = UPN_C_ACTIVE;
        kvr_upn__use_conn(a, c);
        return;
    }
    long cap = u->opts.max_host_connections;
    if (cap <= 0 || h->nconns < (size_t)cap || fresh_only) {
        conn_new(h, a);
        return;
    }
    a->state = UPN_A_WAITING;
    a->on_wait = 1;
    a->wnext = NULL;
    if (h->wait_tail)
        h->wait_tail->wnext = a;
    else
        h->wait_head = a;
    h->wait_tail = a;
}

void kvr_upn__release(upn_conn *c, int keep)
{
    kvr_upn *u = c->u;
    upn_host *h = c->host;
    if (!keep || u->closing || !c->s) {
        kvr_upn__conn_close(c);
        return;
    }
    if (c->writing) {
        /* The answer came before libuv reported the write done: its uv_write_t is still
         * pending, and a new request on this connection must not reuse it (write_cb releases
         * the connection instead). */
        c->release_pending = 1;
        return;
    }
    upn_attempt *w = wait_pop(h);
    if (w) {
        c->state = UPN_C_ACTIVE;
        kvr_upn__use_conn(w, c);
        return;
    }
    if (h->nidle >= u->opts.max_idle) {
        kvr_upn__conn_close(c);
        return;
    }
    c->state = UPN_C_IDLE;
    kvr_upn__rbuf_put(u, c->rbuf);
    c->rbuf = NULL;
    c->roff = c->rlen = 0;
    c->prev = NULL;
    c->next = h->idle_head;
    if (h->idle_head)
        h->idle_head->prev = c;
    h->idle_head = c;
    h->nidle++;
    if (u->opts.idle_timeout_ms)
        uv_timer_start(&c->timer, idle_timeout_cb, u->opts.idle_timeout_ms, 0);
    kvr_upn__read_start(c); /* (if not reading yet) into the scratch buffer: to see the
                             * worker close it */
}

/* ---- read buffers ---- */

char *kvr_upn__rbuf_get(kvr_upn *u)
{
    if (u->rbuf_free) {
        char *b = u->rbuf_free;
        memcpy(&u->rbuf_free, b, sizeof(void *));
        u->nrbuf_free--;
        return b;
    }
    return malloc(KVR_UPN_RBUF);
}

void kvr_upn__rbuf_put(kvr_upn *u, char *b)
{
    if (!b)
        return;
    if (u->closing || u->nrbuf_free >= KVR_UPN_RBUF_KEEP) {
        free(b);
        return;
    }
    memcpy(b, &u->rbuf_free, sizeof(void *));
    u->rbuf_free = b;
    u->nrbuf_free++;
}

/* ---- hosts ---- */

upn_host *kvr_upn__host(kvr_upn *u, const char *auth, size_t len)
{
    for (upn_host *h = u->hosts; h; h = h->next)
        if (h->authority_len == len && strncasecmp(h->authority, auth, len) == 0)
            return h;
    const char *name = auth, *port = NULL;
    size_t nl = len;
    if (len && auth[0] == '[') {
        const char *rb = memchr(auth, ']', len);
        if (!rb)
            return NULL;
        name = auth + 1;
        nl = (size_t)(rb - name);
        if (rb + 1 < auth + len) {
            if (rb[1] != ':')
                return NULL;
            port = rb + 2;
        }
    } else {
        const char *colon = memchr(auth, ':', len);
        if (colon) {
            nl = (size_t)(colon - auth);
            port = colon + 1;
        }
    }
    size_t pl = port ? (size_t)(auth + len - port) : 0;
    if (!nl || nl > 253 || (port && (pl == 0 || pl > 5)))
        return NULL;
    long pv = 80;
    if (port) {
        pv = 0;
        for (size_t i = 0; i < pl; i++) {
            if (port[i] < '0' || port[i] > '9')
                return NULL;
            pv = pv * 10 + (port[i] - '0');
        }
        if (pv < 1 || pv > 65535)
            return NULL;
    }
    upn_host *h = calloc(1, sizeof(*h));
    char *a = malloc(len + 1), *n = malloc(nl + 1);
    if (!h || !a || !n) {
        free(h);
        free(a);
        free(n);
        return NULL;
    }
    memcpy(a, auth, len);
    a[len] = '\0';
    memcpy(n, name, nl);
    n[nl] = '\0';
    h->authority = a;
    h->authority_len = len;
    h->name = n;
    snprintf(h->port, sizeof(h->port), "%ld", pv);
    struct sockaddr_in *s4 = (struct sockaddr_in *)&h->lit;
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&h->lit;
    if (uv_ip4_addr(n, (int)pv, s4) == 0 && !strchr(n, ':'))
        h->is_lit = 1;
    else if (uv_ip6_addr(n, (int)pv, s6) == 0 && strchr(n, ':'))
        h->is_lit = 1;
    h->next = u->hosts;
    u->hosts = h;
    return h;
}

void kvr_upn__hosts_shutdown(kvr_upn *u)
{
    while (u->hosts) {
        upn_host *h = u->hosts;
        u->hosts = h->next;
        while (h->idle_head)
            kvr_upn__conn_close(h->idle_head);
        free(h->authority);
        free(h->name);
        free(h);
    }
}
