/* The server side of the connection state machine: listener, accept, reads, deadlines, the
 * parse loop (one request at a time, pipelined bytes kept), handing requests to the handler,
 * release and reuse, lingering close, graceful drain and teardown.
 *
 * Memory rule: a connection (with its embedded request) is freed only once its three libuv
 * handles have closed AND the handler no longer owns the request, whichever comes last; the
 * server is freed once its own handles and every connection's handles have closed, detaching
 * connections whose request the handler still owns. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "http/internal.h"
#include "util/log.h"

void kvr_http_limits_default(kvr_http_limits *l)
{
    /* Every field, present and future, starts at 0 (= off): kvroute-sim's limits live on the
     * stack, and an unset max_connections_per_ip there once refused its own router. */
    memset(l, 0, sizeof(*l));
    l->max_header_bytes = 65536;
    l->max_headers = 256;
    l->max_body_bytes = 32u << 20;
    l->header_timeout_ms = 10000;
    l->body_timeout_ms = 60000;
    l->idle_timeout_ms = 60000;
    l->write_high_water = 65536;
    l->max_connections = 4096;
    l->max_total_body_bytes = (size_t)1 << 30;
}

static void fix_limits(kvr_http_limits *l)
{
    kvr_http_limits d;
    kvr_http_limits_default(&d);
    if (!l->max_header_bytes)
        l->max_header_bytes = d.max_header_bytes;
    if (l->max_header_bytes > (1u << 30))
        l->max_header_bytes = 1u << 30; /* offsets into the header buffer are 32-bit */
    if (!l->max_headers)
        l->max_headers = d.max_headers;
    if (!l->max_body_bytes)
        l->max_body_bytes = d.max_body_bytes;
    if (!l->header_timeout_ms)
        l->header_timeout_ms = d.header_timeout_ms;
    if (!l->body_timeout_ms)
        l->body_timeout_ms = d.body_timeout_ms;
    if (!l->idle_timeout_ms)
        l->idle_timeout_ms = d.idle_timeout_ms;
    if (!l->write_high_water)
        l->write_high_water = d.write_high_water;
    if (!l->max_connections)
        l->max_connections = d.max_connections;
    if (!l->max_total_body_bytes)
        l->max_total_body_bytes = d.max_total_body_bytes;
}

/* ---- connection lifecycle ---- */

static void on_timer(uv_timer_t *t);

/* One deadline per connection, whatever the state (idle, header, body, linger). Moving it later
 * (the common case: every request moves it) only stores the new time; the uv timer is re-armed
 * when it fires early or when the deadline moves earlier. That keeps timer-heap operations off
 * the per-request path (they were ~5% of CPU with a start/stop per state change). */
void kvr_http__arm_timer(kvr_http_conn *c, uint64_t ms)
{
    uint64_t due = uv_now(c->timer.loop) + ms;
    c->deadline = due;
    if (!c->timer_due || due < c->timer_due) {
        uv_timer_start(&c->timer, on_timer, ms, 0);
        c->timer_due = due;
    }
}

void kvr_http__stop_timer(kvr_http_conn *c)
{
    c->deadline = 0; /* the armed timer, if any, fires and finds nothing to do */
}

static void conn_free(kvr_http_conn *c)
{
    kvr_http_server *s = c->srv;
    if (s) {
        if (c->prev)
            c->prev->next = c->next;
        else
            s->conns = c->next;
        if (c->next)
            c->next->prev = c->prev;
    }
    kvr_buf_free(&c->in);
    kvr_buf_free(&c->out);
    kvr_buf_free(&c->wbuf);
    kvr_buf_free(&c->req.hbuf);
    if (s)
        s->body_total -= c->req.body_held;
    kvr_buf_free(&c->req.body);
    free(c->req.offs);
    free(c->req.hdrs);
    free(c);
}

