/* Unit tests of src/upstream: a real libuv loop drives the client against a tiny raw-socket
 * HTTP/1.1 server running in a thread on 127.0.0.1 (blocking sockets, one thread per
 * connection). Each request carries ?id=N so the server can report, per request, which TCP
 * connection served it, whether an Expect header came, the request head, and when it saw the
 * client disconnect. Every wait is bounded. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "upstream/impl.h"
#include "upstream/upstream.h"
#include "util/buf.h"
#include "util/time.h"

/* ------------------------------------------------------------------------------------------ */
/* Test server                                                                                 */
/* ------------------------------------------------------------------------------------------ */

#define MAX_IDS 1024

static struct {
    int lfd, port;
    pthread_t th;
    atomic_int stop;
    atomic_int conns;           /* accepted connections so far (connection numbers) */
    atomic_int live;            /* connection threads alive */
    atomic_int conn_of[MAX_IDS];   /* connection number that served request id */
    atomic_int expect_of[MAX_IDS]; /* request id carried an Expect header */
    atomic_int seen_of[MAX_IDS];   /* times request id reached the server */
    _Atomic uint64_t disc_ns[MAX_IDS]; /* when the server saw the client leave (0 = never) */
    pthread_mutex_t mu;
    char head_of[MAX_IDS][4096]; /* request head (truncated) */
} S;

static int next_id = 1;

static uint8_t pat(size_t i)
{
    return (uint8_t)(i ^ (i >> 8) ^ (i >> 16) ^ 0x5a);
}

static uint32_t sum_bytes(uint32_t s, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        s = s * 31u + (uint8_t)p[i];
    return s;
}

static __thread int cur_id; /* request being served by this thread */
static __thread int drop_next; /* "/armdrop" served: close on the next request, unanswered */

static void record_disconnect(int id)
{
    if (id > 0 && id < MAX_IDS && !atomic_load(&S.disc_ns[id]))
        atomic_store(&S.disc_ns[id], kvr_now_ns());
}

static int send_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            record_disconnect(cur_id); /* EPIPE / ECONNRESET: the client left */
            return -1;
        }
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

static int send_str(int fd, const char *s)
{
    return send_all(fd, s, strlen(s));
}

static int send_chunk(int fd, const char *s)
{
    char h[32];
    snprintf(h, sizeof(h), "%zx\r\n", strlen(s));
    if (send_str(fd, h) < 0 || send_str(fd, s) < 0 || send_str(fd, "\r\n") < 0)
        return -1;
    return 0;
}

/* Waits up to `ms` for the peer to close; returns 1 (and records it for `id`) if it did. */
static int wait_disconnect(int fd, int ms, int id)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, ms) > 0) {
        char c[512];
        ssize_t n = recv(fd, c, sizeof(c), MSG_DONTWAIT);
        if (n <= 0) {
            record_disconnect(id);
            return 1;
        }
    }
    return 0;
}

static long qint(const char *target, const char *key, long def)
{
    const char *q = strchr(target, '?');
    size_t kl = strlen(key);
    while (q) {
        q++;
        if (strncmp(q, key, kl) == 0 && q[kl] == '=')
            return strtol(q + kl + 1, NULL, 10);
        q = strchr(q, '&');
    }
    return def;
}

