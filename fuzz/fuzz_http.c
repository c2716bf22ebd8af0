/* libFuzzer harness for the inbound HTTP/1.1 request parser and validator (src/http/parse.c,
 * validate.c): any bytes from a client must end in complete requests, "need more" or an error
 * status, never a crash, a leak or undefined behaviour.
 *
 * The narrowest entry point that runs both http_parser and kvroute's own rules is
 * kvr_http__execute() on a kvr_http_conn (it pre-scans with kvr_http__scan(), and the parser
 * callbacks call kvr_http__validate()), so the harness drives a connection the way
 * conn_drive() and kvr_http__req_release() in server.c do, without a socket: the callbacks
 * only need the server's limits, a timer on a loop (deadlines are armed, never fired here)
 * and the output queue (100-continue). The loop and servers are per process; each input gets
 * fresh connections, so inputs stay independent.
 *
 * Every input is parsed twice, once whole and once in 1-3 chunks split at positions derived
 * from the input, and the requests that come out must be the same: where a read ends must not
 * change what a client's bytes mean (reassembly). Which error status an invalid input gets may
 * legitimately depend on the split (the pre-scan sees a whole slice before the parser does),
 * so only "ended in an error" is compared, not the status. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "http/internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Two limit sets: small ones so that 413/414/431/503 are reachable with short inputs, and the
 * defaults (what kvroute runs with unless flags say otherwise). */
enum { NSRV = 2 };
static uv_loop_t g_loop;
static kvr_http_server *g_srv[NSRV];

static void never_called(kvr_http_req *r, void *ud)
{
    (void)r;
    (void)ud;
    __builtin_trap(); /* requests are inspected by the harness, never dispatched */
}

static void setup(void)
{
    if (g_srv[0])
        return;
    if (uv_loop_init(&g_loop) != 0)
        abort();
    kvr_http_limits l;
    kvr_http_limits_default(&l);
    l.max_header_bytes = 512;
    l.max_headers = 8;
    l.max_body_bytes = 256;
    l.max_total_body_bytes = 200; /* below max_body_bytes: the 503 path is reachable */
    g_srv[0] = kvr_http_server_new(&g_loop, &l, never_called, NULL);
    g_srv[1] = kvr_http_server_new(&g_loop, NULL, never_called, NULL);
}

/* FNV-1a: the split positions and the limit set come from the input itself, so a crash
 * reproduces from its bytes alone. */