static void server_finish(kvr_http_server *s)
{
    /* Connections left in the list have closed handles but a request the handler still owns:
     * they free themselves on resp_end/abort. */
    for (kvr_http_conn *c = s->conns; c; c = c->next)
        c->srv = NULL;
    void (*cb)(void *) = s->on_closed;
    void *ud = s->closed_ud;
    free(s);
    if (cb)
        cb(ud);
}

static void server_maybe_finish(kvr_http_server *s)
{
    if (s->closing && s->nhandles == 0 && s->nconns == 0)
        server_finish(s);
}

static void conn_handle_closed(kvr_http_conn *c)
{
    if (--c->nhandles)
        return;
    kvr_http_server *s = c->srv;
    if (!c->req.owned)
        conn_free(c);
    if (s) {
        s->nconns--;
        server_maybe_finish(s);
    }
}

static void on_tcp_closed(uv_handle_t *h)
{
    kvr_http_conn *c = h->data;
    kvr_http_req *r = &c->req;
    /* Told from the close callback, never from inside the resp_* call or read that found the
     * client gone, so the handler is not re-entered; still within the same loop iteration. */
    if (r->owned && r->gone && !r->gone_told) {
        r->gone_told = 1;
        if (r->cbs.on_client_gone)
            r->cbs.on_client_gone(r->cbs_ud);
    }
    conn_handle_closed(c);
}

static void on_timer_closed(uv_handle_t *h)
{
    conn_handle_closed(h->data);
}

void kvr_http__conn_close(kvr_http_conn *c)
{
    if (c->state == KVR_HTTP_C_CLOSED)
        return;
    c->state = KVR_HTTP_C_CLOSED;
    kvr_http__unflush(c);
    if (c->req.owned)
        c->req.gone = 1;
    uv_close((uv_handle_t *)&c->tcp, on_tcp_closed);
    uv_close((uv_handle_t *)&c->timer, on_timer_closed);
    uv_close((uv_handle_t *)&c->wtimer, on_timer_closed);
}

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    kvr_http_conn *c = h->data;
    buf->base = c->srv->rbuf;
    buf->len = sizeof(c->srv->rbuf);
}

static void read_cb(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);

/* Reading stays on while the handler owns a request, so EOF/RST is seen at once (reference
 * B.2: 5-10 ms instead of ~8 s). It stops only when pipelined input reaches the cap (and
 * after EOF). */
static void update_reading(kvr_http_conn *c)
{
    int want;
    switch (c->state) {
    case KVR_HTTP_C_IDLE:
    case KVR_HTTP_C_HEADERS:
    case KVR_HTTP_C_BODY:
    case KVR_HTTP_C_HANDLER:
        want = c->in.len < c->srv->pipeline_cap;
        break;
    case KVR_HTTP_C_CLOSING:
    case KVR_HTTP_C_LINGER:
        want = 1;
        break;
    default:
        return;
    }
    if (c->eof)
        want = 0;
    if (want && !c->reading) {
        int rc = uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, read_cb);
        if (rc < 0) {
            KVR_DEBUG("http: read start on %s failed: %s", c->peer, uv_strerror(rc));
            kvr_http__conn_close(c);
            return;
        }
        c->reading = 1;
    } else if (!want && c->reading) {
        uv_read_stop((uv_stream_t *)&c->tcp);
        c->reading = 0;
    }
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
    kvr_http_conn *c = req->data;
    if (status == UV_ECANCELED)
        return;
    if (status < 0 || c->eof)
        kvr_http__conn_close(c);
}

void kvr_http__start_shutdown(kvr_http_conn *c)
{
    if (c->state == KVR_HTTP_C_CLOSED || c->state == KVR_HTTP_C_LINGER)
        return;
    if (c->eof) {
        kvr_http__conn_close(c);
        return;
    }
    c->state = KVR_HTTP_C_LINGER;
    c->sreq.data = c;
    int rc = uv_shutdown(&c->sreq, (uv_stream_t *)&c->tcp, on_shutdown);
    if (rc < 0) {
        kvr_http__conn_close(c);
        return;
    }
    c->linger_bytes = 0;
    kvr_http__arm_timer(c, KVR_HTTP_LINGER_MS);
    update_reading(c);
}

