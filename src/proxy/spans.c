/* Span attributes of proxied requests. Names: kvroute.* for kvroute's own facts, plus the
 * OpenTelemetry semantic conventions' http.*, url.full and gen_ai.usage.* where one exists. */
#include "proxy/spans.h"

#include <stdio.h>

#define MAX_ATTRS 24

static size_t attrs(const kvr_span_facts *f, int client, kvr_span_attr *a)
{
    size_t n = 0;
#define S(k, v)                                                                               \
    if (v)                                                                                    \
    a[n++] = (kvr_span_attr){.key = k, .type = KVR_ATTR_STR, .s = v}
#define I(k, v) a[n++] = (kvr_span_attr){.key = k, .type = KVR_ATTR_INT, .i = (int64_t)(v)}
#define D(k, v) a[n++] = (kvr_span_attr){.key = k, .type = KVR_ATTR_DOUBLE, .d = v}
    S("kvroute.route", f->route);
    S("kvroute.policy", f->policy);
    S("kvroute.decision", f->decision);
    if (f->match >= 0)
        D("kvroute.match_ratio", f->match);
    S("kvroute.worker", f->worker);
    S("kvroute.prefill_worker", f->prefill_worker);
    S("kvroute.request_id", f->request_id);
    I(client ? "kvroute.attempt" : "kvroute.attempts", f->attempt);
    if (client)
        S("url.full", f->url);
    S("http.request.method", f->method);
    if (f->status) {
        I("kvroute.status", f->status);
        I("http.response.status_code", f->status);
    }
    S("kvroute.error", f->error);
    if (f->has_usage) {
        I("kvroute.prompt_tokens", f->prompt);
        I("kvroute.cached_tokens", f->cached);
        I("kvroute.completion_tokens", f->completion);
        I("gen_ai.usage.input_tokens", f->prompt);
        I("gen_ai.usage.output_tokens", f->completion);
    }
    if (f->ttft_ms >= 0)
        D("kvroute.ttft_ms", f->ttft_ms);
#undef S
#undef I
#undef D
    return n;
}

static void record(kvr_otlp *o, const kvr_req_trace *t, const kvr_span_facts *f, int client)
{
    if (!o || !t->on || !t->sampled)
        return;
    kvr_span_attr a[MAX_ATTRS];
    size_t n = attrs(f, client, a);
    char msg[160];
    int error = f->error || (client ? (!f->status || f->status >= 400) : f->status >= 500);
    if (error)
        snprintf(msg, sizeof(msg), "%s%s%d", f->error ? f->error : "",
                 f->error ? ", status " : "status ", f->status);
    kvr_span s = {.trace_id = t->trace_id,
                  .span_id = client ? t->attempt_id : t->server_id,
                  .parent_id = client ? t->server_id : t->has_parent ? t->parent_id : NULL,
                  .name = f->name ? f->name : "POST",
                  .kind = client ? KVR_SPAN_CLIENT : KVR_SPAN_SERVER,
                  .start_unix_ns = kvr_trace_unix_ns(t, f->start_mono_ns),
                  .end_unix_ns = kvr_trace_unix_ns(t, f->end_mono_ns),
                  .error = error,
                  .message = error ? msg : NULL,
                  .attrs = a,
                  .nattrs = n};
    kvr_otlp_record(o, &s);
}

void kvr_span_attempt(kvr_otlp *o, const kvr_req_trace *t, const kvr_span_facts *f)
{
    record(o, t, f, 1);
}

void kvr_span_server(kvr_otlp *o, const kvr_req_trace *t, const kvr_span_facts *f)
{
    record(o, t, f, 0);
}
