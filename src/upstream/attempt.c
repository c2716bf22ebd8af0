/* One upstream attempt: the easy handle's fixed options (set once, the handle is reused), the
 * per-request options (method, body, request headers built without per-request allocations),
 * the response-head parser, the body callback with pause, the first-byte / stream-idle
 * deadline and the libcurl result → kvr_upstream_err map. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "upstream/deadline.h"
#include "upstream/upstream_int.h"

/* Headers libcurl would add on its own and that a proxy must not invent: an empty "Expect:"
 * stops libcurl 7.88 from sending "Expect: 100-continue" for bodies over 1 MiB
 * (EXPECT_100_THRESHOLD, lib/http.h), which stalls 1 s against workers that never answer it
 * (reference B.5 #2); "Content-Type:" stops the form-urlencoded default of CURLOPT_POSTFIELDS
 * and "Accept:" its any-type Accept default when the client sent none. libcurl only reads them. */
static char hdr_no_expect[] = "Expect:";
static char hdr_no_ctype[] = "Content-Type:";
static char hdr_no_accept[] = "Accept:";

const char *kvr_upstream_err_name(kvr_upstream_err e)
{
    switch (e) {
    case KVR_UP_OK: return "ok";
    case KVR_UP_CONNECT: return "connect";
    case KVR_UP_CONNECT_TIMEOUT: return "connect_timeout";
    case KVR_UP_FIRST_BYTE_TIMEOUT: return "first_byte_timeout";
    case KVR_UP_IDLE_TIMEOUT: return "stream_idle_timeout";
    case KVR_UP_RESET: return "reset";
    case KVR_UP_PROTOCOL: return "protocol";
    case KVR_UP_EGRESS_DENIED: return "egress_denied";
    case KVR_UP_OTHER: break;
    }
    return "other";
}

kvr_upstream_err kvr_up__map_result(kvr_upc_attempt *a, CURLcode rc, const char **msg)
{
    if (a->fail_kind != KVR_UP_OK) {
        *msg = a->fail_msg;
        return a->fail_kind;
    }
    if (rc == CURLE_OK && !a->got_headers) {
        *msg = "response ended without a complete head";
        return KVR_UP_PROTOCOL;
    }
    *msg = a->errbuf[0] ? a->errbuf : curl_easy_strerror(rc);
    switch (rc) {
    case CURLE_OK:
        *msg = "ok";
        return KVR_UP_OK;
    case CURLE_COULDNT_CONNECT:
        if (a->egress_denied) {
            *msg = "the egress policy refused every address of the worker";
            return KVR_UP_EGRESS_DENIED;
        }
        return KVR_UP_CONNECT;
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
        return KVR_UP_CONNECT;
    case CURLE_OPERATION_TIMEDOUT:
        /* CURLOPT_CONNECTTIMEOUT_MS is the only libcurl timeout we set (no CURLOPT_TIMEOUT,
         * no low-speed limit); the other deadlines are our own timers. */
        return KVR_UP_CONNECT_TIMEOUT;
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
        return KVR_UP_RESET;
    case CURLE_WEIRD_SERVER_REPLY:
    case CURLE_UNSUPPORTED_PROTOCOL: /* HTTP/0.9 reply: the URL scheme is checked at start */
    case CURLE_BAD_CONTENT_ENCODING:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
        return KVR_UP_PROTOCOL;
    default:
        return KVR_UP_OTHER;
    }
}

/* ---- deadlines ---- */

/* One uv timer per attempt carries both deadlines and is re-armed lazily: it is started once
 * per attempt, for min(first_byte, stream_idle), and moves only when it fires. So the head
 * arriving and body bytes cost no timer operation: they store uv_now() and the callback checks
 * the deadline that applies. The timer never fires late: before the head it is due at most
 * `stream_idle` after the last check, and the idle deadline counts from the head. */
static void timer_cb(uv_timer_t *t)
{
    kvr_upc_attempt *a = t->data;
    kvr_upc *u = a->u;
    if (a->state != KVR_UP_S_RUNNING && a->state != KVR_UP_S_PENDING)
        return;
    uint64_t next;
    const char *msg;
    kvr_upstream_err e = kvr_up_deadline_check(&u->opts, uv_now(u->loop), a->start_ms,
                                               a->last_rx_ms, a->got_headers, a->paused, &next,
                                               &msg);
    if (e != KVR_UP_OK)
        kvr_up__finish(a, e, msg);
    else if (next)
        uv_timer_start(t, timer_cb, next, 0);
}