static void on_timer(uv_timer_t *t)
{
    kvr_http_conn *c = t->data;
    c->timer_due = 0;
    if (!c->deadline)
        return;
    uint64_t now = uv_now(t->loop);
    if (now < c->deadline) {
        uv_timer_start(t, on_timer, c->deadline - now, 0);
        c->timer_due = c->deadline;
        return;
    }
    c->deadline = 0;
    switch (c->state) {
    case KVR_HTTP_C_IDLE:
        if (c->writing || c->out.len || c->in.len) {
            /* Still delivering a response: the write-stall timer covers a stuck client. */
            kvr_http__arm_timer(c, c->srv->lim.idle_timeout_ms);
            return;
        }
        KVR_DEBUG("http: closing idle connection %s", c->peer);
        kvr_http__conn_close(c);
        break;
    case KVR_HTTP_C_HEADERS:
        kvr_http__send_error(c, 408, "timed out reading the request headers");
        break;
    case KVR_HTTP_C_BODY:
        kvr_http__send_error(c, 408, "timed out reading the request body");
        break;
    case KVR_HTTP_C_LINGER:
        kvr_http__conn_close(c);
        break;
    default:
        break;
    }
}

/* ---- requests ---- */

static void dispatch(kvr_http_conn *c)
{
    kvr_http_server *s = c->srv;
    kvr_http__stop_timer(c);
    c->state = KVR_HTTP_C_HANDLER;
    c->req.owned = 1;
    s->active++;
    s->handler(&c->req, s->ud);
}

static int buffer_input(kvr_http_conn *c, const char *p, size_t n)
{
    if (kvr_buf_append(&c->in, p, n) < 0) {
        KVR_WARN("http: cannot buffer input from %s; closing", c->peer);
        kvr_http__conn_close(c);
        return -1;
    }
    update_reading(c);
    return 0;
}

/* Feeds bytes to the parser until they run out, a request goes to the handler and stays
 * there, output backs up, or the connection fails. `from_in` says `p` is c->in's data. A
 * handler that answers synchronously releases the request inside dispatch(); the loop then
 * goes on with the next pipelined request instead of recursing. */
static void conn_drive(kvr_http_conn *c, const char *p, size_t n, int from_in)
{
    size_t used = 0;
    c->in_drive = 1;
    while (used < n) {
        if (c->state == KVR_HTTP_C_IDLE &&
            kvr_http__pending(c) > c->srv->lim.write_high_water) {
            c->wait_out = 1; /* the client is not reading its responses: stop parsing */
            break;
        }
        if (c->state != KVR_HTTP_C_IDLE && c->state != KVR_HTTP_C_HEADERS &&
            c->state != KVR_HTTP_C_BODY)
            break;
        int res;
        size_t k = kvr_http__execute(c, p + used, n - used, &res);
        used += k;
        if (res < 0) {
            kvr_http__send_error(c, c->err_status ? c->err_status : 400, c->err_msg);
            break;
        }
        if (res > 0)
            dispatch(c);
        else if (k == 0)
            break;
    }
    c->in_drive = 0;
    if (c->state == KVR_HTTP_C_CLOSED)
        return;
    if (c->state == KVR_HTTP_C_CLOSING || c->state == KVR_HTTP_C_LINGER) {
        kvr_buf_reset(&c->in);
        return;
    }
    if (from_in) {
        kvr_buf_consume(&c->in, used);
        if (!c->in.len && c->in.alloc > KVR_HTTP_KEEP_ALLOC)
            kvr_buf_free(&c->in);
        update_reading(c);
    } else if (used < n) {
        buffer_input(c, p + used, n - used);
    }
}

void kvr_http__conn_resume(kvr_http_conn *c)
{
    if (c->in_drive || c->state != KVR_HTTP_C_IDLE)
        return;
    c->wait_out = 0;
    if (c->in.len)
        conn_drive(c, c->in.data, c->in.len, 1);
    else
        update_reading(c);
}

