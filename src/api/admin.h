/* The admin listener (--admin-port, off by default; loopback unless --admin-host says
 * otherwise): workers, routes, drain, reload and routing explanations. With --admin-token-file every request must
 * carry `Authorization: Bearer <token>` (401 otherwise). */
#ifndef KVR_API_ADMIN_H
#define KVR_API_ADMIN_H
#include <jansson.h>

#include "app/app.h"

/** Loads the token (first line of the file, surrounding whitespace trimmed) when configured.
 *  Returns 0, or -1 with a message in `err` (cap bytes) when the file cannot be read or is
 *  empty. */
int kvr_admin_load_token(kvr_app *app, char *err, size_t cap);
/** The kvr_http_handler of the admin listener; `ud` is the kvr_app. 405 with Allow for a known
 *  path and another method, 404 for an unknown path.
 *  GET, POST /workers; DELETE, PATCH /workers/{name}; POST /workers/{name}/drain and
 *  /undrain: api/workers_admin.h.
 *  GET /routes → {"generation", "routes":[{name, aliases, policy, index_blocks, sessions,
 *  targets:[{worker (name), url, model (upstream), weight, eligible, inflight, index_blocks,
 *  sessions}]}]}.
 *  POST /reload → 200 {"result":"ok","generation"} or 422 {"result":"error","errors":[...]}
 *  (nothing changed). A reload drops the workers added at run time.
 *  POST /debug/route (body = a request as a client would send it, headers = its headers;
 *  endpoint from `?endpoint=chat|completions|responses`, else guessed from the body's fields;
 *  the route from the body's `model`, 404 when none) → the decision kvroute would make now,
 *  without forwarding or teaching: {route, policy, decision, worker, match,
 *  session_key_bytes, routing_text_bytes, workers:[{url, name, match, matched_bytes,
 *  inflight, overloaded, session_owner, weight}]}; pipeline rows add `scorers` {name: value}
 *  (every scorer) and `score` (their weighted sum), cost rows `prefill_pending_tokens`,
 *  `uncached_tokens`, `seconds_per_token` and `cost_s`. */
void kvr_admin_handle(kvr_http_req *r, void *ud);

/** Answers `r` with `status` and `j` (compact JSON; the reference is taken over). */
void kvr_admin_reply(kvr_http_req *r, int status, json_t *j);
/** Answers `r` with `status` and an OpenAI-style error `msg`, plus `n` extra headers. */
void kvr_admin_reply_error(kvr_http_req *r, int status, const char *msg,
                           const kvr_http_header *h, size_t n);
/** The same with the error's `param` and `code` (NULL = null), as the proxied endpoints give
 *  them for the same fault (POST /debug/route validates a client's body as they do). */
void kvr_admin_reply_error_code(kvr_http_req *r, int status, const char *msg, const char *param,
                                const char *code);

#endif