/* Serves one request; returns 1 to keep the connection for the next one. */
static int serve(int fd, const char *method, const char *path, const char *target, int id,
                 size_t body_len, uint32_t body_sum)
{
    char h[512];
    if (!strcmp(path, "/json")) {
        const char *b = "{\"id\":\"cmpl-1\",\"object\":\"chat.completion\","
                        "\"choices\":[{\"message\":{\"content\":\"h\\u00e9llo\"}}]}";
        snprintf(h, sizeof(h),
                 "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nX-Test:  abc \r\n"
                 "X-Empty:\r\nContent-Length: %zu\r\n\r\n",
                 strlen(b));
        return send_str(fd, h) == 0 && send_str(fd, b) == 0;
    }
    if (!strcmp(path, "/idleclose")) {
        /* a keep-alive answer, then the worker drops the idle connection (its keep-alive
         * timeout) while the client holds it in the pool */
        const char *m = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
        if (send_str(fd, m) < 0)
            return 0;
        usleep(50 * 1000);
        return 0;
    }
    if (!strcmp(path, "/echo")) {
        char b[128];
        snprintf(b, sizeof(b), "{\"len\":%zu,\"sum\":%u}", body_len, body_sum);
        snprintf(h, sizeof(h), "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n\r\n%s", strlen(b),
                 strcmp(method, "HEAD") ? b : "");
        return send_str(fd, h) == 0;
    }
    if (!strcmp(path, "/empty"))
        return send_str(fd, "HTTP/1.1 204 No Content\r\nX-E: 1\r\n\r\n") == 0;
    if (!strcmp(path, "/continue")) {
        if (send_str(fd, "HTTP/1.1 100 Continue\r\n\r\n") < 0)
            return 0;
        usleep(20 * 1000);
        return send_str(fd, "HTTP/1.1 200 OK\r\nX-Final: yes\r\nContent-Length: 2\r\n\r\nok") ==
               0;
    }
    if (!strcmp(path, "/sse")) {
        long n = qint(target, "n", 3), d = qint(target, "d", 10);
        if (send_str(fd, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         "Transfer-Encoding: chunked\r\n\r\n") < 0)
            return 0;
        for (long i = 0; i < n; i++) {
            char ev[64];
            snprintf(ev, sizeof(ev), "data: {\"i\":%ld}\n\n", i);
            if (send_chunk(fd, ev) < 0)
                return 0;
            if (d && wait_disconnect(fd, (int)d, id))
                return 0;
        }
        return send_chunk(fd, "data: [DONE]\n\n") == 0 && send_str(fd, "0\r\n\r\n") == 0;
    }
    if (!strcmp(path, "/stall")) {
        if (send_str(fd, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         "Transfer-Encoding: chunked\r\n\r\n") < 0 ||
            send_chunk(fd, "data: first\n\n") < 0)
            return 0;
        for (int i = 0; i < 100 && !wait_disconnect(fd, 100, id); i++)
            ;
        return 0;
    }
    if (!strcmp(path, "/noanswer")) {
        for (int i = 0; i < 100 && !wait_disconnect(fd, 100, id); i++)
            ;
        return 0;
    }
    if (!strcmp(path, "/close") || !strcmp(path, "/rst")) {
        char b[100];
        memset(b, 'x', sizeof(b));
        send_str(fd, "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n");
        send_all(fd, b, sizeof(b));
        usleep(20 * 1000);
        if (!strcmp(path, "/rst")) {
            struct linger lg = {.l_onoff = 1, .l_linger = 0};
            setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
        }
        return 0;
    }
    if (!strcmp(path, "/big")) {
        size_t n = (size_t)qint(target, "n", 1000);
        snprintf(h, sizeof(h), "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n\r\n", n);
        if (send_str(fd, h) < 0)
            return 0;
        char b[16384];
        for (size_t off = 0; off < n;) {
            size_t k = n - off < sizeof(b) ? n - off : sizeof(b);
            for (size_t i = 0; i < k; i++)
                b[i] = (char)pat(off + i);
            if (send_all(fd, b, k) < 0)
                return 0;
            off += k;
        }
        return 1;
    }
    if (!strcmp(path, "/manyhdr")) {
        char big[8192];
        size_t o = (size_t)snprintf(big, sizeof(big), "HTTP/1.1 200 OK\r\n");
        for (int i = 0; i < 100; i++)
            o += (size_t)snprintf(big + o, sizeof(big) - o, "X-R%d: v%d\r\n", i, i);
        snprintf(big + o, sizeof(big) - o, "Content-Length: 0\r\n\r\n");
        return send_str(fd, big) == 0;
    }
    if (!strcmp(path, "/armdrop")) {
        /* the answer keeps the connection alive, but the next request on it is dropped
         * unanswered: a keep-alive close that crossed the client's next request */
        drop_next = 1;
        return send_str(fd, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok") == 0;
    }
    if (!strcmp(path, "/dropnow"))
        return 0; /* closed without a byte of answer */
    if (!strcmp(path, "/trickle")) {
        /* one byte per send, chunk extensions and trailers included */
        const char *m = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                        "Transfer-Encoding: chunked\r\nX-A:  b \r\n\r\n"
                        "d;ext=1\r\ndata: hello\n\n\r\n10\r\ndata: [DONE]\n\n\r\n\r\n"
                        "0\r\nTrailer-X: y\r\n\r\n";
        for (const char *p = m; *p; p++) {
            if (send_all(fd, p, 1) < 0)
                return 0;
            usleep(200);
        }
        return 1;
    }
    if (!strcmp(path, "/badchunk"))
        return send_str(fd, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                            "zz\r\nhello\r\n0\r\n\r\n") == 0 && 0;
    if (!strcmp(path, "/overlong"))
        return send_str(fd, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA") == 0 && 0;
    if (!strcmp(path, "/http10")) {
        send_str(fd, "HTTP/1.0 200 OK\r\nX-V: 10\r\n\r\nread to the close");
        return 0;
    }
    if (!strcmp(path, "/connclose"))
        return send_str(fd, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n"
                            "\r\nok") == 0 && 0;
    if (!strcmp(path, "/garbage")) {
        send_str(fd, "FOO BAR BAZ\r\n\r\n");
        return 0;
    }
    send_str(fd, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
    return 1;
}

static void *conn_main(void *arg)
{
    int fd = (int)(intptr_t)arg;
    int cno = atomic_fetch_add(&S.conns, 1) + 1;
    static __thread char buf[65536];
    size_t have = 0;
    for (;;) {
        char *end;
        while (!(end = memmem(buf, have, "\r\n\r\n", 4))) {
            if (have == sizeof(buf))
                goto out;
            ssize_t r = recv(fd, buf + have, sizeof(buf) - have, 0);
            if (r <= 0)
                goto out;
            have += (size_t)r;
        }
        size_t hlen = (size_t)(end + 4 - buf);
        char head[4096];
        size_t cl = hlen < sizeof(head) ? hlen : sizeof(head) - 1;
        memcpy(head, buf, cl);
        head[cl] = '\0';
        char method[16], target[512];
        if (sscanf(head, "%15s %511s", method, target) != 2)
            goto out;
        char path[512];
        snprintf(path, sizeof(path), "%s", target);
        char *q = strchr(path, '?');
        if (q)
            *q = '\0';
        int id = (int)qint(target, "id", 0);
        if (id <= 0 || id >= MAX_IDS)
            id = 0;
        size_t body_len = 0;
        for (char *l = strstr(head, "\r\n"); l; l = strstr(l + 2, "\r\n")) {
            if (!strncasecmp(l + 2, "content-length:", 15))
                body_len = strtoul(l + 17, NULL, 10);
            if (!strncasecmp(l + 2, "expect:", 7))
                atomic_store(&S.expect_of[id], 1);
        }
        atomic_store(&S.conn_of[id], cno);
        atomic_fetch_add(&S.seen_of[id], 1);
        cur_id = id;
        pthread_mutex_lock(&S.mu);
        size_t keep = strlen(head) < sizeof(S.head_of[id]) ? strlen(head) : sizeof(S.head_of[id]) - 1;
        memcpy(S.head_of[id], head, keep);
        S.head_of[id][keep] = '\0';
        pthread_mutex_unlock(&S.mu);
        /* body: what is buffered after the head, then the socket */
        uint32_t sum = 0;
        size_t avail = have - hlen, take = avail < body_len ? avail : body_len;
        sum = sum_bytes(sum, buf + hlen, take);
        memmove(buf, buf + hlen + take, avail - take);
        have = avail - take;
        for (size_t left = body_len - take; left;) {
            char tmp[16384];
            ssize_t r = recv(fd, tmp, left < sizeof(tmp) ? left : sizeof(tmp), 0);
            if (r <= 0)
                goto out;
            sum = sum_bytes(sum, tmp, (size_t)r);
            left -= (size_t)r;
        }
        if (drop_next) {
            drop_next = 0;
            break;
        }
        if (!serve(fd, method, path, target, id, body_len, sum))
            break;
    }
out:
    close(fd);
    atomic_fetch_sub(&S.live, 1);
    return NULL;
}

static void *listen_main(void *arg)
{
    (void)arg;
    while (!atomic_load(&S.stop)) {
        int fd = accept(S.lfd, NULL, NULL);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            break;
        }
        int one = 1; /* the head and body go in separate sends: no Nagle delay between them */
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        atomic_fetch_add(&S.live, 1);
        pthread_t t;
        if (pthread_create(&t, NULL, conn_main, (void *)(intptr_t)fd) != 0) {
            close(fd);
            atomic_fetch_sub(&S.live, 1);
            continue;
        }
        pthread_detach(t);
    }
    return NULL;
}

static int bind_loopback(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
        return -1;
    socklen_t sl = sizeof(sa);
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    *port = ntohs(sa.sin_port);
    return fd;
}

static int server_start(void **state)
{
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    pthread_mutex_init(&S.mu, NULL);
    S.lfd = bind_loopback(&S.port);
    if (S.lfd < 0 || listen(S.lfd, 512) < 0)
        return -1;
    return pthread_create(&S.th, NULL, listen_main, NULL);
}

static int server_stop(void **state)
{
    (void)state;
    atomic_store(&S.stop, 1);
    shutdown(S.lfd, SHUT_RDWR);
    pthread_join(S.th, NULL);
    close(S.lfd);
    for (int i = 0; i < 300 && atomic_load(&S.live) > 0; i++)
        usleep(10 * 1000);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Client harness                                                                              */
/* ------------------------------------------------------------------------------------------ */

static uv_loop_t L;

static int loop_setup(void **state)
{
    (void)state;
    return uv_loop_init(&L);
}

static int loop_teardown(void **state)
{
    (void)state;
    /* Every handle must get closed: no timer or poll left behind. Bounded, so a test that
     * failed half-way (leaving its client open) fails instead of hanging the suite. */
    uint64_t deadline = uv_now(&L) + 5000;
    while (uv_run(&L, UV_RUN_NOWAIT) && uv_now(&L) < deadline)
        usleep(1000), uv_update_time(&L);
    return uv_loop_close(&L);
}

typedef struct rec rec;
struct rec {
    kvr_upstream *u;
    kvr_upstream_attempt *a;
    int id;
    /* observed */
    int status, n_head, n_body, done, got_headers, body_before_head, after_cancel;
    kvr_upstream_err err;
    char msg[256];
    kvr_buf body;
    char heads[8192];
    char first_piece[128];
    uint64_t t_start, t_first_body, t_done, t_cancel;
    /* behaviour */
    int pause_every;   /* refuse every k-th fresh offer */
    int pause_ms;      /* resume from a uv timer after this long */
    int resume_inside; /* call resume before returning 1 (deferred by the module) */
    int refused;       /* the next offer is a redelivery of refused bytes */
    int pauses;
    const char *refused_data;
    size_t refused_len;
    int cancel_after_bodies; /* cancel inside on_body after this many accepted pieces */
    int cancel_in_head;
    int cancelled;
    void (*done_hook)(rec *r);
    void (*head_hook)(rec *r);
    uv_timer_t t;
    int t_init;
};

static uint64_t now_ms(void)
{
    return kvr_now_ns() / 1000000u;
}

static void on_headers(void *ud, int status, const kvr_http_header *h, size_t n)
{
    rec *r = ud;
    if (r->cancelled)
        r->after_cancel++;
    r->n_head++;
    r->status = status;
    size_t off = strlen(r->heads);
    for (size_t i = 0; i < n; i++)
        off += (size_t)snprintf(r->heads + off, sizeof(r->heads) - off, "%.*s=[%.*s]\n",
                                (int)h[i].name_len, h[i].name, (int)h[i].value_len, h[i].value);
    if (r->head_hook)
        r->head_hook(r);
    if (r->cancel_in_head) {
        r->cancelled = 1;
        r->t_cancel = kvr_now_ns();
        kvr_upstream_cancel(r->a);
    }
}

static void resume_timer_cb(uv_timer_t *t)
{
    rec *r = t->data;
    kvr_upstream_resume(r->a);
}

static int on_body(void *ud, const char *data, size_t len)
{
    rec *r = ud;
    if (r->cancelled)
        r->after_cancel++;
    if (!r->n_head)
        r->body_before_head = 1;
    if (!r->t_first_body) {
        r->t_first_body = now_ms();
        snprintf(r->first_piece, sizeof(r->first_piece), "%.*s", (int)len, data);
    }
    if (r->refused) {
        /* libcurl must offer the refused bytes again first (it may add more after them) */
        if (len < r->refused_len || memcmp(data, r->refused_data, r->refused_len) != 0)
            fail_msg("redelivery differs from the refused bytes");
        r->refused = 0;
    } else if (r->pause_every && ++r->n_body % r->pause_every == 0) {
        r->refused = 1;
        r->pauses++;
        /* remember a copy: `data` is only valid during the call */
        static char copy[65536];
        size_t k = len < sizeof(copy) ? len : sizeof(copy);
        memcpy(copy, data, k);
        r->refused_data = copy;
        r->refused_len = k;
        if (r->resume_inside) {
            kvr_upstream_resume(r->a);
        } else {
            if (!r->t_init) {
                uv_timer_init(&L, &r->t);
                r->t.data = r;
                r->t_init = 1;
            }
            uv_timer_start(&r->t, resume_timer_cb, (uint64_t)r->pause_ms, 0);
        }
        return 1;
    }
    if (!r->pause_every)
        r->n_body++;
    kvr_buf_append(&r->body, data, len);
    if (r->cancel_after_bodies && r->n_body >= r->cancel_after_bodies && !r->cancelled) {
        r->cancelled = 1;
        r->t_cancel = kvr_now_ns();
        kvr_upstream_cancel(r->a);
    }
    return 0;
}

static void on_done(void *ud, kvr_upstream_err err, const char *msg, int got_headers)
{
    rec *r = ud;
    if (r->cancelled)
        r->after_cancel++;
    r->done++;
    r->err = err;
    r->got_headers = got_headers;
    snprintf(r->msg, sizeof(r->msg), "%s", msg ? msg : "");
    r->t_done = now_ms();
    if (r->done_hook)
        r->done_hook(r);
}

static const kvr_upstream_cbs CBS = {on_headers, on_body, on_done};

static void rec_init(rec *r, kvr_upstream *u)
{
    memset(r, 0, sizeof(*r));
    r->u = u;
    r->id = next_id++;
    kvr_buf_init(&r->body, 64u << 20);
}

static void rec_free(rec *r)
{
    kvr_buf_free(&r->body);
    if (r->t_init) {
        uv_close((uv_handle_t *)&r->t, NULL);
        r->t_init = 0;
        uv_run(&L, UV_RUN_NOWAIT); /* the close completes before the rec goes away */
    }
}

static void url_for(char *out, size_t n, int port, const char *path, int id, const char *extra)
{
    snprintf(out, n, "http://127.0.0.1:%d%s?id=%d%s%s", port, path, id, extra ? "&" : "",
             extra ? extra : "");
}

static kvr_upstream_attempt *start(rec *r, const char *method, const char *path,
                                   const char *extra, const char *body, size_t len)
{
    char url[256];
    url_for(url, sizeof(url), S.port, path, r->id, extra);
    r->t_start = now_ms();
    r->a = kvr_upstream_start(r->u, method, url, NULL, 0, body, len, &CBS, r);
    return r->a;
}

static void noop_cb(uv_timer_t *t)
{
    (void)t;
}

typedef int (*pred_fn)(void *arg);

/* Runs the loop until pred(arg) holds or ms pass; returns whether it holds. */
static int run_until(pred_fn pred, void *arg, int ms)
{
    uv_timer_t guard;
    uv_timer_init(&L, &guard);
    uv_timer_start(&guard, noop_cb, 5, 5);
    uint64_t end = now_ms() + (uint64_t)ms;
    while (!(pred && pred(arg)) && now_ms() < end)
        uv_run(&L, UV_RUN_ONCE);
    uv_close((uv_handle_t *)&guard, NULL);
    uv_run(&L, UV_RUN_NOWAIT);
    return pred ? pred(arg) : 0;
}

static void run_for(int ms)
{
    run_until(NULL, NULL, ms);
}

static int is_done(void *arg)
{
    return ((rec *)arg)->done > 0;
}

static int has_body(void *arg)
{
    return ((rec *)arg)->body.len > 0;
}

static int has_head(void *arg)
{
    return ((rec *)arg)->n_head > 0;
}

/* Every test runs once per client (main): native, then libcurl. */
static kvr_upstream_client g_client = KVR_UP_CLIENT_NATIVE;

static kvr_upstream *new_client(uint64_t first_byte, uint64_t idle, long max_host)
{
    kvr_upstream_opts o;
    kvr_upstream_opts_default(&o);
    o.client = g_client;
    o.connect_timeout_ms = 2000;
    if (first_byte)
        o.first_byte_timeout_ms = first_byte;
    if (idle)
        o.stream_idle_timeout_ms = idle;
    o.max_host_connections = max_host;
    return kvr_upstream_new(&L, &o);
}

static void close_client(kvr_upstream *u)
{
    kvr_upstream_close(u);
    uv_run(&L, UV_RUN_DEFAULT);
}

static uint64_t server_disc_ns(int id, int wait_ms)
{
    for (int i = 0; i < wait_ms && !atomic_load(&S.disc_ns[id]); i++)
        run_for(1);
    return atomic_load(&S.disc_ns[id]);
}

/* ------------------------------------------------------------------------------------------ */
/* Tests                                                                                       */
/* ------------------------------------------------------------------------------------------ */

static void test_json_relayed_exactly(void **state)
{
    (void)state;
    kvr_upstream *u = new_client(0, 0, 0);
    rec r;
    rec_init(&r, u);
    const char *req = "{\"model\":\"m\",\"messages\":[]}";
    kvr_http_header h[] = {
        {"X-Req", 5, "42", 2},
        {"Content-Type", 12, "application/json", 16},
        {"Host", 4, "evil.example", 12},     /* computed by the client: dropped */
        {"Content-Length", 14, "999", 3},    /* computed by the client: dropped */
        {"X-Blank", 7, "", 0},
    };
    char url[256];
    url_for(url, sizeof(url), S.port, "/json", r.id, NULL);
    r.a = kvr_upstream_start(u, "POST", url, h, 5, req, strlen(req), &CBS, &r);
    assert_non_null(r.a);
    assert_int_equal(kvr_upstream_active(u), 1);
    assert_true(run_until(is_done, &r, 3000));

    assert_int_equal(r.err, KVR_UP_OK);
    assert_int_equal(r.done, 1);
    assert_int_equal(r.n_head, 1);
    assert_int_equal(r.got_headers, 1);
    assert_false(r.body_before_head);
    assert_int_equal(r.status, 201);
    const char *want = "{\"id\":\"cmpl-1\",\"object\":\"chat.completion\","
                       "\"choices\":[{\"message\":{\"content\":\"h\\u00e9llo\"}}]}";
    assert_int_equal(r.body.len, strlen(want));
    assert_memory_equal(r.body.data, want, strlen(want));
    assert_non_null(strstr(r.heads, "Content-Type=[application/json]\n"));
    assert_non_null(strstr(r.heads, "X-Test=[abc]\n"));
    assert_non_null(strstr(r.heads, "X-Empty=[]\n"));
    assert_null(strstr(r.heads, "HTTP/1.1"));
    assert_int_equal(kvr_upstream_active(u), 0);

    /* what the worker received */
    const char *got = S.head_of[r.id];
    char line[128];
    snprintf(line, sizeof(line), "POST /json?id=%d HTTP/1.1\r\n", r.id);
    assert_true(strncmp(got, line, strlen(line)) == 0);
    snprintf(line, sizeof(line), "Host: 127.0.0.1:%d\r\n", S.port);
    assert_non_null(strstr(got, line));
    assert_non_null(strstr(got, "X-Req: 42\r\n"));
    assert_non_null(strstr(got, "X-Blank:"));
    assert_non_null(strstr(got, "Content-Type: application/json\r\n"));
    snprintf(line, sizeof(line), "Content-Length: %zu\r\n", strlen(req));
    assert_non_null(strstr(got, line));
    assert_null(strstr(got, "evil"));
    assert_null(strstr(got, "Content-Length: 999")); /* (the port may contain 999) */
    assert_null(strstr(got, "Expect"));
    assert_null(strstr(got, "Accept:"));
    rec_free(&r);
    close_client(u);
}

static void test_empty_body_and_interim(void **state)
{
    (void)state;
    kvr_upstream *u = new_client(0, 0, 0);
    rec r;
    rec_init(&r, u);
    assert_non_null(start(&r, "GET", "/empty", NULL, NULL, 0));
    assert_true(run_until(is_done, &r, 3000));
    assert_int_equal(r.err, KVR_UP_OK);
    assert_int_equal(r.n_head, 1);
    assert_int_equal(r.status, 204);
    assert_int_equal(r.body.len, 0);
    assert_non_null(strstr(r.heads, "X-E=[1]"));
    /* Content-Type/Accept are not invented for a GET either */
    assert_null(strstr(S.head_of[r.id], "Content-Type"));
    assert_null(strstr(S.head_of[r.id], "Accept"));

    rec c;
    rec_init(&c, u);
    assert_non_null(start(&c, "GET", "/continue", NULL, NULL, 0));
    assert_true(run_until(is_done, &c, 3000));
    assert_int_equal(c.err, KVR_UP_OK);
    assert_int_equal(c.n_head, 1); /* the 100 Continue head is not delivered */
    assert_int_equal(c.status, 200);
    assert_non_null(strstr(c.heads, "X-Final=[yes]"));
    assert_int_equal(c.body.len, 2);
    assert_memory_equal(c.body.data, "ok", 2);
    rec_free(&r);
    rec_free(&c);
    close_client(u);
}

static void test_sse_incremental(void **state)
{
    (void)state;
    kvr_upstream *u = new_client(0, 0, 0);
    rec r;
    rec_init(&r, u);
    assert_non_null(start(&r, "GET", "/sse", "n=5&d=60", NULL, 0));
    assert_true(run_until(is_done, &r, 5000));
    assert_int_equal(r.err, KVR_UP_OK);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.heads, "Content-Type=[text/event-stream]"));
    /* the first piece handed over was the first event alone, long before the end */
    assert_string_equal(r.first_piece, "data: {\"i\":0}\n\n");
    assert_true(r.n_body >= 5);
    assert_true(r.t_done - r.t_first_body >= 150);
    const char *want = "data: {\"i\":0}\n\ndata: {\"i\":1}\n\ndata: {\"i\":2}\n\n"
                       "data: {\"i\":3}\n\ndata: {\"i\":4}\n\ndata: [DONE]\n\n";
    assert_int_equal(r.body.len, strlen(want));
    assert_memory_equal(r.body.data, want, strlen(want));
    rec_free(&r);
    close_client(u);
}

static void check_pattern(const rec *r, size_t n)
{
    assert_int_equal(r->body.len, n);
    for (size_t i = 0; i < n; i++)
        if ((uint8_t)r->body.data[i] != pat(i))
            fail_msg("byte %zu differs", i);
}

static void test_pause_resume(void **state)
{
    (void)state;
    const size_t n = 2u << 20;
    kvr_upstream *u = new_client(0, 0, 0);
    /* resumed from a timer (outside libcurl: the held bytes come back inside resume) */
    rec r;
    rec_init(&r, u);
    r.pause_every = 3;
    r.pause_ms = 1;
    assert_non_null(start(&r, "GET", "/big", "n=2097152", NULL, 0));
    assert_true(run_until(is_done, &r, 8000));
    assert_int_equal(r.err, KVR_UP_OK);
    assert_true(r.pauses > 5);
    check_pattern(&r, n);

    /* resume asked for inside on_body before it returns 1: deferred, same result */
    rec s;
    rec_init(&s, u);
    s.pause_every = 2;
    s.resume_inside = 1;
    assert_non_null(start(&s, "GET", "/big", "n=2097152", NULL, 0));
    assert_true(run_until(is_done, &s, 8000));
    assert_int_equal(s.err, KVR_UP_OK);
    assert_true(s.pauses > 5);
    check_pattern(&s, n);
    rec_free(&r);
    rec_free(&s);
    close_client(u);
}

static void test_pause_is_not_idle(void **state)
{
    (void)state;
    /* idle limit 100 ms, but we hold the stream paused for 300 ms ourselves */
    kvr_upstream *u = new_client(0, 100, 0);
    rec r;
    rec_init(&r, u);
    r.pause_every = 1;
    r.pause_ms = 300;
    assert_non_null(start(&r, "GET", "/sse", "n=2&d=10", NULL, 0));
    assert_true(run_until(is_done, &r, 5000));
    assert_int_equal(r.err, KVR_UP_OK);
    assert_true(r.t_done - r.t_start >= 300);
    const char *want = "data: {\"i\":0}\n\ndata: {\"i\":1}\n\ndata: [DONE]\n\n";
    assert_int_equal(r.body.len, strlen(want));
    assert_memory_equal(r.body.data, want, strlen(want));
    rec_free(&r);
    close_client(u);
}

static void cancel_timer_cb(uv_timer_t *t)
{
    rec *r = t->data;
    r->cancelled = 1;
    r->t_cancel = kvr_now_ns();
    kvr_upstream_cancel(r->a);
}

static void check_cancelled(rec *r, kvr_upstream *u)
{
    run_for(150);
    assert_int_equal(r->after_cancel, 0);
    assert_int_equal(r->done, 0);
    assert_int_equal(kvr_upstream_active(u), 0);
    uint64_t d = server_disc_ns(r->id, 500);
    if (!d)
        fail_msg("worker never saw request %d disconnect (head %d, bodies %d)", r->id, r->n_head, r->n_body);
    uint64_t ms = d > r->t_cancel ? (d - r->t_cancel) / 1000000u : 0;
    if (ms >= 100)
        fail_msg("worker saw the disconnect %llu ms after cancel", (unsigned long long)ms);
}

static void test_cancel_from_loop(void **state)
{
    (void)state;
    kvr_upstream *u = new_client(0, 0, 0);
    rec r;
    rec_init(&r, u);
    assert_non_null(start(&r, "GET", "/sse", "n=500&d=20", NULL, 0));
    assert_true(run_until(has_body, &r, 3000));
    uv_timer_t t;
    uv_timer_init(&L, &t);
    t.data = &r;
    uv_timer_start(&t, cancel_timer_cb, 30, 0);
    run_for(60);
    assert_true(r.cancelled);
    check_cancelled(&r, u);
    uv_close((uv_handle_t *)&t, NULL);
    rec_free(&r);
    close_client(u);
}

static void test_cancel_inside_callbacks(void **state)
{
    (void)state;
    kvr_upstream *u = new_client(0, 0, 0);
    rec r;
    rec_init(&r, u);
    r.cancel_after_bodies = 2;
    assert_non_null(start(&r, "GET", "/sse", "n=500&d=20", NULL, 0));
    run_for(400);
    assert_true(r.cancelled);
    check_cancelled(&r, u);

    rec h;
    rec_init(&h, u);
    h.cancel_in_head = 1;
    assert_non_null(start(&h, "GET", "/stall", NULL, NULL, 0));
    assert_true(run_until(has_head, &h, 3000));
    assert_int_equal(h.n_body, 0);
    check_cancelled(&h, u);
    rec_free(&r);
    rec_free(&h);
    close_client(u);
}

static void test_connect_refused(void **state)
{
    (void)state;
    int port;
    int fd = bind_loopback(&port); /* bound, never listening: connections are refused */
    assert_true(fd >= 0);
    kvr_upstream *u = new_client(0, 0, 0);
    rec r;
    rec_init(&r, u);
    char url[128];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/v1/chat/completions", port);
    r.a = kvr_upstream_start(u, "POST", url, NULL, 0, "{}", 2, &CBS, &r);
    assert_non_null(r.a);
    assert_true(run_until(is_done, &r, 3000));
    assert_int_equal(r.err, KVR_UP_CONNECT);
    assert_string_equal(kvr_upstream_err_name(r.err), "connect");
    assert_int_equal(r.got_headers, 0);
    assert_int_equal(r.n_head, 0);
    assert_true(r.msg[0] != '\0');
    close(fd);
    rec_free(&r);
    close_client(u);
}

static void test_connect_timeout(void **state)
{
    (void)state;
    /* A listener that never accepts, with its accept queue full: further SYNs are dropped. */
    int port;
    int lfd = bind_loopback(&port);
    assert_true(lfd >= 0);
    assert_int_equal(listen(lfd, 0), 0);
    int fill[4];
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    for (int i = 0; i < 4; i++) {
        fill[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        (void)connect(fill[i], (struct sockaddr *)&sa, sizeof(sa));
    }
    /* Wait until the queue is really full (the first fills connected), not a fixed time: on a
     * loaded machine 50 ms was not always enough and the client then connected. */
    struct pollfd pf = {.fd = fill[0], .events = POLLOUT};
    (void)poll(&pf, 1, 2000);
    usleep(50 * 1000);
    kvr_upstream_opts o;
    kvr_upstream_opts_default(&o);
    o.connect_timeout_ms = 200;
    o.client = g_client;
    kvr_upstream *u = kvr_upstream_new(&L, &o);
    rec r;
    rec_init(&r, u);
    char url[128];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/x", port);
    r.t_start = now_ms();
    r.a = kvr_upstream_start(u, "GET", url, NULL, 0, NULL, 0, &CBS, &r);
    assert_non_null(r.a);
    assert_true(run_until(is_done, &r, 3000));
    assert_int_equal(r.err, KVR_UP_CONNECT_TIMEOUT);
    assert_int_equal(r.got_headers, 0);
    assert_true(r.t_done - r.t_start < 1000);
    for (int i = 0; i < 4; i++)
        close(fill[i]);
    close(lfd);
    rec_free(&r);
    close_client(u);
}

static void test_first_byte_timeout(void **state)
{
    (void)state;
    kvr_upstream *u = new_client(200, 0, 0);
    rec r;
    rec_init(&r, u);
    assert_non_null(start(&r, "POST", "/noanswer", NULL, "{}", 2));
    assert_true(run_until(is_done, &r, 3000));
    assert_int_equal(r.err, KVR_UP_FIRST_BYTE_TIMEOUT);
    assert_string_equal(kvr_upstream_err_name(r.err), "first_byte_timeout");
    assert_int_equal(r.got_headers, 0);
    assert_true(r.t_done - r.t_start >= 190);
    assert_true(server_disc_ns(r.id, 500) != 0); /* the worker is told to stop */
    rec_free(&r);
    close_client(u);
}

static void test_stream_idle_timeout(void **state)
{
    (void)state;
    kvr_upstream *u = new_client(0, 200, 0);
    rec r;
    rec_init(&r, u);
    assert_non_null(start(&r, "GET", "/stall", NULL, NULL, 0));
    assert_true(run_until(is_done, &r, 3000));
    assert_int_equal(r.err, KVR_UP_IDLE_TIMEOUT);
    assert_string_equal(kvr_upstream_err_name(r.err), "stream_idle_timeout");
    assert_int_equal(r.got_headers, 1);
    assert_int_equal(r.n_head, 1);
    assert_int_equal(r.body.len, strlen("data: first\n\n"));
    assert_true(r.t_done - r.t_first_body >= 190);
    assert_true(server_disc_ns(r.id, 500) != 0);
    rec_free(&r);
    close_client(u);
}

static void test_reset_mid_body(void **state)
{
    (void)state;
    kvr_upstream *u = new_client(0, 0, 0);
    rec r, s;
    rec_init(&r, u);
    rec_init(&s, u);
    assert_non_null(start(&r, "GET", "/close", NULL, NULL, 0));
    assert_non_null(start(&s, "GET", "/rst", NULL, NULL, 0));
    assert_true(run_until(is_done, &r, 3000));
    assert_true(run_until(is_done, &s, 3000));
    assert_int_equal(r.err, KVR_UP_RESET);
    assert_int_equal(r.got_headers, 1);
    assert_int_equal(r.body.len, 100);
    assert_int_equal(s.err, KVR_UP_RESET);
    assert_int_equal(s.got_headers, 1);
    assert_string_equal(kvr_upstream_err_name(KVR_UP_RESET), "reset");
    rec_free(&r);
    rec_free(&s);
    close_client(u);
}

static void test_protocol_error(void **state)
{
    (void)state;
    kvr_upstream *u = new_client(0, 0, 0);
    rec r;
    rec_init(&r, u);
    assert_non_null(start(&r, "GET", "/garbage", NULL, NULL, 0));
    assert_true(run_until(is_done, &r, 3000));
    assert_int_equal(r.err, KVR_UP_PROTOCOL);
    assert_int_equal(r.got_headers, 0);
    rec_free(&r);
    close_client(u);
}

static rec reuse2;
static void start_second(rec *r)
{
    /* from inside on_done: the first connection is back in the pool already */
    assert_non_null(start(&reuse2, "GET", "/json", NULL, NULL, 0));
    (void)r;
}

static void test_connection_reuse(void **state)
{
    (void)state;
    kvr_upstream *u = new_client(0, 0, 0);
    rec a, c;
    rec_init(&a, u);
    rec_init(&reuse2, u);
    rec_init(&c, u);
    a.done_hook = start_second;
    assert_non_null(start(&a, "POST", "/json", NULL, "{}", 2));
    assert_true(run_until(is_done, &a, 3000));
    assert_true(run_until(is_done, &reuse2, 3000));
    assert_non_null(start(&c, "GET", "/json", NULL, NULL, 0));
    assert_true(run_until(is_done, &c, 3000));
    assert_int_equal(a.err, KVR_UP_OK);
    assert_int_equal(reuse2.err, KVR_UP_OK);
    assert_int_equal(c.err, KVR_UP_OK);
    int c1 = atomic_load(&S.conn_of[a.id]);
    assert_true(c1 > 0);
    assert_int_equal(atomic_load(&S.conn_of[reuse2.id]), c1);
    assert_int_equal(atomic_load(&S.conn_of[c.id]), c1);
    rec_free(&a);
    rec_free(&reuse2);
    rec_free(&c);
    close_client(u);
}

static int count_iterations_for(int ms)
{
    uv_timer_t guard;
    uv_timer_init(&L, &guard);
    uv_timer_start(&guard, noop_cb, 5, 5);
    int n = 0;
    uint64_t end = now_ms() + (uint64_t)ms;
    while (now_ms() < end) {
        uv_run(&L, UV_RUN_ONCE);
        n++;
    }
    uv_close((uv_handle_t *)&guard, NULL);
    uv_run(&L, UV_RUN_NOWAIT);
    return n;
}

/* The worker closes a pooled connection while it is idle (keep-alive timeout): the client must
 * not spin on the EOF of a socket no transfer watches, and the next request must work (on a
 * new connection). */
static void test_pooled_connection_closed_by_worker(void **state)
{
    (void)state;
    kvr_upstream *u = new_client(0, 0, 0);
    rec a, b, c;
    rec_init(&a, u);
    rec_init(&b, u);
    rec_init(&c, u);
    assert_non_null(start(&a, "GET", "/idleclose", NULL, NULL, 0));
    assert_true(run_until(is_done, &a, 3000));
    assert_int_equal(a.err, KVR_UP_OK);
    assert_int_equal(a.body.len, 2);
    assert_memory_equal(a.body.data, "ok", 2);
    /* the worker closes after 50 ms; a loop spinning on the EOF would run thousands of
     * iterations in 300 ms, a quiet one about 60 (one per 5 ms guard tick) */
    int iters = count_iterations_for(300);
    assert_true(iters < 1000);
    assert_non_null(start(&b, "GET", "/json", NULL, NULL, 0));
    assert_true(run_until(is_done, &b, 3000));
    assert_int_equal(b.err, KVR_UP_OK);
    assert_int_equal(b.status, 201);
    int ca = atomic_load(&S.conn_of[a.id]), cb = atomic_load(&S.conn_of[b.id]);
    assert_true(ca > 0 && cb > 0 && ca != cb);
    /* and the new connection is pooled and reused as usual */
    assert_non_null(start(&c, "POST", "/echo", NULL, "abc", 3));
    assert_true(run_until(is_done, &c, 3000));
    assert_int_equal(c.err, KVR_UP_OK);
    assert_int_equal(atomic_load(&S.conn_of[c.id]), cb);
    rec_free(&a);
    rec_free(&b);
    rec_free(&c);
    close_client(u);
}

static void test_big_post_no_expect(void **state)
{
    (void)state;
    const size_t n = 2u << 20;
    char *body = malloc(n);
    assert_non_null(body);
    for (size_t i = 0; i < n; i++)
        body[i] = (char)pat(i * 3);
    kvr_upstream *u = new_client(0, 0, 0);
    rec r;
    rec_init(&r, u);
    assert_non_null(start(&r, "POST", "/echo", NULL, body, n));
    assert_true(run_until(is_done, &r, 5000));
    assert_int_equal(r.err, KVR_UP_OK);
    char want[128];
    snprintf(want, sizeof(want), "{\"len\":%zu,\"sum\":%u}", n, sum_bytes(0, body, n));
    assert_int_equal(r.body.len, strlen(want));
    assert_memory_equal(r.body.data, want, strlen(want));
    assert_int_equal(atomic_load(&S.expect_of[r.id]), 0);
    /* libcurl's "Expect: 100-continue" would have stalled it for a full second */
    assert_true(r.t_done - r.t_start < 900);
    free(body);
    rec_free(&r);
    close_client(u);
}

#define NCONC 64
static int all_done(void *arg)
{
    rec *rs = arg;
    for (int i = 0; i < NCONC; i++)
        if (!rs[i].done)
            return 0;
    return 1;
}

static void test_many_concurrent(void **state)
{
    (void)state;
    kvr_upstream *u = new_client(0, 0, 8);
    static rec rs[NCONC];
    for (int i = 0; i < NCONC; i++) {
        rec_init(&rs[i], u);
        if (i % 2)
            assert_non_null(start(&rs[i], "GET", "/sse", "n=3&d=5", NULL, 0));
        else
            assert_non_null(start(&rs[i], "POST", "/json", NULL, "{}", 2));
    }
    assert_int_equal(kvr_upstream_active(u), NCONC);
    assert_true(run_until(all_done, rs, 10000));
    int seen[MAX_IDS] = {0}, conns = 0;
    for (int i = 0; i < NCONC; i++) {
        assert_int_equal(rs[i].err, KVR_UP_OK);
        assert_int_equal(rs[i].done, 1);
        if (i % 2)
            assert_int_equal(rs[i].body.len, 3 * strlen("data: {\"i\":0}\n\n") +
                                                 strlen("data: [DONE]\n\n"));
        else
            assert_int_equal(rs[i].status, 201);
        int c = atomic_load(&S.conn_of[rs[i].id]);
        assert_true(c > 0 && c < MAX_IDS);
        if (!seen[c]++)
            conns++;
    }
    assert_true(conns <= 8); /* max_host_connections */
    assert_int_equal(kvr_upstream_active(u), 0);
    for (int i = 0; i < NCONC; i++)
        rec_free(&rs[i]);
    close_client(u);
}

static rec retry2;
static void retry_on_head(rec *r)
{
    /* a proxy retrying elsewhere from inside a libcurl callback: cancel + start */
    assert_non_null(start(&retry2, "GET", "/json", NULL, NULL, 0));
    kvr_upstream_cancel(r->a);
    r->cancelled = 1;
    r->t_cancel = kvr_now_ns();
}

static void test_start_inside_callback(void **state)
{
    (void)state;
    kvr_upstream *u = new_client(0, 0, 0);
    rec r;
    rec_init(&r, u);
    rec_init(&retry2, u);
    r.head_hook = retry_on_head;
    assert_non_null(start(&r, "GET", "/stall", NULL, NULL, 0));
    assert_true(run_until(is_done, &retry2, 3000));
    assert_int_equal(retry2.err, KVR_UP_OK);
    assert_int_equal(retry2.status, 201);
    check_cancelled(&r, u);
    rec_free(&r);
    rec_free(&retry2);
    close_client(u);
}

static void test_close_with_inflight(void **state)
{
    (void)state;
    kvr_upstream *u = new_client(0, 0, 0);
    rec r, p;
    rec_init(&r, u);
    rec_init(&p, u);
    p.pause_every = 1;
    p.pause_ms = 10000; /* never resumed before close */
    assert_non_null(start(&r, "GET", "/stall", NULL, NULL, 0));
    assert_non_null(start(&p, "GET", "/sse", "n=100&d=20", NULL, 0));
    assert_true(run_until(has_body, &r, 3000));
    assert_true(run_until(has_head, &p, 3000));
    run_for(50);
    r.cancelled = p.cancelled = 1;
    uint64_t t = kvr_now_ns();
    if (p.t_init)
        uv_timer_stop(&p.t);
    close_client(u);
    assert_int_equal(r.after_cancel, 0);
    assert_int_equal(p.after_cancel, 0);
    uint64_t d = server_disc_ns(r.id, 500);
    assert_true(d != 0 && d - t < 100000000u);
    d = server_disc_ns(p.id, 500); /* the paused one too */
    assert_true(d != 0 && d - t < 100000000u);
    rec_free(&r);
    rec_free(&p);
}

/* One easy handle serves requests of different methods in turn: nothing may leak from one
 * request's options into the next (the handle is not curl_easy_reset between requests). */
static void test_handle_reuse_across_methods(void **state)
{
    (void)state;
    kvr_upstream *u = new_client(0, 0, 0);
    static const struct {
        const char *method, *body, *line, *cl;
    } seq[] = {
        {"POST", "abc", "POST ", "Content-Length: 3\r\n"},
        {"HEAD", NULL, "HEAD ", NULL},
        {"GET", NULL, "GET ", NULL},
        {"DELETE", NULL, "DELETE ", NULL},
        {"PUT", "hello", "PUT ", "Content-Length: 5\r\n"},
        {"POST", NULL, "POST ", "Content-Length: 0\r\n"},
        {"GET", NULL, "GET ", NULL},
    };
    int conn = 0;
    for (size_t i = 0; i < sizeof(seq) / sizeof(seq[0]); i++) {
        rec r;
        rec_init(&r, u);
        const char *b = seq[i].body;
        assert_non_null(start(&r, seq[i].method, "/echo", NULL, b, b ? strlen(b) : 0));
        assert_true(run_until(is_done, &r, 3000));
        assert_int_equal(r.err, KVR_UP_OK);
        const char *got = S.head_of[r.id];
        assert_true(strncmp(got, seq[i].line, strlen(seq[i].line)) == 0);
        if (seq[i].cl)
            assert_non_null(strstr(got, seq[i].cl));
        else
            assert_null(strstr(got, "Content-Length"));
        if (!strcmp(seq[i].method, "HEAD")) {
            assert_int_equal(r.body.len, 0);
        } else {
            char want[64];
            size_t bl = b ? strlen(b) : 0;
            snprintf(want, sizeof(want), "{\"len\":%zu,\"sum\":%u}", bl, sum_bytes(0, b ? b : "", bl));
            assert_int_equal(r.body.len, strlen(want));
            assert_memory_equal(r.body.data, want, strlen(want));
        }
        int c = atomic_load(&S.conn_of[r.id]);
        if (i == 0)
            conn = c;
        assert_int_equal(c, conn); /* and all on one kept-alive connection */
        rec_free(&r);
    }
    close_client(u);
}

/* 100 request and 100 response headers: more than an attempt keeps between requests, so the
 * buffers are released and grown again on the next use of the same handle. */
static void test_many_headers(void **state)
{
    (void)state;
    kvr_upstream *u = new_client(0, 0, 0);
    static char names[100][16], values[100][16];
    kvr_http_header h[100];
    for (int i = 0; i < 100; i++) {
        snprintf(names[i], sizeof(names[i]), "X-H%d", i);
        snprintf(values[i], sizeof(values[i]), "v%d", i);
        h[i] = (kvr_http_header){names[i], strlen(names[i]), values[i], strlen(values[i])};
    }
    for (int round = 0; round < 2; round++) {
        rec r;
        rec_init(&r, u);
        char url[256];
        url_for(url, sizeof(url), S.port, "/manyhdr", r.id, NULL);
        r.a = kvr_upstream_start(u, "GET", url, h, 100, NULL, 0, &CBS, &r);
        assert_non_null(r.a);
        assert_true(run_until(is_done, &r, 3000));
        assert_int_equal(r.err, KVR_UP_OK);
        assert_non_null(strstr(r.heads, "X-R0=[v0]\n"));
        assert_non_null(strstr(r.heads, "X-R99=[v99]\n"));
        assert_non_null(strstr(S.head_of[r.id], "\r\nX-H0: v0\r\n"));
        assert_non_null(strstr(S.head_of[r.id], "\r\nX-H99: v99\r\n"));
        rec_free(&r);
    }
    close_client(u);
}

static void test_bad_input(void **state)
{
    (void)state;
    kvr_upstream *u = new_client(0, 0, 0);
    rec r;
    rec_init(&r, u);
    char url[128];
    url_for(url, sizeof(url), S.port, "/json", r.id, NULL);
    kvr_http_header inj = {"X-A", 3, "1\r\nX-Injected: 1", 17};
    assert_null(kvr_upstream_start(u, "GET", url, &inj, 1, NULL, 0, &CBS, &r));
    kvr_http_header badname = {"X A", 3, "1", 1};
    assert_null(kvr_upstream_start(u, "GET", url, &badname, 1, NULL, 0, &CBS, &r));
    assert_null(kvr_upstream_start(u, "GET", "file:///etc/passwd", NULL, 0, NULL, 0, &CBS, &r));
    assert_int_equal(kvr_upstream_active(u), 0);
    run_for(20);
    assert_int_equal(r.done + r.n_head + r.n_body, 0);
    /* the recycled handle still works */
    assert_non_null(kvr_upstream_start(u, "GET", url, NULL, 0, NULL, 0, &CBS, &r));
    assert_true(run_until(is_done, &r, 3000));
    assert_int_equal(r.err, KVR_UP_OK);
    assert_string_equal(kvr_upstream_err_name(KVR_UP_OTHER), "other");
    rec_free(&r);
    close_client(u);
}

/* Every byte value, in a name and in a value, against the rule of upstream/impl.h: a value
 * may hold no control byte but HT (nor DEL); a name none of those, nor ':', SP or HT. */
static void test_header_bytes_every_value(void **state)
{
    (void)state;
    for (int c = 0; c < 256; c++) {
        char name[4] = {'X', (char)c, 'A', 0}, value[4] = {'1', (char)c, '2', 0};
        int ctl = (c < 0x20 && c != '\t') || c == 0x7f;
        kvr_http_header h = {name, 3, "v", 1};
        assert_int_equal(kvr_up__header_ok(&h), !(ctl || c == ':' || c == ' ' || c == '\t'));
        h = (kvr_http_header){"X-A", 3, value, 3};
        assert_int_equal(kvr_up__header_ok(&h), !ctl);
    }
    kvr_http_header empty = {"", 0, "v", 1};
    assert_int_equal(kvr_up__header_ok(&empty), 0);
    kvr_http_header novalue = {"X", 1, "", 0};
    assert_int_equal(kvr_up__header_ok(&novalue), 1);
}

/* A pooled connection whose worker drops the next request unanswered (its keep-alive close
 * crossed our write): the request is re-sent once on a fresh connection and succeeds; the
 * caller sees one clean attempt (nginx's and Envoy's rule; libcurl does the same). */
static void test_stale_pooled_connection_resent(void **state)
{
    (void)state;
    kvr_upstream *u = new_client(0, 0, 0);
    rec a, b;
    rec_init(&a, u);
    rec_init(&b, u);
    assert_non_null(start(&a, "GET", "/armdrop", NULL, NULL, 0));
    assert_true(run_until(is_done, &a, 3000));
    assert_int_equal(a.err, KVR_UP_OK);
    assert_non_null(start(&b, "POST", "/echo", NULL, "abc", 3));
    assert_true(run_until(is_done, &b, 3000));
    assert_int_equal(b.err, KVR_UP_OK);
    assert_int_equal(b.done, 1);
    assert_int_equal(b.n_head, 1);
    assert_int_equal(atomic_load(&S.seen_of[b.id]), 2); /* dropped once, answered once */
    assert_true(atomic_load(&S.conn_of[b.id]) != atomic_load(&S.conn_of[a.id]));
    char want[64];
    snprintf(want, sizeof(want), "{\"len\":3,\"sum\":%u}", sum_bytes(0, "abc", 3));
    assert_int_equal(b.body.len, strlen(want));
    assert_memory_equal(b.body.data, want, strlen(want));
    rec_free(&a);
    rec_free(&b);
    close_client(u);
}

/* A fresh connection closed before any byte of the answer is an ordinary failure. */
static void test_fresh_connection_closed_is_reset(void **state)
{
    (void)state;
    kvr_upstream *u = new_client(0, 0, 0);
    rec r;
    rec_init(&r, u);
    assert_non_null(start(&r, "POST", "/dropnow", NULL, "{}", 2));
    assert_true(run_until(is_done, &r, 3000));
    assert_int_equal(r.err, KVR_UP_RESET);
    assert_int_equal(r.got_headers, 0);
    assert_int_equal(atomic_load(&S.seen_of[r.id]), 1); /* not re-sent */
    rec_free(&r);
    close_client(u);
}

/* Status line, headers and a chunked body (extensions, trailers) one byte per send: the
 * caller gets the decoded body exactly. */
static void test_one_byte_at_a_time(void **state)
{
    (void)state;
    kvr_upstream *u = new_client(0, 0, 0);
    rec r;
    rec_init(&r, u);
    assert_non_null(start(&r, "GET", "/trickle", NULL, NULL, 0));
    assert_true(run_until(is_done, &r, 10000));
    assert_int_equal(r.err, KVR_UP_OK);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.heads, "X-A=[b]\n"));
    assert_null(strstr(r.heads, "Trailer-X"));
    const char *want = "data: hello\n\ndata: [DONE]\n\n\r\n";
    assert_int_equal(r.body.len, strlen(want));
    assert_memory_equal(r.body.data, want, strlen(want));
    rec_free(&r);
    close_client(u);
}