static uint64_t hash(const uint8_t *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* What the two parses are compared on: every completed request hashed (method, target, path,
 * version, keep-alive, headers, body), how many there were and whether parsing failed. */
typedef struct outcome {
    uint64_t digest;
    size_t nreq;
    int error;
} outcome;

static uint64_t mix(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return (h ^ 0xff) * 1099511628211ull; /* separator, so ("ab","c") != ("a","bc") */
}

static int ows(char ch)
{
    return ch == ' ' || ch == '\t';
}

/* What the handler relies on for a request the server dispatches (server.h accessors). */
static uint64_t check_request(const kvr_http_conn *c, uint64_t h)
{
    const kvr_http_req *r = &c->req;
    const kvr_http_limits *l = &c->srv->lim;
    const char *method = kvr_http_req_method(r);
    const char *target = kvr_http_req_target(r);
    const char *path = kvr_http_req_path(r);
    if (!method || !*method || !target || !path)
        __builtin_trap();
    /* origin-form only; the path is the target up to '?' */
    size_t tlen = strlen(target), plen = strlen(path);
    if (tlen != r->target_len || target[0] != '/' || plen > tlen ||
        memcmp(path, target, plen) != 0 || (plen < tlen && target[plen] != '?'))
        __builtin_trap();
    int minor = kvr_http_req_minor_version(r);
    if (minor != 0 && minor != 1)
        __builtin_trap();
    size_t nh = kvr_http_req_header_count(r), nhost = 0;
    if (nh > l->max_headers || kvr_http_req_header_at(r, nh) != NULL)
        __builtin_trap();
    for (size_t i = 0; i < nh; i++) {
        const kvr_http_header *hd = kvr_http_req_header_at(r, i);
        /* names are non-empty tokens, values NUL-terminated, without NUL or outer OWS */
        if (!hd || !hd->name_len || !kvr_http_is_token(hd->name, hd->name_len) ||
            hd->name[hd->name_len] != '\0' || strlen(hd->value) != hd->value_len ||
            (hd->value_len && (ows(hd->value[0]) || ows(hd->value[hd->value_len - 1]))))
            __builtin_trap();
        if (!kvr_http_req_header(r, hd->name))
            __builtin_trap();
        nhost += hd->name_len == 4 && strncasecmp(hd->name, "host", 4) == 0;
        h = mix(h, hd->name, hd->name_len);
        h = mix(h, hd->value, hd->value_len);
    }
    if (nhost > 1 || (minor == 1 && nhost != 1))
        __builtin_trap();
    size_t blen;
    const char *body = kvr_http_req_body(r, &blen);
    if (!body || blen > l->max_body_bytes || body[blen] != '\0')
        __builtin_trap();
    h = mix(h, method, strlen(method));
    h = mix(h, target, tlen);
    h = mix(h, path, plen);
    h = mix(h, &minor, sizeof(minor));
    h = mix(h, &r->keep_alive, sizeof(r->keep_alive));
    return mix(h, body, blen);
}

static void timer_closed(uv_handle_t *h)
{
    free(h->data);
}

/* Parses `n` bytes split at cuts[0..ncuts) (ascending) on a fresh connection of `s`, the way
 * conn_drive() does: execute until the bytes of a slice are used up, a request completes (it
 * is checked, then released like kvr_http__req_release(): reset, or the end when the
 * connection would not be kept) or an error ends the connection. */
static outcome run(kvr_http_server *s, const char *p, size_t n, const size_t *cuts,
                   size_t ncuts)
{
    outcome o = {1469598103934665603ull, 0, 0};
    kvr_http_conn *c = calloc(1, sizeof(*c));
    if (!c)
        abort();
    const kvr_http_limits *l = &s->lim;
    c->srv = s;
    c->req.conn = c;
    kvr_buf_init(&c->in, s->pipeline_cap + KVR_HTTP_READ_BUF);
    kvr_buf_init(&c->out, s->out_cap);
    kvr_buf_init(&c->wbuf, s->out_cap);
    kvr_buf_init(&c->req.hbuf, 2 * l->max_header_bytes + 2 * l->max_headers + 64);
    kvr_buf_init(&c->req.body, l->max_body_bytes);
    uv_timer_init(&g_loop, &c->timer);
    c->timer.data = c;
    strcpy(c->peer, "fuzz");
    kvr_http__parse_reset(c);
    c->state = KVR_HTTP_C_IDLE;

    int done = 0;
    size_t start = 0;
    for (size_t k = 0; k <= ncuts && !done; k++) {
        size_t end = k < ncuts ? cuts[k] : n, used = start;
        while (used < end) {
            int res;
            size_t m = kvr_http__execute(c, p + used, end - used, &res);
            if (m > end - used)
                __builtin_trap();
            used += m;
            if (res < 0) {
                if (c->err_status < 400 || c->err_status > 599)
                    __builtin_trap();
                o.error = 1;
                done = 1;
                break;
            }
            if (res == 0) {
                if (used != end) /* "need more" must have consumed the whole slice */
                    __builtin_trap();
                break;
            }
            o.nreq++;
            o.digest = check_request(c, o.digest);
            if (!c->req.keep_alive) {
                done = 1; /* the connection closes after this response */
                break;
            }
            kvr_http__parse_reset(c);
            c->state = KVR_HTTP_C_IDLE;
        }
        start = end;
    }

    /* What conn_free() and the server teardown would do: nothing may stay queued or held. */
    kvr_http__unflush(c);
    uv_prepare_stop(&s->prepare);
    s->body_total -= c->req.body_held;
    if (s->body_total != 0) /* body accounting must balance once the connection is gone */
        __builtin_trap();
    kvr_buf_free(&c->in);
    kvr_buf_free(&c->out);
    kvr_buf_free(&c->wbuf);
    kvr_buf_free(&c->req.hbuf);
    kvr_buf_free(&c->req.body);
    free(c->req.offs);
    free(c->req.hdrs);
    uv_close((uv_handle_t *)&c->timer, timer_closed);
    uv_run(&g_loop, UV_RUN_NOWAIT); /* runs the close callback: frees c */
    return o;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup();
    uint64_t h = hash(data, size);
    kvr_http_server *s = g_srv[h & 1];
    const char *p = (const char *)data;

    outcome whole = run(s, p, size, NULL, 0);

    size_t cuts[2], ncuts = (h >> 1) % 3; /* 1-3 chunks */
    for (size_t i = 0; i < ncuts; i++)
        cuts[i] = size ? (size_t)((h >> (8 + 24 * i)) % (size + 1)) : 0;
    if (ncuts == 2 && cuts[0] > cuts[1]) {
        size_t t = cuts[0];
        cuts[0] = cuts[1];
        cuts[1] = t;
    }
    outcome split = run(s, p, size, cuts, ncuts);

    if (whole.nreq != split.nreq || whole.digest != split.digest || whole.error != split.error)
        __builtin_trap();
    return 0;
}
