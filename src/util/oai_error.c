/* OpenAI-style error bodies. */
#include "util/oai_error.h"

#include <stdio.h>

const char *kvr_oai_error_type(int status)
{
    switch (status) {
    case 401:
        return "authentication_error";
    case 429:
        return "rate_limit_exceeded";
    case 503:
        return "service_unavailable";
    default:
        return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

static int put_json_string(kvr_buf *out, const char *s)
{
    if (!s)
        return kvr_buf_puts(out, "null");
    int rc = kvr_buf_append(out, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p && rc == 0; p++) {
        if (*p == '"' || *p == '\\') {
            char esc[2] = {'\\', (char)*p};
            rc = kvr_buf_append(out, esc, 2);
        } else if (*p < 0x20) {
            rc = kvr_buf_printf(out, "\\u%04x", *p);
        } else {
            rc = kvr_buf_append(out, p, 1);
        }
    }
    return rc ? rc : kvr_buf_append(out, "\"", 1);
}

int kvr_oai_error_json(kvr_buf *out, int status, const char *message, const char *param,
                       const char *code)
{
    return kvr_oai_error_json_typed(out, kvr_oai_error_type(status), message, param, code);
}

int kvr_oai_error_json_typed(kvr_buf *out, const char *type, const char *message,
                             const char *param, const char *code)
{
    int rc = kvr_buf_puts(out, "{\"error\":{\"message\":");
    rc |= put_json_string(out, message);
    rc |= kvr_buf_puts(out, ",\"type\":");
    rc |= put_json_string(out, type);
    rc |= kvr_buf_puts(out, ",\"param\":");
    rc |= put_json_string(out, param);
    rc |= kvr_buf_puts(out, ",\"code\":");
    rc |= put_json_string(out, code);
    rc |= kvr_buf_puts(out, "}}");
    return rc ? -1 : 0;
}
