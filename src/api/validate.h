/* Validation of OpenAI and Anthropic request bodies before routing, so a malformed request
 * gets a 400 from kvroute instead of costing a worker round trip. Only the fields routing
 * depends on are checked; the worker validates the rest. */
#ifndef KVR_API_VALIDATE_H
#define KVR_API_VALIDATE_H
#include <jansson.h>
#include <stddef.h>

#include "routing/keys.h"

/** Returns 0 when `body` is acceptable for `ep`; else writes a message into `msg` (cap bytes),
 *  points `*param` at the offending field name (static string) and returns 400.
 *  Checks: a JSON object; `model` present and a string; chat: `messages` a non-empty array of
 *  objects with a string `role`; completions: `prompt` a string, an array of strings, an
 *  array of token ids or an array of token-id arrays; responses: `input` (when present) a
 *  string or an array; messages and count_tokens (Anthropic): `messages` as for chat,
 *  `system` (when present) a string or an array, `tools` (when present) an array; `stream`,
 *  when present, a boolean. */
int kvr_api_validate(const json_t *body, kvr_endpoint ep, char *msg, size_t cap,
                     const char **param);

#endif