/* HTTP/1.0 without a length: the body runs to the close, and the connection is not reused;
 * Connection: close likewise. */
static void test_read_to_close_and_connection_close(void **state)
{
    (void)state;
    kvr_upstream *u = new_client(0, 0, 0);
    rec r, c, d;
    rec_init(&r, u);
    rec_init(&c, u);
    rec_init(&d, u);
    assert_non_null(start(&r, "GET", "/http10", NULL, NULL, 0));
    assert_true(run_until(is_done, &r, 3000));
    assert_int_equal(r.err, KVR_UP_OK);
    assert_int_equal(r.body.len, strlen("read to the close"));
    assert_memory_equal(r.body.data, "read to the close", r.body.len);
    assert_non_null(strstr(r.heads, "X-V=[10]"));
    assert_non_null(start(&c, "GET", "/connclose", NULL, NULL, 0));
    assert_true(run_until(is_done, &c, 3000));
    assert_int_equal(c.err, KVR_UP_OK);
    assert_int_equal(c.body.len, 2);
    assert_non_null(start(&d, "GET", "/json", NULL, NULL, 0));
    assert_true(run_until(is_done, &d, 3000));
    assert_int_equal(d.err, KVR_UP_OK);
    assert_true(atomic_load(&S.conn_of[d.id]) != atomic_load(&S.conn_of[c.id]));
    assert_int_equal(atomic_load(&S.seen_of[d.id]), 1);
    rec_free(&r);
    rec_free(&c);
    rec_free(&d);
    close_client(u);
}

