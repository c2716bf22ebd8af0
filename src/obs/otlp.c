/* OTLP/HTTP JSON span export: a bounded queue of encoded spans, one batch in flight. */
#include "obs/otlp.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/buf.h"
#include "util/log.h"
#include "util/time.h"

struct kvr_otlp {
    uv_loop_t *loop;
    kvr_upstream *up;
    kvr_otlp_cfg cfg;
    char *endpoint;
    char *head;                /* the body up to the spans array, service name in */
    kvr_buf queue;             /* encoded spans, comma-separated */
    size_t nqueued;
    kvr_buf body;              /* the batch in flight */
    size_t nsent;
    kvr_upstream_attempt *att;
    int status;                /* the collector's answer to the batch in flight */
    int failing;               /* the last export failed (logged once per failing spell) */
    uv_timer_t tick;           /* --otlp-flush-ms, and the kick of a full batch */
    uv_timer_t deadline;       /* --otlp-timeout-ms of the export in flight */
    int open_handles;
    kvr_metric *dropped, *exported, *queued;
};

void kvr_otlp_cfg_default(kvr_otlp_cfg *c)
{
    *c = (kvr_otlp_cfg){.sample_ratio = 1.0, .service_name = "kvroute", .batch_size = 512,
                        .flush_ms = 1000, .max_queue = 2048, .timeout_ms = 10000};
}

static void on_tick(uv_timer_t *t);

static void set_queued(kvr_otlp *o)
{
    kvr_metric_set(o->queued, NULL, (double)o->nqueued);
}

static void export_ended(kvr_otlp *o, int ok, const char *why)
{
    uv_timer_stop(&o->deadline);
    o->att = NULL;
    if (ok) {
        kvr_metric_inc(o->exported, NULL, (double)o->nsent);
        if (o->failing)
            KVR_INFO("msg=\"OTLP collector accepts spans again\" endpoint=%s", o->endpoint);
        o->failing = 0;
    } else {
        kvr_metric_inc(o->dropped, NULL, (double)o->nsent);
        if (!o->failing)
            KVR_WARN("msg=\"OTLP export failed: spans dropped\" endpoint=%s spans=%zu "
                     "reason=\"%s\"",
                     o->endpoint, o->nsent, why);
        o->failing = 1;
    }
    o->nsent = 0;
    kvr_buf_reset(&o->body);
    if (o->nqueued >= o->cfg.batch_size) /* a full batch waited: send it on the next turn */
        uv_timer_start(&o->tick, on_tick, 0, o->cfg.flush_ms);
}

static void on_headers(void *ud, int status, const kvr_http_header *h, size_t n)
{
    (void)h, (void)n;
    ((kvr_otlp *)ud)->status = status;
}

static int on_body(void *ud, const char *data, size_t len)
{
    (void)ud, (void)data, (void)len; /* an OTLP partial-success answer changes nothing here */
    return 0;
}

static void on_done(void *ud, kvr_upstream_err err, const char *msg, int got_headers)
{
    kvr_otlp *o = ud;
    char why[160];
    if (err != KVR_UP_OK)
        snprintf(why, sizeof(why), "%s: %s", kvr_upstream_err_name(err), msg ? msg : "");
    else
        snprintf(why, sizeof(why), "HTTP %d", o->status);
    export_ended(o, err == KVR_UP_OK && got_headers && o->status / 100 == 2, why);
}

static const kvr_upstream_cbs export_cbs = {on_headers, on_body, on_done};

static void on_deadline(uv_timer_t *t)
{
    kvr_otlp *o = t->data;
    if (!o->att)
        return;
    kvr_upstream_cancel(o->att);
    export_ended(o, 0, "no answer within --otlp-timeout-ms");
}

/* Moves up to a batch of queued spans into the request body and posts it. */
static void export_batch(kvr_otlp *o)
{
    if (o->att || !o->nqueued)
        return;
    size_t n = 0, cut = 0;
    /* Spans are separated by ",\n" (never inside a compact JSON span: strings escape \n). */
    for (const char *p = o->queue.data, *end = p + o->queue.len; n < o->cfg.batch_size;) {
        const char *sep = memmem(p, (size_t)(end - p), ",\n", 2);
        n++;
        if (!sep || n == o->cfg.batch_size) {
            cut = sep ? (size_t)(sep - o->queue.data) : o->queue.len;
            break;
        }
        p = sep + 2;
    }
    kvr_buf_reset(&o->body);
    if (kvr_buf_puts(&o->body, o->head) < 0 ||
        kvr_buf_append(&o->body, o->queue.data, cut) < 0 || kvr_buf_puts(&o->body, "]}]}]}") < 0) {
        kvr_buf_reset(&o->body);
        return; /* out of memory: the spans stay queued */
    }
    kvr_buf_consume(&o->queue, cut < o->queue.len ? cut + 2 : cut);
    o->nqueued -= n;
    o->nsent = n;
    set_queued(o);
    static const kvr_http_header h[] = {{"Content-Type", 12, "application/json", 16}};
    o->status = 0;
    o->att = kvr_upstream_start(o->up, "POST", o->endpoint, h, 1, o->body.data, o->body.len,
                                &export_cbs, o);
    if (!o->att) {
        export_ended(o, 0, "the export could not start");
        return;
    }
    uv_timer_start(&o->deadline, on_deadline, o->cfg.timeout_ms, 0);
}

