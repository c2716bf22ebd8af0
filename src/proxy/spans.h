/* The spans of a proxied request (docs/operations.md "Tracing"): one server span for the
 * request and, as its direct children, one client span per upstream attempt, with what routing
 * decided and what the worker reported. */
#ifndef KVR_PROXY_SPANS_H
#define KVR_PROXY_SPANS_H
#include <stddef.h>
#include <stdint.h>

#include "obs/otlp.h"

/** What a span says; strings borrowed for the call, NULL when unknown. */
typedef struct kvr_span_facts {
    const char *name;        /**< "POST /v1/chat/completions" (method and endpoint template) */
    const char *method;      /**< http.request.method */
    const char *route;       /**< kvroute.route: the route's public name */
    const char *policy;      /**< kvroute.policy */
    const char *decision;    /**< kvroute.decision (x-kvroute-decision) */
    const char *worker;      /**< kvroute.worker: its base URL */
    const char *prefill_worker; /**< kvroute.prefill_worker: a disaggregated request's prefill
                                     worker (x-kvroute-prefill-worker), NULL otherwise */
    const char *url;         /**< url.full of an attempt */
    const char *request_id;  /**< kvroute.request_id (x-request-id) */
    const char *error;       /**< kvroute.error: why an attempt got no (whole) answer; on the
                                  server span, why a relayed answer was cut (status ERROR) */
    double match;            /**< kvroute.match_ratio, or < 0 for none */
    size_t attempt;          /**< kvroute.attempt (1-based) of a client span; attempts made
                                  (kvroute.attempts) for the server span */
    int status;              /**< kvroute.status and http.response.status_code (0 = none) */
    int has_usage;           /**< the worker reported usage: the token counts below are set */
    long long prompt, cached, completion; /**< tokens, kvroute's usage counters' meaning */
    double ttft_ms;          /**< kvroute.ttft_ms: to the first body byte, or < 0 */
    double headers_ms;       /**< to the response headers relayed to the client, or < 0
                                  (the access log's ttft_ms of a non-streaming answer) */
    int stream;              /**< the answer relayed was an SSE stream */
    const char *client;      /**< the client's address ("ip:port"), access log only */
    const char *key;         /**< the client key's name (never the key), NULL without client
                                  auth; access log only */
    uint64_t start_mono_ns, end_mono_ns; /**< kvr_now_ns() clock */
} kvr_span_facts;

/** Records the client span of the attempt t->attempt_id (parent: the server span). Status
 *  ERROR when no answer came or it was 4xx/5xx (HTTP client semantic conventions). Nothing
 *  when `o` is NULL or the trace is not sampled. */
void kvr_span_attempt(kvr_otlp *o, const kvr_req_trace *t, const kvr_span_facts *f);

/** Records the request's server span (parent: the client's span, if it sent traceparent).
 *  Status ERROR for 5xx (HTTP server semantic conventions). Nothing when `o` is NULL or the
 *  trace is not sampled. */
void kvr_span_server(kvr_otlp *o, const kvr_req_trace *t, const kvr_span_facts *f);

#endif
