/* Incremental SSE parser: bytes → lines → fields → events. */
#include "sse.h"

#include <string.h>

void kvr_sse_init(kvr_sse *p, size_t max_event_bytes, kvr_sse_cb cb, void *ud)
{
    memset(p, 0, sizeof(*p));
    kvr_buf_init(&p->line, max_event_bytes);
    kvr_buf_init(&p->data, max_event_bytes);
    p->cb = cb;
    p->ud = ud;
}

void kvr_sse_free(kvr_sse *p)
{
    kvr_buf_free(&p->line);
    kvr_buf_free(&p->data);
}

static int dispatch(kvr_sse *p)
{
    int rc = 0;
    if (p->has_data) {
        p->events++;
        rc = p->cb(p->ud, p->event, p->data.data ? p->data.data : "", p->data.len);
    }
    kvr_buf_reset(&p->data);
    p->has_data = false;
    p->event[0] = '\0';
    return rc;
}

/* One complete line (without its terminator). */
static int process_line(kvr_sse *p, const char *s, size_t n)
{
    if (n == 0)
        return dispatch(p);
    if (s[0] == ':')
        return 0;
    const char *colon = memchr(s, ':', n);
    size_t flen = colon ? (size_t)(colon - s) : n;
    const char *v = colon ? colon + 1 : s + n;
    size_t vlen = (size_t)(s + n - v);
    if (vlen && *v == ' ') {
        v++;
        vlen--;
    }
    if (flen == 4 && memcmp(s, "data", 4) == 0) {
        if (p->has_data && kvr_buf_append(&p->data, "\n", 1) < 0)
            return -1;
        if (kvr_buf_append(&p->data, v, vlen) < 0)
            return -1;
        p->has_data = true;
    } else if (flen == 5 && memcmp(s, "event", 5) == 0) {
        size_t k = vlen < sizeof(p->event) - 1 ? vlen : sizeof(p->event) - 1;
        memcpy(p->event, v, k);
        p->event[k] = '\0';
    }
    /* `id:` and `retry:` do not matter to a one-shot HTTP response. */
    return 0;
}

int kvr_sse_feed(kvr_sse *p, const char *bytes, size_t n)
{
    size_t i = 0;
    while (i < n) {
        if (p->after_cr) {
            p->after_cr = false;
            if (bytes[i] == '\n') {
                i++;
                continue;
            }
        }
        /* Find the next line terminator in this piece. */
        size_t j = i;
        while (j < n && bytes[j] != '\n' && bytes[j] != '\r')
            j++;
        if (j == n) {
            if (kvr_buf_append(&p->line, bytes + i, n - i) < 0)
                return -1;
            return 0;
        }
        int rc;
        if (p->line.len) {
            if (kvr_buf_append(&p->line, bytes + i, j - i) < 0)
                return -1;
            rc = process_line(p, p->line.data, p->line.len);
            kvr_buf_reset(&p->line);
        } else {
            if (p->line.cap && j - i > p->line.cap)
                return -1;
            rc = process_line(p, bytes + i, j - i);
        }
        if (bytes[j] == '\r')
            p->after_cr = true;
        i = j + 1;
        if (rc)
            return rc;
    }
    return 0;
}
