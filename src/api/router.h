/* Dispatch of data-plane requests by path and method. */
#ifndef KVR_API_ROUTER_H
#define KVR_API_ROUTER_H
#include "http/server.h"

/** The kvr_http_handler of the data-plane listener; `ud` is the kvr_app. Serves the POST
 *  endpoints of routing/keys.h (kvr_endpoint: chat, completions, responses, messages and
 *  messages/count_tokens (Anthropic), embeddings, rerank, score, tokenize, detokenize,
 *  pooling, classify; routed by their body's `model`),
 *  GET/DELETE /v1/responses/{id}, POST /v1/responses/{id}/cancel and GET
 *  /v1/responses/{id}/input_items (to the worker that stored the response; 404 when no
 *  route's pins know it), GET /v1/models, /v1/models/{id}, /healthz, /readyz, /metrics; 405
 *  (with Allow) for a known path with another method, 404 for any other path (never
 *  forwarded). Sets the request's endpoint label (kvr_http_req_set_endpoint): the path, a
 *  template for paths with an id, "other" for unknown paths. */
void kvr_api_handle(kvr_http_req *r, void *ud);

#endif
