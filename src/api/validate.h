/* Validation of OpenAI and Anthropic request bodies before routing, so a malformed request
 * gets a 400 from kvroute instead of costing a worker round trip. Only the fields routing
 * depends on are checked; the worker validates the rest. */
#ifndef KVR_API_VALIDATE_H
#define KVR_API_VALIDATE_H
#include <jansson.h>
#include <stddef.h>

#include "routing/fields.h"
#include "routing/keys.h"

/** Returns 0 when `body` is acceptable for `ep`; else writes a message into `msg` (cap bytes),
 *  points `*param` at the offending field name (static string; NULL when the body is not an
 *  object) and returns 400.
 *  Checks: a JSON object; `model` a string, present except for tokenize and detokenize;
 *  `stream`, when present, a boolean; then what routing reads:
 *  chat: `messages` a non-empty array of objects with a string `role`;
 *  messages and count_tokens (Anthropic): `system` (when present) a string or an array,
 *  `tools` (when present) an array, then `messages` as for chat;
 *  completions: `prompt` a string, an array of strings, an array of token ids or an array of
 *  token-id arrays (a "prompt form"); responses: `input` (when present) a string or an array;
 *  embeddings, pooling, classify: `input` in a prompt form, or `messages` as for chat;
 *  tokenize: `prompt` in a prompt form, or `messages`; detokenize: `tokens` an array of
 *  token ids; rerank: `query` and `documents`, score: `text_1` and `text_2` when present,
 *  each a string, an array or an object. */
int kvr_api_validate(const json_t *body, kvr_endpoint ep, char *msg, size_t cap,
                     const char **param);

/** kvr_api_validate() on a scan of the body instead of its tree: for the same body, the same
 *  status, message and `*param` (fuzz/fuzz_keys.c checks this), with no tree built. `f` is a
 *  kvr_body_fields_scan() that returned 0. */
int kvr_api_validate_fields(const kvr_body_fields *f, kvr_endpoint ep, char *msg, size_t cap,
                            const char **param);

#endif
