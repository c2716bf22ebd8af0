/* OpenAI-style and Anthropic-style error bodies. */
#include "util/oai_error.h"

#include <stdio.h>
#include <string.h>

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

const char *kvr_anthropic_error_type(int status)
{
    switch (status) {
    case 401:
        return "authentication_error";
    case 403:
        return "permission_error";
    case 404:
        return "not_found_error";
    case 413:
        return "request_too_large";
    case 429:
        return "rate_limit_error";
    case 503:
    case 529:
        return "overloaded_error";
    default:
        return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

int kvr_anthropic_error_json(kvr_buf *out, int status, const char *message)
{
    int rc = kvr_buf_puts(out, "{\"type\":\"error\",\"error\":{\"type\":");
    rc |= put_json_string(out, kvr_anthropic_error_type(status));
    rc |= kvr_buf_puts(out, ",\"message\":");
    rc |= put_json_string(out, message ? message : "");
    rc |= kvr_buf_puts(out, "}}");
    return rc ? -1 : 0;
}

int kvr_anthropic_path(const char *path)
{
    static const char base[] = "/v1/messages";
    size_t n = sizeof(base) - 1;
    return path && strncmp(path, base, n) == 0 && (path[n] == 0 || path[n] == '/');
}

int kvr_error_json_for(kvr_buf *out, const char *path, int status, const char *type,
                       const char *message, const char *param, const char *code)
{
    if (kvr_anthropic_path(path))
        return kvr_anthropic_error_json(out, status, message);
    return kvr_oai_error_json_typed(out, type ? type : kvr_oai_error_type(status), message, param,
                                    code);
}
