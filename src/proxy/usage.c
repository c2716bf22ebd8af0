/* Token usage scanning of JSON and SSE responses. */
#include "proxy/usage.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "routing/keys.h"
#include "util/json_read.h"

/* Chat and completions write usage.prompt_tokens(_details); the Responses API writes
 * usage.input_tokens(_details), inside `response` for its streamed response.completed event. */
static void take(kvr_usage *u, const char *json, size_t len)
{
    json_t *j = kvr_json_read(json, len, NULL);
    json_t *usage = j ? json_object_get(j, "usage") : NULL;
    if (!json_is_object(usage))
        usage = json_object_get(json_object_get(j, "response"), "usage");
    if (json_is_object(usage)) {
        int resp = !json_object_get(usage, "prompt_tokens") &&
                   json_object_get(usage, "input_tokens");
        u->found = 1;
        u->prompt = json_integer_value(json_object_get(usage, resp ? "input_tokens"
                                                                   : "prompt_tokens"));
        u->completion = json_integer_value(json_object_get(usage, resp ? "output_tokens"
                                                                       : "completion_tokens"));
        json_t *d = json_object_get(usage, resp ? "input_tokens_details" : "prompt_tokens_details");
        json_t *c = json_object_get(d, "cached_tokens");
        u->has_cached = json_is_integer(c);
        u->cached = json_integer_value(c);
    }
    size_t idlen;
    const char *id = u->want_id && !u->response_id ? kvr_route_response_id(j, &idlen) : NULL;
    if (id)
        u->response_id = strndup(id, idlen);
    json_decref(j);
}

void kvr_usage_init(kvr_usage *u, int sse, size_t cap, int want_id)
{
    memset(u, 0, sizeof(*u));
    u->want_id = want_id;
    kvr_buf_init(&u->buf, cap);
    u->sse = sse;
    u->overflow = cap == 0;
}

/* True when the line holds `"<name>"` followed by a colon and an object, whatever the spacing
 * (vLLM writes compact JSON, Python's json.dumps does not). A cheap filter: only such lines
 * are parsed, not every token chunk. */
static int has_object_field(const char *line, size_t len, const char *quoted)
{
    size_t ql = strlen(quoted);
    const char *end = line + len, *p = line;
    while ((p = memmem(p, (size_t)(end - p), quoted, ql))) {
        const char *q = p + ql;
        while (q < end && (*q == ' ' || *q == ':'))
            q++;
        if (q < end && *q == '{')
            return 1;
        p += ql;
    }
    return 0;
}

static void sse_line(kvr_usage *u, const char *line, size_t len)
{
    if (len <= 5 || memcmp(line, "data:", 5) != 0)
        return;
    if (has_object_field(line, len, "\"usage\"") ||
        (u->want_id && !u->response_id && has_object_field(line, len, "\"response\"")))
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
        if (u->skip_line || kvr_buf_append(&u->buf, data, n) < 0) {
            /* A line longer than the cap cannot be parsed; skip to its end, which may come in
             * a later read: until then the bytes are still that line's, not a new line (its
             * tail could start with "data:"). */
            kvr_buf_reset(&u->buf);
            u->skip_line = !nl;
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
    free(u->response_id);
    u->response_id = NULL;
}
