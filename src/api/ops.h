/* Operational endpoints: /v1/models, /healthz, /readyz, /metrics. */
#ifndef KVR_API_OPS_H
#define KVR_API_OPS_H
#include "app/app.h"

/** GET /v1/models: the served model list in OpenAI's shape, even with no eligible worker. */
void kvr_api_models(kvr_app *app, kvr_http_req *r);
/** GET /v1/models/{id}: that model's object, or 404 model_not_found. `id` is the path rest
 *  as sent (model names with '/' work; no percent-decoding). */
void kvr_api_model(kvr_app *app, kvr_http_req *r, const char *id);
/** GET /healthz: 200 while the process serves (503 once draining). */
void kvr_api_healthz(kvr_app *app, kvr_http_req *r);
/** GET /readyz: 200 when at least one worker is eligible and a model is known, else 503;
 *  503 ("shutting_down") from the moment SIGTERM arrives, through the shutdown delay and the
 *  drain, so a Kubernetes readiness probe takes the pod out of its Service first. */
void kvr_api_readyz(kvr_app *app, kvr_http_req *r);
/** GET /metrics: Prometheus text exposition. */
void kvr_api_metrics(kvr_app *app, kvr_http_req *r);

#endif