/* Malformed answers whose first read already shows it: the native client fails them as
 * protocol errors before relaying the head (so a proxy can still answer 502); libcurl relays
 * the head, then fails (bad chunk) or truncates silently (excess bytes). */
static void test_malformed_first_read(void **state)
{
    (void)state;
    kvr_upstream *u = new_client(0, 0, 0);
    rec r, s2;
    rec_init(&r, u);
    rec_init(&s2, u);
    assert_non_null(start(&r, "GET", "/badchunk", NULL, NULL, 0));
    assert_true(run_until(is_done, &r, 3000));
    assert_true(r.err != KVR_UP_OK);
    assert_non_null(start(&s2, "GET", "/overlong", NULL, NULL, 0));
    assert_true(run_until(is_done, &s2, 3000));
    if (g_client == KVR_UP_CLIENT_NATIVE) {
        assert_int_equal(r.err, KVR_UP_PROTOCOL);
        assert_int_equal(r.got_headers, 0);
        assert_int_equal(r.n_head + r.n_body, 0);
        assert_int_equal(s2.err, KVR_UP_PROTOCOL);
        assert_int_equal(s2.got_headers, 0);
        assert_int_equal(s2.n_head + s2.n_body, 0);
    }
    rec_free(&r);
    rec_free(&s2);
    close_client(u);
}

