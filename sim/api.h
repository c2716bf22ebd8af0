/* kvroute-sim HTTP endpoints, in vLLM's OpenAI-compatible shapes (docs/sim.md):
 *
 *   POST /v1/chat/completions, /v1/completions   JSON, or SSE with `stream`; `usage` carries
 *        prompt_tokens, completion_tokens, total_tokens, prompt_tokens_details.cached_tokens
 *        (vLLM shows the details only with --enable-prompt-tokens-details; the sim always does);
 *        streams end with a usage chunk when stream_options.include_usage, then [DONE].
 *   POST /tokenize        {prompt | messages[, tools, add_generation_prompt]} →
 *                         {count, max_model_len, tokens, token_strs:null}
 *   GET  /v1/models, /health (--health-status), /metrics (vmetrics.h)
 *   POST /sim/reset_prefix_cache (also vLLM's /reset_prefix_cache): AllBlocksCleared, or 409
 *        while blocks are in use (vLLM refuses then)
 *   GET|POST /sim/faults (faults.h), GET /sim/stats (engine counters as JSON)
 *
 * Errors use the OpenAI shape (util/oai_error.h): 400 bad JSON/fields/too long, 404 unknown
 * model or path, 405 wrong method, 409 reset refused, 503 queue full, and injected failures.
 * Streams send their headers when the request is admitted (after --delay-ms), like vLLM's
 * StreamingResponse; a client that leaves aborts its sequence and frees its blocks. */
#ifndef KVR_SIM_API_H
#define KVR_SIM_API_H
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "faults.h"
#include "http/server.h"
#include "kvcache.h"
#include "kvevents.h"
#include "scheduler.h"
#include "vmetrics.h"

/** Settings of the API layer (flags). Strings are copied. */
typedef struct kvr_sim_api_cfg {
    const char *model;           /**< served model name (requests naming another get 404) */
    uint32_t max_model_len;      /**< prompt + max_tokens limit, tokens (vLLM's message) */
    uint32_t default_max_tokens; /**< when the request sets none (16, like legacy OpenAI) */
    size_t max_waiting;          /**< requests waiting or delayed before new ones get 503 */
    uint64_t seed;               /**< response ids */
} kvr_sim_api_cfg;

typedef struct kvr_sim_api kvr_sim_api;

/** Wires the endpoints to the engine. None of the pointers is owned; `events` may be NULL
 *  (no KV events). NULL on OOM. */
kvr_sim_api *kvr_sim_api_new(uv_loop_t *loop, const kvr_sim_api_cfg *cfg, kvr_sim_sched *sched,
                             kvr_sim_kv *kv, kvr_sim_events *events, kvr_sim_faults *faults,
                             kvr_metrics *reg, kvr_sim_vmetrics *vm);
/** The kvr_http_handler; `ud` is the kvr_sim_api. */
void kvr_sim_api_handle(kvr_http_req *req, void *ud);
/** Frees the API once the HTTP server has closed (every request released). */
void kvr_sim_api_free(kvr_sim_api *api);

#endif