void kvr_http__req_release(kvr_http_req *r, int keep)
{
    kvr_http_conn *c = r->conn;
    kvr_http_server *s = c->srv;
    r->owned = 0;
    r->want_drain = 0;
    memset(&r->cbs, 0, sizeof(r->cbs));
    r->cbs_ud = NULL;
    if (s)
        s->active--;
    if (c->state == KVR_HTTP_C_CLOSED) {
        if (c->nhandles == 0)
            conn_free(c);
        return;
    }
    if (!keep || s->draining || c->eof) {
        kvr_http__close_after_flush(c);
        return;
    }
    kvr_http__parse_reset(c);
    c->state = KVR_HTTP_C_IDLE;
    kvr_http__arm_timer(c, s->lim.idle_timeout_ms);
    kvr_http__conn_resume(c);
}

static void read_end(kvr_http_conn *c, ssize_t nread)
{
    c->eof = 1;
    c->reading = 0; /* libuv stops reading on EOF by itself */
    if (nread != UV_EOF) {
        KVR_DEBUG("http: read from %s failed: %s", c->peer, uv_strerror((int)nread));
        kvr_http__conn_close(c);
        return;
    }
    switch (c->state) {
    case KVR_HTTP_C_CLOSING:
        return; /* finish flushing; start_shutdown() closes since eof is set */
    case KVR_HTTP_C_IDLE:
    case KVR_HTTP_C_HEADERS:
    case KVR_HTTP_C_BODY:
        /* A half-closed client still gets responses already produced; an unfinished request
         * cannot be answered. */
        if (c->writing || c->out.len)
            kvr_http__close_after_flush(c);
        else
            kvr_http__conn_close(c);
        return;
    default:
        /* HANDLER: the client left mid-response (a half-close counts: nginx treats it the
         * same). Closing marks the request gone; on_client_gone follows from the close
         * callback so the handler can cancel the upstream generation. */
        kvr_http__conn_close(c);
        return;
    }
}

static void read_cb(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    kvr_http_conn *c = st->data;
    if (nread == 0)
        return;
    if (nread < 0) {
        read_end(c, nread);
        return;
    }
    size_t n = (size_t)nread;
    switch (c->state) {
    case KVR_HTTP_C_LINGER:
        c->linger_bytes += n;
        if (c->linger_bytes > KVR_HTTP_LINGER_MAX_BYTES)
            kvr_http__conn_close(c);
        return;
    case KVR_HTTP_C_CLOSING:
    case KVR_HTTP_C_CLOSED:
        return;
    case KVR_HTTP_C_HANDLER:
        buffer_input(c, buf->base, n);
        return;
    default:
        if (c->wait_out || c->in.len)
            buffer_input(c, buf->base, n);
        else
            conn_drive(c, buf->base, n, 0);
        return;
    }
}

static void format_peer(kvr_http_conn *c)
{
    struct sockaddr_storage ss;
    int len = sizeof(ss);
    char ip[48]; /* INET6_ADDRSTRLEN */
    snprintf(c->peer, sizeof(c->peer), "unknown");
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &len) != 0)
        return;
    if (ss.ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&ss;
        if (uv_ip6_name(a, ip, sizeof(ip)) == 0) {
            snprintf(c->peer, sizeof(c->peer), "[%s]:%u", ip, (unsigned)ntohs(a->sin6_port));
            snprintf(c->ip, sizeof(c->ip), "%s", ip);
        }
    } else if (ss.ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)&ss;
        if (uv_ip4_name(a, ip, sizeof(ip)) == 0) {
            snprintf(c->peer, sizeof(c->peer), "%s:%u", ip, (unsigned)ntohs(a->sin_port));
            snprintf(c->ip, sizeof(c->ip), "%s", ip);
        }
    }
}

