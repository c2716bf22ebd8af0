/* Error answers: OpenAI's shape, Anthropic's on its paths (util/oai_error.h). */
#include "app/reply.h"

#include <stdio.h>

#include "util/oai_error.h"
#include "util/time.h"

void kvr_reply_count(kvr_app *app, kvr_http_req *r, const char *model, int status)
{
    char code[8];
    snprintf(code, sizeof(code), "%d", status);
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
    kvr_http_resp_simple(r, status, "application/json", extra, n, b.data, b.len);
    kvr_buf_free(&b);
}