static void on_tick(uv_timer_t *t)
{
    export_batch(t->data);
}

static void register_metrics(kvr_metrics *m, kvr_metric **dropped, kvr_metric **exported,
                             kvr_metric **queued)
{
    *dropped = kvr_metrics_counter(m, "kvroute_otlp_dropped_spans_total",
                                   "Spans not exported: queue full, or the collector failed, "
                                   "refused or did not answer",
                                   0, NULL);
    *exported = kvr_metrics_counter(m, "kvroute_otlp_exported_spans_total",
                                    "Spans the OTLP collector accepted", 0, NULL);
    *queued = kvr_metrics_gauge(m, "kvroute_otlp_queue_spans", "Spans waiting for export", 0,
                                NULL);
}

void kvr_otlp_metrics_register(kvr_metrics *m)
{
    kvr_metric *a, *b, *c;
    register_metrics(m, &a, &b, &c);
}

kvr_otlp *kvr_otlp_new(uv_loop_t *loop, kvr_upstream *up, kvr_metrics *m, const kvr_otlp_cfg *c)
{
    if (!c->endpoint || !*c->endpoint)
        return NULL;
    kvr_otlp *o = calloc(1, sizeof(*o));
    json_t *svc = json_string(c->service_name ? c->service_name : "kvroute");
    char *svc_json = svc ? json_dumps(svc, JSON_ENCODE_ANY) : NULL;
    json_decref(svc);
    if (!o || !svc_json || !(o->endpoint = strdup(c->endpoint)))
        abort();
    kvr_buf b;
    kvr_buf_init(&b, 0);
    if (kvr_buf_printf(&b,
                       "{\"resourceSpans\":[{\"resource\":{\"attributes\":[{\"key\":"
                       "\"service.name\",\"value\":{\"stringValue\":%s}}]},\"scopeSpans\":[{"
                       "\"scope\":{\"name\":\"kvroute\"},\"spans\":[",
                       svc_json) < 0 ||
        !(o->head = strndup(b.data, b.len)))
        abort();
    kvr_buf_free(&b);
    free(svc_json);
    o->loop = loop;
    o->up = up;
    o->cfg = *c;
    o->cfg.endpoint = o->endpoint;
    o->cfg.service_name = NULL;
    if (!o->cfg.batch_size)
        o->cfg.batch_size = 1;
    if (!o->cfg.flush_ms)
        o->cfg.flush_ms = 1;
    kvr_buf_init(&o->queue, 0);
    kvr_buf_init(&o->body, 0);
    register_metrics(m, &o->dropped, &o->exported, &o->queued);
    uv_timer_init(loop, &o->tick);
    uv_timer_init(loop, &o->deadline);
    o->tick.data = o->deadline.data = o;
    o->open_handles = 2;
    uv_timer_start(&o->tick, on_tick, o->cfg.flush_ms, o->cfg.flush_ms);
    return o;
}

static void on_closed(uv_handle_t *h)
{
    kvr_otlp *o = h->data;
    if (--o->open_handles)
        return;
    kvr_buf_free(&o->queue);
    kvr_buf_free(&o->body);
    free(o->endpoint);
    free(o->head);
    free(o);
}

void kvr_otlp_close(kvr_otlp *o)
{
    if (!o)
        return;
    if (o->att)
        kvr_upstream_cancel(o->att);
    o->att = NULL;
    if (o->nqueued)
        KVR_INFO("msg=\"exit: queued spans not exported\" spans=%zu", o->nqueued);
    uv_timer_stop(&o->tick);
    uv_timer_stop(&o->deadline);
    uv_close((uv_handle_t *)&o->tick, on_closed);
    uv_close((uv_handle_t *)&o->deadline, on_closed);
}

static json_t *hex_id(const uint8_t *id, size_t n)
{
    char hex[33];
    kvr_trace_hex(id, n, hex);
    return json_string(hex);
}

static json_t *u64_string(uint64_t v)
{
    char s[24];
    snprintf(s, sizeof(s), "%" PRIu64, v);
    return json_string(s);
}

