/* The admin listener's /workers endpoints: the worker table, workers added and removed at run
 * time, and drain and weight changes. Run-time changes last until the next reload or restart
 * (the configuration is never written). */
#ifndef KVR_API_WORKERS_ADMIN_H
#define KVR_API_WORKERS_ADMIN_H
#include <jansson.h>
#include <stddef.h>

#include "app/app.h"

/** Most workers kvroute holds at once (configured and added at run time). */
#define KVR_ADMIN_WORKERS_MAX KVR_MAX_WORKERS
/** How long POST /workers waits for the new worker's /v1/models, ms. */
#define KVR_ADMIN_MODELS_TIMEOUT_MS 5000

/** GET /workers → {"policy", "workers":[row...]}, a row being {url, name, weight, role ("both",
 *  "prefill", "decode"), source ("config", or "api" for a worker added at run time),
 *  eligible, healthy, breaker ("closed", "open" or "half_open"), draining, inflight,
 *  requests, index_blocks, index_capacity, sessions (summed over its routes), queue, running,
 *  kv_usage, kv_tokens, routes:[route names], lmcache, kv_events, kv_blocks?, bootstrap_port
 *  (prefill workers only), data_parallel_rank (null for a plain worker), engine_url (the URL
 *  its requests go to)} (a data-parallel engine's ranks are rows of their own, "URL#r").
 *  POST /workers with {"url", "name"?, "weight"?, "routes"?: [route names or aliases],
 *  "role"?, "bootstrap_port"?, "data_parallel_size"?} adds a worker (kvr_app_add_worker) → 201
 *  and its row; a data-parallel engine (size > 1) adds all its ranks or none → 201 {url, name,
 *  data_parallel_size, workers: [rank rows]}; its URL and name may then not be taken again. Without `routes` and without
 *  --model, the worker's /v1/models is read first (KVR_ADMIN_MODELS_TIMEOUT_MS; 502 when it
 *  cannot be). 400 for a malformed body (kvr_admin_worker_parse), 409 when its URL or name is
 *  taken (a name may not be another worker's URL either) or the fleet is full, 422 when the
 *  egress policy refuses the URL or a named route does not exist. */
void kvr_admin_workers(kvr_app *app, kvr_http_req *r);

/** The paths under /workers/ ({name} percent-decoded; a worker's URL names it too; a
 *  data-parallel engine's name or URL names all its ranks, and each path then acts on every
 *  rank, answering with the engine's name and URL (PATCH: {url, name, data_parallel_size,
 *  workers: [rank rows]}, inflight summed); 404 for an unknown worker):
 *  POST /workers/{name}/drain, /undrain → {name, url, draining, inflight}.
 *  PATCH /workers/{name} with {"weight"?: > 0, "drain"? or "draining"?: bool} → 200 and its
 *  row; a new weight rebuilds the routes (targets without a weight of their own take it).
 *  DELETE /workers/{name} → 200 {name, url, removed: true, inflight}: a worker added at run
 *  time leaves the routes at once and its requests in flight finish
 *  (kvr_app_remove_worker); 409 for a configured one (drain it, or remove it from the
 *  configuration and reload). */
void kvr_admin_worker(kvr_app *app, kvr_http_req *r);

/** Reads a POST /workers body into `out` (strings copied; free with kvr_api_worker_free()):
 *  `url` required, an http:// worker URL (kvr_config_worker_url_ok: no query, no fragment)
 *  of at most 1024 bytes; `name` a non-empty string of printable bytes, at most 256 (default:
 *  the URL), not ending in #N (kvr_config_rank_name); `weight` a number
 *  in (0, 1e6] (default 1); `routes` an array of at most 256 non-empty strings (given:
 *  routes_set); `role` "both" (default), "prefill" or "decode"; `bootstrap_port` an integer
 *  1-65535 (a prefill worker's SGLang bootstrap port; default 8998); `data_parallel_size` an
 *  integer in [1, KVR_MAX_DP_SIZE] (1 = a plain worker); no other field. Returns 0,
 *  or 400 with a message in `msg` (cap bytes) and `out` empty. */
int kvr_admin_worker_parse(const json_t *body, kvr_api_worker *out, char *msg, size_t cap);

#endif
