/* kvroute-sim HTTP endpoints, in vLLM's OpenAI-compatible shapes (docs/sim.md):
 *
 *   POST /v1/chat/completions, /v1/completions   JSON, or SSE with `stream`; `usage` carries
 *        prompt_tokens, completion_tokens, total_tokens, prompt_tokens_details.cached_tokens
 *        (vLLM shows the details only with --enable-prompt-tokens-details; the sim always does);
 *        streams end with a usage chunk when stream_options.include_usage, then [DONE].
 *   POST /v1/responses     OpenAI Responses API: input (string or message items),
 *        instructions, max_output_tokens, previous_response_id, store; JSON or SSE events
 *        (response.created … response.completed); rendered through the chat template, stored
 *        conversations in respstore.h
 *   POST /v1/messages      Anthropic Messages API (system, messages, tools, max_tokens):
 *        the request's chat form (routing/anthropic.h) through the chat template; JSON or SSE
 *        in Anthropic's event sequence (message_start … message_stop); usage input_tokens
 *        excludes the cached tokens, which cache_read_input_tokens counts
 *   POST /v1/messages/count_tokens   → {input_tokens}: the prompt /v1/messages would prefill
 *   POST /tokenize        {prompt[, add_special_tokens=true]} or {messages[, tools,
 *                         add_generation_prompt=true, add_special_tokens=false]}, optional
 *                         return_token_strs → {count, max_model_len, tokens, token_strs}
 *   POST /detokenize      {tokens} → {prompt} (tokenizer.h: kvr_sim_detokenize)
 *   GET  /v1/models, /health (--health-status), /metrics (vmetrics.h)
 *   POST /sim/reset_prefix_cache (also vLLM's /reset_prefix_cache): AllBlocksCleared, or 409
 *        while blocks are in use (vLLM refuses then)
 *   POST /sim/evict: evicts every free cached block now (one BlockRemoved each) → {evicted}
 *   GET /sim/requests: the last --request-log-size generation requests received (reqlog.h),
 *        POST /sim/requests clears them
 *   GET /sim/kv_transfer/{remote_request_id}, GET /sim/bootstrap/{room}: a prefill's held KV
 *        for a decode (pd.h); chat and completions read kv_transfer_params and the bootstrap
 *        fields (kvxfer.h) and play the prefill or decode part --role gives them
 *   GET|POST /sim/faults (faults.h), GET /sim/stats (engine counters as JSON: summed over
 *        the data-parallel ranks, each rank's own under "ranks")
 *
 * Data parallelism (--data-parallel-size N, engine.h): a generation request names its rank
 * with `X-data-parallel-rank: r` (an integer in [0, N), else 400), or gets the next one in
 * round robin; reset and evict act on every rank.
 *
 * Errors use the OpenAI shape (util/oai_error.h; Anthropic's on the /v1/messages paths): 400
 * bad JSON/fields/too long, 404 unknown model, path or previous_response_id, 405 wrong method,
 * 409 reset refused, 503 queue full, and injected failures. Streams send their headers when
 * the request is admitted (after --delay-ms), like vLLM's StreamingResponse; a client that
 * leaves aborts its sequence and frees its blocks. */
#ifndef KVR_SIM_API_H
#define KVR_SIM_API_H
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "engine.h"
#include "faults.h"
#include "http/server.h"
#include "pd.h"

/** Settings of the API layer (flags). Strings are copied. */
typedef struct kvr_sim_api_cfg {
    const char *model;           /**< served model name (requests naming another get 404) */
    uint32_t max_model_len;      /**< prompt + max_tokens limit, tokens (vLLM's message) */
    uint32_t default_max_tokens; /**< when the request sets none (16, like legacy OpenAI) */
    size_t max_waiting;          /**< requests waiting or delayed before new ones get 503 */
    uint64_t seed;               /**< response ids */
    size_t detokenize_cache_entries; /**< pieces remembered for /detokenize (0 = none) */
    size_t max_stored_responses;     /**< /v1/responses kept for previous_response_id */
    const char *profile;             /**< timing profile name for /sim/stats (NULL = none) */
    size_t request_log_size;         /**< entries GET /sim/requests keeps (0 = none) */
} kvr_sim_api_cfg;

typedef struct kvr_sim_api kvr_sim_api;

/** Wires the endpoints to the `neng` (>= 1) engine ranks (engine.h); a generation request
 *  goes to the rank its X-data-parallel-rank header names (dp.h), round robin without one.
 *  None of the pointers is owned. NULL on OOM. */
kvr_sim_api *kvr_sim_api_new(uv_loop_t *loop, const kvr_sim_api_cfg *cfg, kvr_sim_engine *eng,
                             size_t neng, kvr_sim_pd *pd, kvr_sim_faults *faults,
                             kvr_metrics *reg);
/** The kvr_http_handler; `ud` is the kvr_sim_api. */
void kvr_sim_api_handle(kvr_http_req *req, void *ud);
/** The port the sim listens on, once bound: part of its response ids, so that sims sharing a
 *  --seed never issue the same one. Call before serving. */
void kvr_sim_api_set_port(kvr_sim_api *api, int port);
/** Frees the API once the HTTP server has closed (every request released). */
void kvr_sim_api_free(kvr_sim_api *api);

#endif
