/* Token usage scanning of JSON and SSE responses. */
#include "proxy/usage.h"

#include <jansson.h>
#include <string.h>

static void take(kvr_usage *u, const char *json, size_t len)
{
    json_t *j = json_loadb(json, len, 0, NULL);
    json_t *usage = j ? json_object_get(j, "usage") : NULL;
    if (json_is_object(usage)) {
        u->found = 1;
        u->prompt = json_integer_value(json_object_get(usage, "prompt_tokens"));
        u->completion = json_integer_value(json_object_get(usage, "completion_tokens"));
        json_t *d = json_object_get(usage, "prompt_tokens_details");
        u->cached = json_integer_value(json_object_get(d, "cached_tokens"));
    }
    json_decref(j);
}

void kvr_usage_init(kvr_usage *u, int sse, size_t cap)
{
    memset(u, 0, sizeof(*u));
    kvr_buf_init(&u->buf, cap);
    u->sse = sse;
    u->overflow = cap == 0;
}

static void sse_line(kvr_usage *u, const char *line, size_t len)
{
    static const char needle[] = "\"usage\":{";
    if (len > 5 && memcmp(line, "data:", 5) == 0 &&
        memmem(line, len, needle, sizeof(needle) - 1))
        take(u, line + 5, len - 5);
}

void kvr_usage_feed(kvr_usage *u, const char *data, size_t len)
{
    if (u->overflow)
        return;
    if (!u->sse) {
        if (kvr_buf_append(&u->buf, data, len) < 0)
            u->overflow = 1;
        return;
    }
    while (len) {
        const char *nl = memchr(data, '\n', len);
        size_t n = nl ? (size_t)(nl - data) : len;
        if (kvr_buf_append(&u->buf, data, n) < 0) {
            /* A line longer than the cap cannot be parsed; skip to its end. */
            kvr_buf_reset(&u->buf);
            if (!nl)
                return;
        } else if (nl) {
            sse_line(u, u->buf.data ? u->buf.data : "", u->buf.len);
            kvr_buf_reset(&u->buf);
        }
        if (!nl)
            return;
        data += n + 1;
        len -= n + 1;
    }
}

void kvr_usage_finish(kvr_usage *u)
{
    if (!u->sse && !u->overflow && u->buf.len)
        take(u, u->buf.data, u->buf.len);
}

void kvr_usage_free(kvr_usage *u)
{
    kvr_buf_free(&u->buf);
}
