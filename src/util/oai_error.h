/* OpenAI-style error bodies: {"error":{"message":…,"type":…,"param":…,"code":…}}, and
 * Anthropic's {"type":"error","error":{"type":…,"message":…}} for its paths. Shared by the HTTP
 * server (framing errors), the API handlers and kvroute-sim so every error on a path has the
 * shape that path's clients parse. */
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

/** Anthropic's error type for an HTTP status: 401 → "authentication_error", 403 →
 *  "permission_error", 404 → "not_found_error", 413 → "request_too_large", 429 →
 *  "rate_limit_error", 503 and 529 → "overloaded_error", other 5xx → "api_error", anything
 *  else → "invalid_request_error". */
const char *kvr_anthropic_error_type(int status);
/** Appends Anthropic's error body {"type":"error","error":{"type":…,"message":…}}. Returns 0
 *  or -1 when `out` is full. */
int kvr_anthropic_error_json(kvr_buf *out, int status, const char *message);
/** 1 when `path` belongs to Anthropic's API (/v1/messages and the paths under it): errors
 *  answered there take Anthropic's shape, which its clients parse. `path` may be NULL. */
int kvr_anthropic_path(const char *path);
/** The error body for a request to `path`: Anthropic's shape on its paths (`type`, `param`
 *  and `code` then unused: the status gives the type), else OpenAI's with `type` (NULL = the
 *  status's). Returns 0 or -1 when `out` is full. */
int kvr_error_json_for(kvr_buf *out, const char *path, int status, const char *type,
                       const char *message, const char *param, const char *code);

#endif