static void on_connection(uv_stream_t *ls, int status)
{
    kvr_http_server *s = ls->data;
    if (status < 0) {
        KVR_WARN("http: accept failed: %s", uv_strerror(status));
        return;
    }
    kvr_http_conn *c = s->nconns < s->lim.max_connections ? calloc(1, sizeof(*c)) : NULL;
    if (!c && s->nconns >= s->lim.max_connections) {
        /* Over --max-connections: take the pending fd and close it (the client sees a reset
         * or EOF), as an out-of-memory accept does below. */
        KVR_WARN("http: --max-connections %zu reached; refusing a connection",
                 s->lim.max_connections);
        if (s->listener.accepted_fd >= 0) {
            close(s->listener.accepted_fd);
            s->listener.accepted_fd = -1;
        }
        return;
    }
    if (!c) {
        /* libuv stops watching the listener until uv_accept() takes the pending fd (1.44
         * src/unix/stream.c uv__server_io); drop that connection so accepting goes on. */
        KVR_ERROR("http: out of memory accepting a connection; dropping it");
        if (s->listener.accepted_fd >= 0) {
            close(s->listener.accepted_fd);
            s->listener.accepted_fd = -1;
        }
        return;
    }
    const kvr_http_limits *l = &s->lim;
    c->srv = s;
    c->req.conn = c;
    kvr_buf_init(&c->in, s->pipeline_cap + KVR_HTTP_READ_BUF);
    kvr_buf_init(&c->out, s->out_cap);
    kvr_buf_init(&c->wbuf, s->out_cap);
    kvr_buf_init(&c->req.hbuf, 2 * l->max_header_bytes + 2 * l->max_headers + 64);
    kvr_buf_init(&c->req.body, l->max_body_bytes);
    uv_tcp_init(s->loop, &c->tcp);
    uv_timer_init(s->loop, &c->timer);
    uv_timer_init(s->loop, &c->wtimer);
    c->tcp.data = c->timer.data = c->wtimer.data = c;
    c->nhandles = 3;
    s->nconns++;
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    kvr_http__parse_reset(c);
    c->state = KVR_HTTP_C_IDLE;
    int rc = uv_accept(ls, (uv_stream_t *)&c->tcp);
    if (rc < 0) {
        KVR_WARN("http: accept failed: %s", uv_strerror(rc));
        kvr_http__conn_close(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1); /* SSE events must not wait for Nagle */
    format_peer(c);
    if (l->max_connections_per_ip && c->ip[0]) {
        /* Linear in open connections: bounded by --max-connections, and only on accept. */
        size_t same = 0;
        for (kvr_http_conn *o = s->conns; o; o = o->next)
            same += o != c && strcmp(o->ip, c->ip) == 0;
        if (same >= l->max_connections_per_ip) {
            KVR_WARN("http: --max-connections-per-ip %zu reached for %s; refusing a connection",
                     l->max_connections_per_ip, c->ip);
            kvr_http__conn_close(c);
            return;
        }
    }
    kvr_http__arm_timer(c, l->idle_timeout_ms);
    update_reading(c);
}

/* ---- server ---- */

/* http_parser's own header cap is process-wide (reference B.4); it is only raised, kept
 * above every server's max_header_bytes so that the per-connection count decides. */
static uint32_t g_parser_max_header = 80 * 1024;

kvr_http_server *kvr_http_server_new(uv_loop_t *loop, const kvr_http_limits *limits,
                                     kvr_http_handler handler, void *ud)
{
    kvr_http_server *s = calloc(1, sizeof(*s));
    if (!s)
        abort();
    s->loop = loop;
    if (limits)
        s->lim = *limits;
    else
        kvr_http_limits_default(&s->lim);
    fix_limits(&s->lim);
    s->pipeline_cap = s->lim.max_header_bytes > KVR_HTTP_PIPELINE_MIN ? s->lim.max_header_bytes
                                                                       : KVR_HTTP_PIPELINE_MIN;
    s->out_cap = s->lim.write_high_water * 64;
    if (s->out_cap < (64u << 20))
        s->out_cap = 64u << 20;
    s->handler = handler;
    s->ud = ud;
    s->port = -1;
    uv_prepare_init(loop, &s->prepare);
    s->prepare.data = s;
    s->nhandles = 1;
    uint64_t want = (uint64_t)s->lim.max_header_bytes * 2 + 65536;
    if (want > 0x7fffffff)
        want = 0x7fffffff;
    if (want > g_parser_max_header) {
        g_parser_max_header = (uint32_t)want;
        http_parser_set_max_header_size(g_parser_max_header);
    }
    return s;
}

static void server_handle_closed(uv_handle_t *h)
{
    kvr_http_server *s = h->data;
    s->nhandles--;
    server_maybe_finish(s);
}

static void close_listener(kvr_http_server *s)
{
    if (s->listener_state != 1)
        return;
    s->listener_state = 2;
    s->port = -1;
    uv_close((uv_handle_t *)&s->listener, server_handle_closed);
}

int kvr_http_server_listen(kvr_http_server *s, const char *host, int port)
{
    if (s->closing || s->draining)
        return UV_EINVAL;
    if (s->listener_state)
        return UV_EALREADY;
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof(ss));
    int rc = uv_ip4_addr(host, port, (struct sockaddr_in *)&ss);
    if (rc)
        rc = uv_ip6_addr(host, port, (struct sockaddr_in6 *)&ss);
    if (rc)
        return rc;
    rc = uv_tcp_init(s->loop, &s->listener);
    if (rc)
        return rc;
    s->listener.data = s;
    s->nhandles++;
    s->listener_state = 1;
    rc = uv_tcp_bind(&s->listener, (const struct sockaddr *)&ss, 0);
    if (!rc)
        rc = uv_listen((uv_stream_t *)&s->listener, 511, on_connection);
    if (rc) {
        close_listener(s);
        return rc;
    }
    struct sockaddr_storage name;
    int len = sizeof(name);
    rc = uv_tcp_getsockname(&s->listener, (struct sockaddr *)&name, &len);
    if (rc) {
        close_listener(s);
        return rc;
    }
    s->port = name.ss_family == AF_INET6
                  ? ntohs(((const struct sockaddr_in6 *)&name)->sin6_port)
                  : ntohs(((const struct sockaddr_in *)&name)->sin_port);
    return 0;
}