/* Pool knobs of the native client: max requests per connection, max idle 0. */
static void test_pool_limits(void **state)
{
    (void)state;
    if (g_client != KVR_UP_CLIENT_NATIVE)
        return;
    kvr_upstream_opts o;
    kvr_upstream_opts_default(&o);
    o.max_requests_per_connection = 2;
    kvr_upstream *u = kvr_upstream_new(&L, &o);
    int conn[3];
    for (int i = 0; i < 3; i++) {
        rec r;
        rec_init(&r, u);
        assert_non_null(start(&r, "GET", "/json", NULL, NULL, 0));
        assert_true(run_until(is_done, &r, 3000));
        assert_int_equal(r.err, KVR_UP_OK);
        conn[i] = atomic_load(&S.conn_of[r.id]);
        rec_free(&r);
    }
    assert_int_equal(conn[0], conn[1]);
    assert_true(conn[2] != conn[1]);
    close_client(u);

    o.max_requests_per_connection = 0;
    o.max_idle = 0;
    u = kvr_upstream_new(&L, &o);
    for (int i = 0; i < 2; i++) {
        rec r;
        rec_init(&r, u);
        assert_non_null(start(&r, "GET", "/json", NULL, NULL, 0));
        assert_true(run_until(is_done, &r, 3000));
        assert_int_equal(r.err, KVR_UP_OK);
        conn[i] = atomic_load(&S.conn_of[r.id]);
        rec_free(&r);
    }
    assert_true(conn[0] != conn[1]);
    close_client(u);
}

