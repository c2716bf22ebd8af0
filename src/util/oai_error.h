/* OpenAI-style error bodies: {"error":{"message":…,"type":…,"param":…,"code":…}}. Shared by the
 * HTTP server (framing errors) and the API handlers so every error has the same shape. */
#ifndef KVR_UTIL_OAI_ERROR_H
#define KVR_UTIL_OAI_ERROR_H
#include "util/buf.h"

/** The OpenAI error type for an HTTP status: 400/404/405/408/413/414/431 →
 *  "invalid_request_error", 401 → "authentication_error", 429 → "rate_limit_exceeded",
 *  5xx → "server_error" (503 → "service_unavailable"). */
const char *kvr_oai_error_type(int status);
/** Appends the JSON error body to `out`. `param` and `code` may be NULL (→ JSON null);
 *  strings are JSON-escaped. Returns 0 or -1 when `out` is full. */
int kvr_oai_error_json(kvr_buf *out, int status, const char *message, const char *param,
                       const char *code);

/** The same with an explicit `type` (OpenAI answers a bad key with invalid_request_error and
 *  an overload with server_error, whatever the status's usual type). */
int kvr_oai_error_json_typed(kvr_buf *out, const char *type, const char *message,
                             const char *param, const char *code);

#endif