int kvr_http_server_port(const kvr_http_server *s)
{
    return s->listener_state == 1 ? s->port : -1;
}

size_t kvr_http_server_open_connections(const kvr_http_server *s)
{
    return s->nconns;
}

size_t kvr_http_server_active_requests(const kvr_http_server *s)
{
    return s->active;
}

size_t kvr_http_server_refusals(const kvr_http_server *s, int *status, uint64_t *count,
                                size_t cap)
{
    size_t n = s->nrefused < cap ? s->nrefused : cap;
    for (size_t i = 0; i < n; i++) {
        status[i] = s->refused[i].status;
        count[i] = s->refused[i].n;
    }
    return n;
}

void kvr_http_server_stop_accepting(kvr_http_server *s)
{
    if (s->draining)
        return;
    s->draining = 1;
    close_listener(s);
    kvr_http_conn *next;
    for (kvr_http_conn *c = s->conns; c; c = next) {
        next = c->next;
        if (c->state != KVR_HTTP_C_IDLE)
            continue; /* reading or answering a request: closes after its response */
        if (c->writing || c->out.len)
            kvr_http__close_after_flush(c);
        else
            kvr_http__conn_close(c);
    }
}

void kvr_http_server_close(kvr_http_server *s, void (*on_closed)(void *ud), void *ud)
{
    if (s->closing)
        return;
    s->closing = 1;
    s->draining = 1;
    s->on_closed = on_closed;
    s->closed_ud = ud;
    close_listener(s);
    uv_close((uv_handle_t *)&s->prepare, server_handle_closed);
    kvr_http_conn *next;
    for (kvr_http_conn *c = s->conns; c; c = next) {
        next = c->next;
        kvr_http__conn_close(c);
    }
}