void kvr_up__attempt_arm(kvr_upc_attempt *a)
{
    kvr_upc *u = a->u;
    a->start_ms = uv_now(u->loop);
    uint64_t ms = kvr_up_deadline_first(&u->opts);
    if (ms)
        uv_timer_start(&a->timer, timer_cb, ms, 0);
}

void kvr_up__attempt_rearm_idle(kvr_upc_attempt *a)
{
    kvr_upc *u = a->u;
    a->last_rx_ms = uv_now(u->loop);
    if (u->opts.stream_idle_timeout_ms && !uv_is_active((uv_handle_t *)&a->timer))
        uv_timer_start(&a->timer, timer_cb, u->opts.stream_idle_timeout_ms, 0);
}

/* ---- response head ---- */

static int is_ows(char c)
{
    return c == ' ' || c == '\t';
}

static int parse_status(const char *p, size_t l)
{
    /* "HTTP/1.1 200 ..." (libcurl has already validated the line) */
    const char *sp = memchr(p, ' ', l);
    if (!sp || (size_t)(p + l - sp) < 4)
        return 0;
    int s = 0;
    for (int i = 1; i <= 3; i++) {
        char c = sp[i];
        if (c < '0' || c > '9')
            return 0;
        s = s * 10 + (c - '0');
    }
    return s;
}

static int grow_headers(kvr_upc_attempt *a)
{
    if (a->nhdrs < a->hdrs_cap)
        return 0;
    size_t n = a->hdrs_cap ? a->hdrs_cap * 2 : 16;
    kvr_http_header *h = realloc(a->hdrs, n * sizeof(*h));
    if (!h)
        return -1;
    a->hdrs = h;
    size_t *o = realloc(a->hoff, n * 2 * sizeof(*o));
    if (!o)
        return -1;
    a->hoff = o;
    a->hdrs_cap = n;
    return 0;
}

/* One header line (CRLF stripped, not blank). Returns 0 or -1 when over the cap / OOM. */
static int add_header_line(kvr_upc_attempt *a, const char *p, size_t l)
{
    if (is_ows(p[0])) {
        /* obs-fold continuation: join to the previous value, which ends the buffer */
        if (!a->nhdrs)
            return 0;
        while (l && is_ows(*p))
            p++, l--;
        while (l && is_ows(p[l - 1]))
            l--;
        kvr_http_header *h = &a->hdrs[a->nhdrs - 1];
        if (kvr_buf_append(&a->head, " ", 1) < 0 || kvr_buf_append(&a->head, p, l) < 0)
            return -1;
        h->value_len += 1 + l;
        return 0;
    }
    const char *colon = memchr(p, ':', l);
    if (!colon)
        return 0; /* not a header; libcurl let it through, we do not relay it */
    size_t nl = (size_t)(colon - p);
    while (nl && is_ows(p[nl - 1]))
        nl--;
    const char *v = colon + 1;
    size_t vl = l - (size_t)(v - p);
    while (vl && is_ows(*v))
        v++, vl--;
    while (vl && is_ows(v[vl - 1]))
        vl--;
    if (grow_headers(a) < 0)
        return -1;
    size_t no = a->head.len;
    if (kvr_buf_append(&a->head, p, nl) < 0)
        return -1;
    size_t vo = a->head.len;
    if (kvr_buf_append(&a->head, v, vl) < 0)
        return -1;
    kvr_http_header *h = &a->hdrs[a->nhdrs];
    h->name_len = nl;
    h->value_len = vl;
    a->hoff[2 * a->nhdrs] = no;
    a->hoff[2 * a->nhdrs + 1] = vo;
    a->nhdrs++;
    return 0;
}

/* The final head ended: deliver it. Returns 0 when the attempt was cancelled meanwhile. */
static int deliver_head(kvr_upc_attempt *a)
{
    kvr_upc *u = a->u;
    for (size_t i = 0; i < a->nhdrs; i++) {
        a->hdrs[i].name = a->head.data + a->hoff[2 * i];
        a->hdrs[i].value = a->head.data + a->hoff[2 * i + 1];
    }
    a->got_headers = 1;
    /* the idle deadline now counts from here; the armed timer is due no later than that */
    a->last_rx_ms = uv_now(u->loop);
    if (a->cbs.on_headers)
        a->cbs.on_headers(a->ud, a->status, a->hdrs, a->nhdrs);
    return a->state == KVR_UP_S_RUNNING;
}

