/* Answers a request with an error in OpenAI's shape (Anthropic's on its paths), and counts
 * finished requests (used by the api and proxy layers alike). */
#ifndef KVR_APP_REPLY_H
#define KVR_APP_REPLY_H
#include "app/app.h"
#include "proxy/spans.h"

/** Sends `status` with {"error":{"message","type","param","code"}} (param/code may be NULL;
 *  on Anthropic's paths /v1/messages…, its shape {"type":"error","error":{"type","message"}}
 *  instead), plus `n` extra headers, counts it in kvroute_requests_total{model,endpoint,code}
 *  and the duration histogram, and releases `r`. `model` may be NULL ("" label): the request
 *  was answered without routing (400, 401, 404, 405, ...), and this is its end, so it also
 *  gets its access-log line and /status count here (kvr_reply_done). A routed request (model
 *  set) gets those from the proxy when it ends. */
void kvr_reply_error(kvr_app *app, kvr_http_req *r, const char *model, int status,
                   const char *message, const char *param, const char *code,
                   const kvr_http_header *extra, size_t n);
/** The same with an explicit OpenAI error `type`. */
void kvr_reply_error_typed(kvr_app *app, kvr_http_req *r, const char *model, int status,
                           const char *message, const char *type, const char *param,
                           const char *code, const kvr_http_header *extra, size_t n);
/** Counts a finished request in kvroute_requests_total{model,endpoint,code,key} (key: the
 *  request's tag, kvr_http_req_set_tag; "-" when none) and
 *  kvroute_request_duration_seconds{model,endpoint}. */
void kvr_reply_count(kvr_app *app, kvr_http_req *r, const char *model, int status);

/** A finished API request, described by its server-span facts (status: the client's; start
 *  and end: its life): counted in the /status figures (app->status) and written to the
 *  access log (app->access), either of which may be NULL. */
void kvr_reply_done(kvr_app *app, const kvr_span_facts *f);

#endif
