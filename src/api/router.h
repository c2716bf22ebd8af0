/* Dispatch of data-plane requests by path and method. */
#ifndef KVR_API_ROUTER_H
#define KVR_API_ROUTER_H
#include "http/server.h"

/** The kvr_http_handler of the data-plane listener; `ud` is the kvr_app. Serves
 *  POST /v1/chat/completions, /v1/completions, /v1/responses (proxied), GET /v1/models,
 *  /healthz, /readyz, /metrics; 405 (with Allow) for a known path with another method, 404
 *  otherwise. */
void kvr_api_handle(kvr_http_req *r, void *ud);

#endif
