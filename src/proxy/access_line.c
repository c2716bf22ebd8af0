/* The access log's line encoder. */
#include "proxy/access_line.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static json_t *str_or_null(const char *s)
{
    json_t *j = s ? json_string(s) : NULL; /* NULL too for bytes that are not UTF-8 */
    return j ? j : json_null();
}

/* A count, or null when the worker reported no usage. */
static json_t *tokens(const kvr_span_facts *f, long long v)
{
    return f->has_usage ? json_integer(v) : json_null();
}

/* Milliseconds rounded to the microsecond, or null when negative (unknown). */
static json_t *ms_or_null(double ms)
{
    return ms >= 0 ? json_real(round(ms * 1000) / 1000) : json_null();
}

/* "ip:port" → "ip", "[v6]:port" → "v6"; `out` has `cap` bytes. */
static json_t *address(const char *peer, char *out, size_t cap)
{
    if (!peer || !*peer)
        return json_null();
    const char *end = strrchr(peer, ':');
    const char *start = peer;
    if (peer[0] == '[') {
        start = peer + 1;
        end = strchr(start, ']');
    } else if (end && strchr(peer, ':') != end) {
        end = NULL; /* a bare IPv6 address */
    }
    size_t n = end ? (size_t)(end - start) : strlen(start);
    snprintf(out, cap, "%.*s", (int)n, start);
    return json_string(out);
}

int kvr_access_line(kvr_buf *out, const kvr_span_facts *f, uint64_t wall_ms)
{
    char when[40], tb[32], client[64];
    time_t secs = (time_t)(wall_ms / 1000);
    struct tm tm;
    gmtime_r(&secs, &tm);
    strftime(tb, sizeof(tb), "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(when, sizeof(when), "%s.%03uZ", tb, (unsigned)(wall_ms % 1000));
    double total = f->end_mono_ns >= f->start_mono_ns
                       ? (double)(f->end_mono_ns - f->start_mono_ns) / 1e6
                       : 0;
    double ttft = f->stream ? f->ttft_ms : f->headers_ms;
    json_t *o = json_object();
    if (!o)
        return -1;
    json_object_set_new(o, "time", json_string(when));
    json_object_set_new(o, "request_id", str_or_null(f->request_id));
    json_object_set_new(o, "route", str_or_null(f->route));
    json_object_set_new(o, "worker", str_or_null(f->worker));
    if (f->prefill_worker) /* only on disaggregated requests: other lines keep their shape */
        json_object_set_new(o, "prefill_worker", json_string(f->prefill_worker));
    json_object_set_new(o, "decision", str_or_null(f->decision));
    json_object_set_new(o, "match", f->match >= 0 ? json_real(round(f->match * 1e4) / 1e4)
                                                  : json_null());
    json_object_set_new(o, "attempts", json_integer((json_int_t)f->attempt));
    json_object_set_new(o, "status", json_integer(f->status));
    json_object_set_new(o, "prompt_tokens", tokens(f, f->prompt));
    json_object_set_new(o, "cached_tokens", tokens(f, f->cached));
    json_object_set_new(o, "completion_tokens", tokens(f, f->completion));
    json_object_set_new(o, "ttft_ms", ms_or_null(ttft));
    json_object_set_new(o, "total_ms", ms_or_null(total));
    json_object_set_new(o, "client", address(f->client, client, sizeof(client)));
    json_object_set_new(o, "key", str_or_null(f->key));
    char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));
    json_decref(o);
    if (!s)
        return -1;
    size_t n = strlen(s);
    size_t before = out->len;
    int rc = kvr_buf_append(out, s, n) < 0 || kvr_buf_append(out, "\n", 1) < 0 ? -1 : 0;
    if (rc < 0)
        out->len = before;
    free(s);
    return rc;
}
