/* Error answers: OpenAI's shape, Anthropic's on its paths (util/oai_error.h). */
#include "app/reply.h"

#include <stdio.h>
#include <string.h>

#include "obs/access_log.h"
#include "obs/status_stats.h"
#include "proxy/access_line.h"
#include "util/fmt.h"
#include "util/oai_error.h"
#include "util/time.h"

void kvr_reply_done(kvr_app *app, const kvr_span_facts *f)
{
    kvr_status_stats_request(app->status, kvr_now_ms(), f->status);
    if (!app->access)
        return;
    kvr_buf b;
    kvr_buf_init(&b, 0);
    if (kvr_access_line(&b, f, kvr_unix_ns() / 1000000) == 0)
        kvr_access_log_write(app->access, b.data, b.len);
    kvr_buf_free(&b);
}

/* The end of a request answered without routing: what is known of it. */
static void unrouted_done(kvr_app *app, kvr_http_req *r, int status)
{
    const char *key = kvr_http_req_tag(r);
    kvr_span_facts f = {.request_id = kvr_http_req_header(r, "x-request-id"),
                        .status = status, .match = -1, .ttft_ms = -1, .headers_ms = -1,
                        .client = kvr_http_req_peer(r),
                        .key = key && strcmp(key, "-") ? key : NULL,
                        .start_mono_ns = kvr_http_req_start_ns(r), .end_mono_ns = kvr_now_ns()};
    kvr_reply_done(app, &f);
}

void kvr_reply_count(kvr_app *app, kvr_http_req *r, const char *model, int status)
{
    char code[KVR_FMT_U64_MAX];
    kvr_fmt_u64(code, (uint64_t)(status < 0 ? 0 : status));
    const char *path = kvr_http_req_endpoint(r);
    const char *key = kvr_http_req_tag(r);
    const char *lv[] = {model ? model : "", path, code, key ? key : "-"};
    kvr_metric_inc(app->m.requests, lv, 1);
    double secs = (double)(kvr_now_ns() - kvr_http_req_start_ns(r)) / 1e9;
    kvr_metric_observe(app->m.duration, lv, secs);
}

void kvr_reply_error(kvr_app *app, kvr_http_req *r, const char *model, int status,
                   const char *message, const char *param, const char *code,
                   const kvr_http_header *extra, size_t n)
{
    kvr_reply_error_typed(app, r, model, status, message, kvr_oai_error_type(status), param,
                          code, extra, n);
}

void kvr_reply_error_typed(kvr_app *app, kvr_http_req *r, const char *model, int status,
                           const char *message, const char *type, const char *param,
                           const char *code, const kvr_http_header *extra, size_t n)
{
    kvr_buf b;
    kvr_buf_init(&b, 0);
    kvr_error_json_for(&b, kvr_http_req_path(r), status, type, message, param, code);
    kvr_reply_count(app, r, model, status);
    if (!model)
        unrouted_done(app, r, status);
    kvr_http_resp_simple(r, status, "application/json", extra, n, b.data, b.len);
    kvr_buf_free(&b);
}