static size_t header_cb(char *p, size_t size, size_t nitems, void *ud)
{
    kvr_upc_attempt *a = ud;
    size_t len = size * nitems;
    if (a->state != KVR_UP_S_RUNNING)
        return 0; /* cancelled: abort, libcurl then closes the connection */
    if (a->got_headers)
        return len; /* trailers of a chunked body are not relayed */
    size_t l = len;
    while (l && (p[l - 1] == '\n' || p[l - 1] == '\r'))
        l--;
    if (!a->in_block) {
        a->in_block = 1;
        a->status = parse_status(p, l);
        kvr_buf_reset(&a->head);
        a->nhdrs = 0;
        return len;
    }
    if (l == 0) {
        a->in_block = 0;
        if (a->status >= 100 && a->status < 200)
            return len; /* interim head (100 Continue, 103 Early Hints): the final one follows */
        return deliver_head(a) ? len : 0;
    }
    if (add_header_line(a, p, l) < 0) {
        a->fail_kind = KVR_UP_PROTOCOL;
        a->fail_msg = "response head too large";
        return 0;
    }
    return len;
}

/* ---- response body ---- */

static size_t write_cb(char *p, size_t size, size_t nitems, void *ud)
{
    kvr_upc_attempt *a = ud;
    size_t len = size * nitems;
    if (a->state != KVR_UP_S_RUNNING)
        return 0;
    a->last_rx_ms = uv_now(a->u->loop);
    int full = a->cbs.on_body(a->ud, p, len);
    if (a->state != KVR_UP_S_RUNNING)
        return 0; /* cancelled inside on_body */
    if (full) {
        /* nothing was taken; libcurl keeps these bytes and offers them again on resume */
        a->paused = 1;
        return CURL_WRITEFUNC_PAUSE;
    }
    return len;
}

/* ---- creation and per-request setup ---- */

/* Every new connection passes the egress hook with the address DNS gave, so a name that now
 * resolves into a denied range is refused (a pooled connection was checked when opened). */
static curl_socket_t open_socket(void *clientp, curlsocktype purpose, struct curl_sockaddr *ad)
{
    kvr_upc_attempt *a = clientp;
    const kvr_upstream_opts *o = &a->u->opts;
    (void)purpose;
    if (o->allow_connect) {
        char *url = NULL;
        curl_easy_getinfo(a->easy, CURLINFO_EFFECTIVE_URL, &url);
        if (!o->allow_connect(o->allow_connect_ud, url ? url : "", &ad->addr)) {
            a->egress_denied = 1; /* another address of the name may still be allowed */
            return CURL_SOCKET_BAD;
        }
    }
    return socket(ad->family, ad->socktype, ad->protocol);
}

kvr_upc_attempt *kvr_up__attempt_new(kvr_upc *u)
{
    kvr_upc_attempt *a = calloc(1, sizeof(*a));
    if (!a)
        return NULL;
    a->easy = curl_easy_init();
    if (!a->easy) {
        free(a);
        return NULL;
    }
    a->u = u;
    kvr_buf_init(&a->head, KVR_UP_HEAD_CAP);
    uv_timer_init(u->loop, &a->timer);
    a->timer.data = a;
    u->open_handles++;

    /* 0 means "no limit" for us but "300 s" for libcurl */
    uint64_t ct = u->opts.connect_timeout_ms;
    long connect_ms = ct == 0 || ct > (uint64_t)INT_MAX ? (long)INT_MAX : (long)ct;
    CURL *e = a->easy;
    CURLcode rc = CURLE_OK;
    rc |= curl_easy_setopt(e, CURLOPT_PRIVATE, a);
    rc |= curl_easy_setopt(e, CURLOPT_OPENSOCKETFUNCTION, open_socket);
    rc |= curl_easy_setopt(e, CURLOPT_OPENSOCKETDATA, a);
    rc |= curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    rc |= curl_easy_setopt(e, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    rc |= curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    /* workers are addressed directly: ignore http_proxy & co. from the environment */
    rc |= curl_easy_setopt(e, CURLOPT_PROXY, "");
    /* With no no-proxy list set, libcurl 7.88 reads no_proxy and NO_PROXY from the environment
     * (two getenv scans) on every transfer (create_conn_helper_init_proxy, lib/url.c); "*"
     * says "no proxy for any host", which the empty CURLOPT_PROXY already means. */
    rc |= curl_easy_setopt(e, CURLOPT_NOPROXY, "*");
    /* forward the path the proxy built, without dot-segment rewriting */
    rc |= curl_easy_setopt(e, CURLOPT_PATH_AS_IS, 1L);
    rc |= curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, connect_ms);
    rc |= curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, header_cb);
    rc |= curl_easy_setopt(e, CURLOPT_HEADERDATA, a);
    rc |= curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, write_cb);
    rc |= curl_easy_setopt(e, CURLOPT_WRITEDATA, a);
    rc |= curl_easy_setopt(e, CURLOPT_ERRORBUFFER, a->errbuf);
    /* a safety net so that no fd is ever closed while a uv_poll still watches it (B.5 #5) */
    rc |= curl_easy_setopt(e, CURLOPT_CLOSESOCKETFUNCTION, kvr_up__closesocket_cb);
    rc |= curl_easy_setopt(e, CURLOPT_CLOSESOCKETDATA, u);
    rc |= curl_easy_setopt(e, CURLOPT_HTTPHEADER, NULL);
    if (u->opts.ca_file)
        rc |= curl_easy_setopt(e, CURLOPT_CAINFO, u->opts.ca_file);
    /* Deliberately no CURLOPT_TIMEOUT: it would cap the length of a generation. */
    if (rc != CURLE_OK) {
        /* cannot happen with a libcurl built with HTTP; keep the object consistent anyway */
        kvr_up__attempt_destroy(a);
        return NULL;
    }
    return a;
}

