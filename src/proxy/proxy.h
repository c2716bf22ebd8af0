/* A proxied request's life: parse → validate → keys → pick → forward → stream back →
 * account → teach (DESIGN §4). */
#ifndef KVR_PROXY_PROXY_H
#define KVR_PROXY_PROXY_H
#include "app/app.h"

/** The OpenAI endpoints kvroute proxies. */
typedef enum kvr_endpoint { KVR_EP_CHAT, KVR_EP_COMPLETIONS, KVR_EP_RESPONSES } kvr_endpoint;

/** Takes ownership of `r` (a POST to one of the endpoints) and answers it: a 4xx/503 error, a
 *  502 when the worker gave no response, or the worker's response relayed as it streams. */
void kvr_proxy_handle(kvr_app *app, kvr_http_req *r, kvr_endpoint ep);

#endif
