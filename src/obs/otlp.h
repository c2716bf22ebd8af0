/* OpenTelemetry traces: spans encoded as OTLP/HTTP JSON (opentelemetry-proto's JSON mapping:
 * hex trace and span ids, integer enums, 64-bit integers as strings) and exported in batches
 * by POST to the collector URL as given, through the upstream client (libcurl on the loop, so
 * the egress policy's connect-time check applies). Export never blocks a request: spans wait in
 * a bounded queue, one batch is in flight at a time, and what a slow, failing or dead collector
 * cannot take is dropped and counted (kvroute_otlp_dropped_spans_total). The batching follows
 * OpenTelemetry's BatchSpanProcessor (batch size, schedule delay, max queue, export timeout). */
#ifndef KVR_OBS_OTLP_H
#define KVR_OBS_OTLP_H
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "obs/metrics.h"
#include "obs/traceparent.h"
#include "upstream/upstream.h"

/** Settings (command line / config file). */
typedef struct kvr_otlp_cfg {
    const char *endpoint;     /**< --otlp-endpoint: collector URL, e.g.
                                   http://127.0.0.1:4318/v1/traces (NULL = tracing off) */
    double sample_ratio;      /**< --otlp-sample-ratio: share of new traces recorded (1.0); a
                                   client's traceparent decides for its trace (parent-based) */
    const char *service_name; /**< --otlp-service-name: resource `service.name` (kvroute) */
    size_t batch_size;        /**< --otlp-batch-size: spans per export (512) */
    uint64_t flush_ms;        /**< --otlp-flush-ms: longest wait of a queued span (1000) */
    size_t max_queue;         /**< --otlp-max-queue: spans waiting; more are dropped (2048) */
    uint64_t timeout_ms;      /**< --otlp-timeout-ms: an export not answered by then is
                                   abandoned and its spans counted as dropped (10000) */
} kvr_otlp_cfg;

/** Fills the defaults above (endpoint NULL). */
void kvr_otlp_cfg_default(kvr_otlp_cfg *c);

typedef struct kvr_otlp kvr_otlp;

/** SpanKind of opentelemetry-proto. */
typedef enum kvr_span_kind { KVR_SPAN_SERVER = 2, KVR_SPAN_CLIENT = 3 } kvr_span_kind;

/** One attribute; `key` and `s` are borrowed for the kvr_otlp_record() call. */
typedef struct kvr_span_attr {
    const char *key;
    enum { KVR_ATTR_STR, KVR_ATTR_INT, KVR_ATTR_DOUBLE } type;
    const char *s;
    int64_t i;
    double d;
} kvr_span_attr;

/** A finished span; everything borrowed for the kvr_otlp_record() call. */
typedef struct kvr_span {
    const uint8_t *trace_id;  /**< 16 bytes */
    const uint8_t *span_id;   /**< 8 bytes */
    const uint8_t *parent_id; /**< 8 bytes, or NULL for a root span */
    const char *name;
    kvr_span_kind kind;
    uint64_t start_unix_ns, end_unix_ns;
    int error;                /**< status ERROR (else UNSET, as HTTP semantic conventions
                                   leave successful spans) */
    const char *message;      /**< status message with error, or NULL */
    const kvr_span_attr *attrs;
    size_t nattrs;
} kvr_span;

/** Creates the exporter for `c` (strings copied) on `loop`, exporting through `up` (borrowed;
 *  must outlive the exporter) and registering kvroute_otlp_dropped_spans_total,
 *  kvroute_otlp_exported_spans_total and kvroute_otlp_queue_spans in `m`. Returns NULL when
 *  c->endpoint is NULL or empty (tracing off). Aborts on out of memory. */
kvr_otlp *kvr_otlp_new(uv_loop_t *loop, kvr_upstream *up, kvr_metrics *m, const kvr_otlp_cfg *c);

/** Registers the exporter's metric families in `m` (at 0), so they exist with tracing off
 *  too (dashboards query them either way). kvr_otlp_new() registers them as well. */
void kvr_otlp_metrics_register(kvr_metrics *m);

/** Abandons the export in flight and the queued spans, closes the timers and frees the exporter
 *  once they are closed. Call before kvr_upstream_close() of its client. NULL is a no-op. */
void kvr_otlp_close(kvr_otlp *o);

/** Encodes `s` and queues it for export; when the queue already holds --otlp-max-queue spans it
 *  is dropped and counted instead. Starts an export (on the next loop turn) once a batch is
 *  full. Loop thread only. */
void kvr_otlp_record(kvr_otlp *o, const kvr_span *s);

/** The trace of one proxied request: its server span and the current attempt's client span. */
typedef struct kvr_req_trace {
    int on;                   /**< tracing configured (an exporter exists) */
    int sampled;              /**< spans of this trace are recorded */
    int has_parent;           /**< the client sent a valid traceparent */
    uint8_t flags;            /**< trace-flags sent on (the client's, or ours) */
    uint8_t trace_id[16];
    uint8_t parent_id[8];     /**< the client's span (has_parent) */
    uint8_t server_id[8];     /**< kvroute's server span */
    uint8_t attempt_id[8];    /**< the current attempt's client span */
    uint64_t start_mono_ns;   /**< the request's arrival, kvr_now_ns() clock ... */
    uint64_t start_unix_ns;   /**< ... and the same instant on the wall clock */
    char traceparent[KVR_TRACEPARENT_LEN + 1]; /**< sent to the worker of the current attempt */
} kvr_req_trace;

/** Starts the trace of a request that arrived at `start_mono_ns` (kvr_now_ns clock) with the
 *  client's `traceparent` value (NULL when none): continued when valid (sampled as its flags
 *  say), else a new trace id (sampled with --otlp-sample-ratio). With `o` NULL, t->on = 0 and
 *  nothing else happens. Returns 1 when the client's traceparent was valid. */
int kvr_trace_begin(kvr_otlp *o, kvr_req_trace *t, const char *traceparent,
                    uint64_t start_mono_ns);

/** A new attempt span (child of the server span) starts: a new t->attempt_id; returns the
 *  `traceparent` value the worker gets for it (t->traceparent), so the engine's spans are its
 *  children. */
const char *kvr_trace_attempt(kvr_req_trace *t);

/** The wall-clock time (Unix ns) of `mono_ns` (kvr_now_ns clock) in the request's trace: one
 *  offset per request, so its spans nest exactly even if the wall clock steps meanwhile. */
uint64_t kvr_trace_unix_ns(const kvr_req_trace *t, uint64_t mono_ns);

#endif