static int ieq(const char *a, size_t al, const char *lit)
{
    size_t n = strlen(lit);
    return al == n && strncasecmp(a, lit, n) == 0;
}

/* Header bytes that could split or end a header line never reach a worker: per byte, 1 when
 * no value may hold it (controls but HTAB, DEL), 2 when no name may (those, ':', SP, HTAB).
 * A table: every header of every request passes here. */
#define BAD_IN_VALUE 1
#define BAD_IN_NAME 2
static const unsigned char g_bad[256] = {
    [0 ... 8] = BAD_IN_VALUE | BAD_IN_NAME,
    ['\t'] = BAD_IN_NAME,
    [10 ... 31] = BAD_IN_VALUE | BAD_IN_NAME,
    [' '] = BAD_IN_NAME,
    [':'] = BAD_IN_NAME,
    [0x7f] = BAD_IN_VALUE | BAD_IN_NAME,
};

static int bad_bytes(const char *p, size_t n, int is_name)
{
    unsigned char mask = is_name ? BAD_IN_NAME : BAD_IN_VALUE, any = 0;
    for (size_t i = 0; i < n; i++)
        any |= g_bad[(unsigned char)p[i]];
    return (any & mask) != 0;
}

int kvr_up__header_ok(const kvr_http_header *h)
{
    return h->name_len && !bad_bytes(h->name, h->name_len, 1) &&
           !bad_bytes(h->value, h->value_len, 0);
}

static int build_request_headers(kvr_upc_attempt *a, const kvr_http_header *h, size_t n)
{
    size_t bytes = 0;
    int has_ctype = 0, has_accept = 0;
    for (size_t i = 0; i < n; i++) {
        if (!kvr_up__header_ok(&h[i]))
            return -1;
        bytes += h[i].name_len + 2 + h[i].value_len + 1;
    }
    size_t nodes = n + 3;
    if (bytes > a->rq_cap) {
        char *p = realloc(a->rq, bytes);
        if (!p)
            return -1;
        a->rq = p;
        a->rq_cap = bytes;
    }
    if (nodes > a->nodes_cap) {
        struct curl_slist *s = realloc(a->nodes, nodes * sizeof(*s));
        if (!s)
            return -1;
        a->nodes = s;
        a->nodes_cap = nodes;
    }
    char *w = a->rq;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const char *nm = h[i].name;
        size_t nl = h[i].name_len;
        /* framing and connection handling belong to libcurl and this module */
        if (ieq(nm, nl, "host") || ieq(nm, nl, "content-length") || ieq(nm, nl, "expect") ||
            ieq(nm, nl, "transfer-encoding") || ieq(nm, nl, "connection"))
            continue;
        has_ctype |= ieq(nm, nl, "content-type");
        has_accept |= ieq(nm, nl, "accept");
        a->nodes[k++].data = w;
        memcpy(w, nm, nl);
        w += nl;
        if (h[i].value_len) {
            *w++ = ':';
            *w++ = ' ';
            memcpy(w, h[i].value, h[i].value_len);
            w += h[i].value_len;
        } else {
            *w++ = ';'; /* libcurl's syntax for a header with an empty value */
        }
        *w++ = '\0';
    }
    a->nodes[k++].data = hdr_no_expect;
    if (!has_ctype)
        a->nodes[k++].data = hdr_no_ctype;
    if (!has_accept)
        a->nodes[k++].data = hdr_no_accept;
    for (size_t i = 0; i + 1 < k; i++)
        a->nodes[i].next = &a->nodes[i + 1];
    a->nodes[k - 1].next = NULL;
    return 0;
}

