/* A proxied request's life once api has parsed, validated and routed it by model: keys →
 * pick → forward → retry → stream back → account → teach (DESIGN §4). */
#ifndef KVR_PROXY_PROXY_H
#define KVR_PROXY_PROXY_H
#include <jansson.h>

#include "app/app.h"
#include "routing/keys.h"

/** Takes ownership of `r` (a POST to endpoint `ep`, its JSON body parsed and validated as
 *  `body`, borrowed for the call) and answers it through `route` (borrowed; the request takes
 *  its own reference): 503 + Retry-After when no target is eligible, 502 when the worker gave
 *  no response, or the worker's response relayed as it streams. The body goes out unchanged
 *  unless the chosen target's upstream model name differs from the client's `model` (then
 *  only that value is rewritten; Content-Length follows the new length). */
void kvr_proxy_forward(kvr_app *app, kvr_http_req *r, kvr_endpoint ep, kvr_route *route,
                       const json_t *body);

/** Closes the admission queue's timer (shutdown, after kvr_proxy_shutdown). */
void kvr_proxy_stop(kvr_app *app);

/** Ends every proxied request still in progress (drain timeout): cancels its worker transfer;
 *  a request with no response yet gets 503 (code "shutting_down"); an SSE stream gets a final
 *  error event and a proper end; any other body is cut. Returns how many were ended. The
 *  server should then let connections flush before closing them. */
size_t kvr_proxy_shutdown(kvr_app *app);

#endif
