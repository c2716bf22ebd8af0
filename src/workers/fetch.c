/* Buffered small GETs over the upstream client, each with its own deadline (the upstream
 * client's first-byte timeout is sized for prefill, far too long for a health check). */
#include "workers/fetch.h"

#include <stdlib.h>

#include "util/buf.h"

typedef struct fetch {
    uv_timer_t timer;
    struct fetch *prev, *next; /* the live list, so shutdown can end every fetch */
    kvr_upstream_attempt *att;
    kvr_buf body;
    int status;
    int truncated;
    kvr_fetch_cb cb;
    void *ud;
} fetch;

static fetch *g_live;

static void on_closed(uv_handle_t *h)
{
    fetch *f = h->data;
    kvr_buf_free(&f->body);
    free(f);
}

static void finish(fetch *f, int status, kvr_upstream_err err)
{
    f->att = NULL;
    if (f->prev)
        f->prev->next = f->next;
    else
        g_live = f->next;
    if (f->next)
        f->next->prev = f->prev;
    f->cb(f->ud, status, f->body.data ? f->body.data : "", f->body.len, f->truncated, err);
    uv_timer_stop(&f->timer);
    uv_close((uv_handle_t *)&f->timer, on_closed);
}

static void on_headers(void *ud, int status, const kvr_http_header *h, size_t n)
{
    (void)h;
    (void)n;
    ((fetch *)ud)->status = status;
}

static int on_body(void *ud, const char *data, size_t len)
{
    fetch *f = ud;
    if (kvr_buf_append(&f->body, data, len) < 0)
        f->truncated = 1;
    return 0;
}

static void on_done(void *ud, kvr_upstream_err err, const char *msg, int got_headers)
{
    (void)msg;
    fetch *f = ud;
    finish(f, got_headers && err == KVR_UP_OK ? f->status : 0, err);
}

static void on_timeout(uv_timer_t *t)
{
    fetch *f = t->data;
    kvr_upstream_cancel(f->att);
    finish(f, 0, KVR_UP_FIRST_BYTE_TIMEOUT);
}

static const kvr_upstream_cbs cbs = {on_headers, on_body, on_done};

int kvr_fetch(uv_loop_t *loop, kvr_upstream *u, const char *url, const char *bearer,
              size_t max_bytes, uint64_t timeout_ms, kvr_fetch_cb cb, void *ud)
{
    fetch *f = calloc(1, sizeof(*f));
    if (!f)
        return -1;
    kvr_buf_init(&f->body, max_bytes);
    f->cb = cb;
    f->ud = ud;
    char auth[1100];
    kvr_http_header h = {"Authorization", 13, auth, 0};
    if (bearer)
        h.value_len = (size_t)snprintf(auth, sizeof(auth), "Bearer %s", bearer);
    /* libcurl copies request headers at start, so `auth` may go with this frame. */
    f->att = kvr_upstream_start(u, "GET", url, &h, bearer && h.value_len < sizeof(auth) ? 1 : 0,
                                NULL, 0, &cbs, f);
    if (!f->att) {
        free(f);
        return -1;
    }
    uv_timer_init(loop, &f->timer);
    f->timer.data = f;
    uv_timer_start(&f->timer, on_timeout, timeout_ms, 0);
    f->next = g_live;
    if (g_live)
        g_live->prev = f;
    g_live = f;
    return 0;
}

void kvr_fetch_cancel_all(void)
{
    while (g_live) {
        fetch *f = g_live;
        kvr_upstream_cancel(f->att);
        finish(f, 0, KVR_UP_OTHER);
    }
}