static json_t *attr_json(const kvr_span_attr *a)
{
    json_t *v;
    if (a->type == KVR_ATTR_INT) {
        char s[24];
        snprintf(s, sizeof(s), "%" PRId64, a->i);
        v = json_pack("{s:s}", "intValue", s);
    } else if (a->type == KVR_ATTR_DOUBLE) {
        v = json_pack("{s:f}", "doubleValue", a->d);
    } else {
        v = json_pack("{s:s?}", "stringValue", a->s ? a->s : "");
    }
    return json_pack("{s:s,s:o}", "key", a->key, "value", v);
}

/* One span as opentelemetry-proto's JSON mapping writes it. NULL when out of memory or a
 * string is not UTF-8 (jansson refuses those). */
static char *encode(const kvr_span *s)
{
    json_t *attrs = json_array();
    for (size_t i = 0; attrs && i < s->nattrs; i++)
        json_array_append_new(attrs, attr_json(&s->attrs[i]));
    json_t *j = json_pack("{s:o,s:o,s:s,s:i,s:o,s:o,s:o}", "traceId", hex_id(s->trace_id, 16),
                          "spanId", hex_id(s->span_id, 8), "name", s->name, "kind",
                          (int)s->kind, "startTimeUnixNano", u64_string(s->start_unix_ns),
                          "endTimeUnixNano", u64_string(s->end_unix_ns), "attributes", attrs);
    if (j && s->parent_id)
        json_object_set_new(j, "parentSpanId", hex_id(s->parent_id, 8));
    if (j && s->error)
        json_object_set_new(j, "status", json_pack("{s:i,s:s}", "code", 2, "message",
                                                   s->message ? s->message : ""));
    char *out = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    return out;
}

void kvr_otlp_record(kvr_otlp *o, const kvr_span *s)
{
    if (!o)
        return;
    char *enc = o->nqueued < o->cfg.max_queue ? encode(s) : NULL;
    if (!enc || (o->nqueued && kvr_buf_append(&o->queue, ",\n", 2) < 0) ||
        kvr_buf_puts(&o->queue, enc) < 0) {
        free(enc);
        kvr_metric_inc(o->dropped, NULL, 1);
        return;
    }
    free(enc);
    o->nqueued++;
    set_queued(o);
    if (o->nqueued >= o->cfg.batch_size && !o->att)
        uv_timer_start(&o->tick, on_tick, 0, o->cfg.flush_ms); /* export on the next turn */
}

int kvr_trace_begin(kvr_otlp *o, kvr_req_trace *t, const char *traceparent,
                    uint64_t start_mono_ns)
{
    memset(t, 0, sizeof(*t));
    if (!o)
        return 0;
    t->on = 1;
    uint64_t now = kvr_now_ns();
    t->start_mono_ns = start_mono_ns;
    t->start_unix_ns = kvr_unix_ns() - (now > start_mono_ns ? now - start_mono_ns : 0);
    kvr_trace_parent p;
    if (traceparent && kvr_traceparent_parse(traceparent, strlen(traceparent), &p) == 0) {
        t->has_parent = 1;
        memcpy(t->trace_id, p.trace_id, 16);
        memcpy(t->parent_id, p.span_id, 8);
        /* Only the flag this version defines goes on: we replace the span, so bits we do not
         * know cannot be vouched for (W3C Trace Context §3.2.2.5). */
        t->flags = p.flags & KVR_TRACE_SAMPLED;
        t->sampled = t->flags; /* parent-based, OpenTelemetry's default */
    } else {
        kvr_trace_random_id(t->trace_id, 16);
        /* TraceIdRatioBased: the id's last 8 bytes, as a fraction of 2^64, under the ratio. */
        uint64_t x = 0;
        for (int i = 8; i < 16; i++)
            x = x << 8 | t->trace_id[i];
        double r = o->cfg.sample_ratio;
        t->sampled = r >= 1.0 || (r > 0 && (double)(x >> 11) * 0x1p-53 < r);
        t->flags = t->sampled ? KVR_TRACE_SAMPLED : 0;
    }
    kvr_trace_random_id(t->server_id, 8);
    return t->has_parent;
}

const char *kvr_trace_attempt(kvr_req_trace *t)
{
    kvr_trace_random_id(t->attempt_id, 8);
    kvr_traceparent_format(t->trace_id, t->attempt_id, t->flags, t->traceparent);
    return t->traceparent;
}

uint64_t kvr_trace_unix_ns(const kvr_req_trace *t, uint64_t mono_ns)
{
    return mono_ns >= t->start_mono_ns ? t->start_unix_ns + (mono_ns - t->start_mono_ns)
                                       : t->start_unix_ns - (t->start_mono_ns - mono_ns);
}