int kvr_up__attempt_prepare(kvr_upc_attempt *a, const char *method, const char *url,
                            const kvr_http_header *h, size_t n, const char *body, size_t len)
{
    if (!method || !url || (len && !body))
        return -1;
    if (strncasecmp(url, "http://", 7) != 0 && strncasecmp(url, "https://", 8) != 0)
        return -1;
    if (build_request_headers(a, h, n) < 0)
        return -1;
    CURL *e = a->easy;
    CURLcode rc = curl_easy_setopt(e, CURLOPT_URL, url);
    rc |= curl_easy_setopt(e, CURLOPT_HTTPHEADER, a->nodes);
    /* Options are not reset between requests (curl_easy_reset costs allocations), so every
     * method-related option is set each time; NOBODY 0 first, it also undoes a previous HEAD. */
    rc |= curl_easy_setopt(e, CURLOPT_NOBODY, 0L);
    int is_get = strcmp(method, "GET") == 0, is_post = strcmp(method, "POST") == 0;
    if (strcmp(method, "HEAD") == 0 && len == 0) {
        rc |= curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, NULL);
        rc |= curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
    } else if (is_post || len > 0) {
        rc |= curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, is_post ? NULL : method);
        rc |= curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
        rc |= curl_easy_setopt(e, CURLOPT_POSTFIELDS, body ? body : "");
    } else {
        rc |= curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, is_get ? NULL : method);
        rc |= curl_easy_setopt(e, CURLOPT_HTTPGET, 1L);
    }
    if (rc != CURLE_OK)
        return -1;

    a->errbuf[0] = '\0';
    a->fail_kind = KVR_UP_OK;
    a->fail_msg = NULL;
    a->egress_denied = 0;
    a->status = 0;
    a->nhdrs = 0;
    a->in_multi = a->paused = a->resume_req = a->got_headers = a->in_block = 0;
    kvr_buf_reset(&a->head);
    return 0;
}

void kvr_up__attempt_trim(kvr_upc_attempt *a)
{
    a->cbs = (kvr_upstream_cbs){0};
    a->ud = NULL;
    if (a->head.alloc > KVR_UP_KEEP_BYTES)
        kvr_buf_free(&a->head);
    if (a->hdrs_cap > KVR_UP_KEEP_HEADERS) {
        free(a->hdrs);
        free(a->hoff);
        a->hdrs = NULL;
        a->hoff = NULL;
        a->hdrs_cap = 0;
    }
    if (a->rq_cap > KVR_UP_KEEP_BYTES || a->nodes_cap > KVR_UP_KEEP_HEADERS) {
        curl_easy_setopt(a->easy, CURLOPT_HTTPHEADER, NULL); /* no dangling list in the handle */
        free(a->rq);
        free(a->nodes);
        a->rq = NULL;
        a->nodes = NULL;
        a->rq_cap = a->nodes_cap = 0;
    }
}

static void attempt_closed(uv_handle_t *h)
{
    kvr_upc_attempt *a = h->data;
    kvr_upc *u = a->u;
    free(a);
    kvr_up__handle_closed(u);
}

void kvr_up__attempt_destroy(kvr_upc_attempt *a)
{
    if (a->easy) {
        curl_easy_cleanup(a->easy);
        a->easy = NULL;
    }
    kvr_buf_free(&a->head);
    free(a->hoff);
    free(a->hdrs);
    free(a->rq);
    free(a->nodes);
    a->hoff = NULL;
    a->hdrs = NULL;
    a->rq = NULL;
    a->nodes = NULL;
    uv_close((uv_handle_t *)&a->timer, attempt_closed);
}

int kvr_upc_body_sent(kvr_upstream_attempt *ah, size_t len)
{
    kvr_upc_attempt *a = (kvr_upc_attempt *)ah;
    curl_off_t up = 0;
    if (curl_easy_getinfo(a->easy, CURLINFO_SIZE_UPLOAD_T, &up) != CURLE_OK)
        return 0;
    return up >= 0 && (size_t)up >= len;
}
