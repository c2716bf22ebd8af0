/* A proxied request's life once api has parsed, validated and routed it by model: keys →
 * pick → forward → retry → stream back → account → teach (DESIGN §4). */
#ifndef KVR_PROXY_PROXY_H
#define KVR_PROXY_PROXY_H
#include <jansson.h>

#include "app/app.h"
#include "routing/fields.h"
#include "routing/keys.h"

/** A proxied request's body as api read it: the scan of routing/fields.h, or, when api knew
 *  that the route's policy reads the routing text and the endpoint's text needs the tree
 *  anyway (every endpoint but chat and completions, whose text comes from the scan), the
 *  tree (kvr_json_read) instead, so the body is not read twice. One of the two is set. */
typedef struct kvr_proxy_body {
    const kvr_body_fields *fields; /**< the scan, or NULL */
    const json_t *tree;            /**< the tree, or NULL */
} kvr_proxy_body;

/** Takes ownership of `r` (a POST to endpoint `ep`, its JSON body validated and read as
 *  `body`, borrowed for the call; with a scan, the routing text is built here only when the
 *  route's policy reads it, from a tree only for endpoints other than chat and completions) and answers it through `route` (borrowed; the
 *  request takes its own reference): 503 + Retry-After when no target is eligible, 502 when
 *  the worker gave no response, or the worker's response relayed as it streams. The body goes
 *  out unchanged unless the chosen target's upstream model name differs from the client's
 *  `model` (then only that value is rewritten; Content-Length follows the new length; a body
 *  without `model`, as tokenize allows, goes unchanged). */
void kvr_proxy_forward(kvr_app *app, kvr_http_req *r, kvr_endpoint ep, kvr_route *route,
                       const kvr_proxy_body *body);

/** Takes ownership of `r`, a request about a stored response (GET/DELETE
 *  /v1/responses/{id}, POST …/cancel, GET …/input_items), and answers it through `route`
 *  from worker `w` (a target of `route`, the one its pins name) and no other: no retry
 *  elsewhere; 503 + Retry-After when `w` is unhealthy or its breaker open (a draining `w`
 *  still answers). Method, path and query go as the client sent them, the body unchanged;
 *  the answer's usage is not counted again and nothing is taught. */
void kvr_proxy_forward_pinned(kvr_app *app, kvr_http_req *r, kvr_route *route, kvr_worker *w);

/** A worker's engine turned unhealthy by its health checks (kvr_workers_ctx.on_down; `ud` is
 *  the app): on the next loop turn, every attempt on an unhealthy engine still waiting for its
 *  response head fails as a first-byte timeout and is retried elsewhere under the failures
 *  rules, instead of waiting out --first-byte-timeout-ms (a stopped engine accepts
 *  connections and never answers). Attempts that got their head keep their stream deadlines. */
void kvr_proxy_engine_down(void *ud, kvr_worker *engine);
/** Closes the admission queue's timer (shutdown, after kvr_proxy_shutdown). */
void kvr_proxy_stop(kvr_app *app);

/** Ends every proxied request still in progress (drain timeout): cancels its worker transfer;
 *  a request with no response yet gets 503 (code "shutting_down"); an SSE stream gets a final
 *  error event and a proper end; any other body is cut. Returns how many were ended. The
 *  server should then let connections flush before closing them. */
size_t kvr_proxy_shutdown(kvr_app *app);

#endif
