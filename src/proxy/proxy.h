/* A proxied request's life: parse → validate → keys → pick → forward → stream back →
 * account → teach (DESIGN §4). */
#ifndef KVR_PROXY_PROXY_H
#define KVR_PROXY_PROXY_H
#include <jansson.h>

#include "app/app.h"

/** The OpenAI endpoints kvroute proxies. */
typedef enum kvr_endpoint { KVR_EP_CHAT, KVR_EP_COMPLETIONS, KVR_EP_RESPONSES } kvr_endpoint;

/** Takes ownership of `r` (a POST to one of the endpoints) and answers it: a 4xx/503 error, a
 *  502 when the worker gave no response, or the worker's response relayed as it streams. */
void kvr_proxy_handle(kvr_app *app, kvr_http_req *r, kvr_endpoint ep);

/** A Responses API request continuing a stored response (`previous_response_id`) must reach
 *  the worker that holds it: exact identity, like a session id. Fills `out` (decision
 *  "session_id_match", match -1) and returns 1 when the id was learned from an earlier answer
 *  and its worker is eligible; 0 otherwise (the policy decides; the worker then answers for a
 *  response it does not have). Learns nothing. */
int kvr_proxy_pick_pinned(kvr_app *app, const json_t *body, kvr_endpoint ep, kvr_pick *out);

/** Ends every proxied request still in progress (drain timeout): cancels its worker transfer;
 *  a request with no response yet gets 503 (code "shutting_down"); an SSE stream gets a final
 *  error event and a proper end; any other body is cut. Returns how many were ended. The
 *  server should then let connections flush before closing them. */
size_t kvr_proxy_shutdown(kvr_app *app);

#endif