static int deny_all(void *ud, const char *url, const struct sockaddr *sa)
{
    (void)sa;
    (*(int *)ud)++;
    return strstr(url, "/json") == NULL;
}

/* The egress hook sees every new connection (URL and resolved address) and may refuse it. */
static void test_egress_hook(void **state)
{
    (void)state;
    int calls = 0;
    kvr_upstream_opts o;
    kvr_upstream_opts_default(&o);
    o.client = g_client;
    o.allow_connect = deny_all;
    o.allow_connect_ud = &calls;
    kvr_upstream *u = kvr_upstream_new(&L, &o);
    rec r;
    rec_init(&r, u);
    assert_non_null(start(&r, "GET", "/json", NULL, NULL, 0));
    assert_true(run_until(is_done, &r, 3000));
    assert_int_equal(r.err, KVR_UP_EGRESS_DENIED);
    assert_int_equal(atomic_load(&S.seen_of[r.id]), 0);
    assert_true(calls >= 1);
    rec_free(&r);
    close_client(u);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
#define T(f) cmocka_unit_test_setup_teardown(f, loop_setup, loop_teardown)
        T(test_json_relayed_exactly),
        T(test_empty_body_and_interim),
        T(test_sse_incremental),
        T(test_pause_resume),
        T(test_pause_is_not_idle),
        T(test_cancel_from_loop),
        T(test_cancel_inside_callbacks),
        T(test_connect_refused),
        T(test_connect_timeout),
        T(test_first_byte_timeout),
        T(test_stream_idle_timeout),
        T(test_reset_mid_body),
        T(test_protocol_error),
        T(test_connection_reuse),
        T(test_pooled_connection_closed_by_worker),
        T(test_big_post_no_expect),
        T(test_many_concurrent),
        T(test_start_inside_callback),
        T(test_close_with_inflight),
        T(test_handle_reuse_across_methods),
        T(test_many_headers),
        T(test_bad_input),
        cmocka_unit_test(test_header_bytes_every_value),
        T(test_stale_pooled_connection_resent),
        T(test_fresh_connection_closed_is_reset),
        T(test_one_byte_at_a_time),
        T(test_read_to_close_and_connection_close),
        T(test_malformed_first_read),
        T(test_pool_limits),
        T(test_egress_hook),
#undef T
    };
    if (server_start(NULL) != 0)
        return 1;
    g_client = KVR_UP_CLIENT_NATIVE;
    int failed = cmocka_run_group_tests_name("native client", tests, NULL, NULL);
    g_client = KVR_UP_CLIENT_CURL;
    failed += cmocka_run_group_tests_name("libcurl client", tests, NULL, NULL);
    server_stop(NULL);
    return failed;
}
