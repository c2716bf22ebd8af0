/* Token ids of a request, for precise routing (issue 13): the prompt exactly as the engine will
 * cache it, so kvroute can hash it into the same token blocks the worker's KV events describe.
 * Sources, first available (kvr_tokenize):
 *   1. the `x-kvroute-token-ids` request header: comma-separated decimal ids (spaces around
 *      commas allowed), each < 2^32;
 *   2. a completions request whose `prompt` is an array of integers (token ids) — an array of
 *      arrays (several prompts) is not a single prompt: not used;
 *   3. the cache: ids already fetched for an identical cache key (the route's routing text);
 *   4. `POST /tokenize` on a worker (vLLM's shapes, reference/vllm-kv-events.md §3): chat form
 *      {"model", "messages", "tools"?, "add_generation_prompt": true} built from the request's
 *      own `messages` and `tools` JSON (copied byte for byte), or completion form
 *      {"model", "prompt"} with a string prompt; the reply's `tokens` array is the answer.
 *      Members of the request that change the rendering are copied byte for byte too when
 *      present (the reference's pitfall: block 0 must match): `add_special_tokens`, and for
 *      chat `add_generation_prompt` (replacing the default true), `continue_final_message`,
 *      `chat_template`, `chat_template_kwargs`. Bounded by `timeout_ms` (0 = only the upstream
 *      client's own timeouts); the answer is cached (LRU, `cache_entries`) under the digest of
 *      the cache key together with the model, the form and those members.
 * Anything else (no usable field, a failed, late or malformed tokenize) gives no ids: the
 * caller then routes approximately.
 *
 * Memory: the cache holds at most `cache_entries` entries of at most KVR_TOKENIZE_MAX_IDS ids
 * each (longer answers are used but not cached), plus one key digest per entry.
 * All on the loop thread. */
#ifndef KVR_PROXY_TOKENIZE_H
#define KVR_PROXY_TOKENIZE_H
#include <stddef.h>
#include <stdint.h>

#include "upstream/upstream.h"

/** Longest id list the cache keeps (a 128 K-token context; ~512 KiB). */
#define KVR_TOKENIZE_MAX_IDS 131072u

/** Where the ids came from (or why there are none). Names: kvr_tokenize_source_name(). */
typedef enum {
    KVR_TOK_HEADER = 0,  /**< "header" */
    KVR_TOK_PROMPT,      /**< "prompt_ids" */
    KVR_TOK_CACHE,       /**< "cache" */
    KVR_TOK_WORKER,      /**< "worker": a /tokenize call answered in time */
    KVR_TOK_TIMEOUT,     /**< "timeout": /tokenize did not answer within timeout_ms */
    KVR_TOK_FAILED,      /**< "failed": connect error, non-2xx, malformed reply, bad header */
    KVR_TOK_NONE,        /**< "none": nothing to tokenize (no messages / prompt) */
    KVR_TOK_NSOURCES
} kvr_tokenize_source;
const char *kvr_tokenize_source_name(kvr_tokenize_source s);

/** Settings (flags). */
typedef struct kvr_tokenize_cfg {
    uint64_t timeout_ms;     /**< --tokenize-timeout-ms (100) */
    size_t cache_entries;    /**< --tokenize-cache-entries (4096; 0 = no cache) */
} kvr_tokenize_cfg;

/** What to tokenize. Every pointer is borrowed for the duration of kvr_tokenize() only (the
 *  module copies what it keeps). */
typedef struct kvr_tokenize_req {
    int chat;                  /**< 1: chat completions body (messages, tools); 0: completions
                                    (prompt) */
    const char *body;          /**< the client's JSON body */
    size_t body_len;
    const char *header_ids;    /**< x-kvroute-token-ids value, NULL when absent */
    size_t header_len;
    const void *cache_key;     /**< identifies the prompt (the routing text); NULL = no cache */
    size_t cache_key_len;
    const char *worker_url;    /**< base URL of the worker to ask ("http://h:p") */
    const char *model;         /**< `model` to send in the /tokenize body (the target's) */
    const char *api_key;       /**< worker's key, sent as Authorization: Bearer (NULL = none) */
} kvr_tokenize_req;

/** The answer: `ids` (n ids, borrowed for the call only; NULL when none) and its source. */
typedef void (*kvr_tokenize_cb)(void *ud, const uint32_t *ids, size_t n, kvr_tokenize_source src);

typedef struct kvr_tokenizer kvr_tokenizer;
typedef struct kvr_tokenize_op kvr_tokenize_op;

/** Creates the tokenizer on the upstream client `up` (borrowed; must outlive it; its egress
 *  hook applies to /tokenize calls too). Aborts on out of memory. */
kvr_tokenizer *kvr_tokenizer_new(kvr_upstream *up, const kvr_tokenize_cfg *cfg);
/** Changes the settings (a smaller cache drops its oldest entries at once). */
void kvr_tokenizer_set_cfg(kvr_tokenizer *t, const kvr_tokenize_cfg *cfg);
/** Cancels every operation in progress (no callback) and frees. NULL is fine. */
void kvr_tokenizer_free(kvr_tokenizer *t);

/** Finds the ids of `r`. When they are known at once (header, prompt ids, cache, or nothing
 *  to ask) `cb` runs before this returns and the result is NULL; otherwise a /tokenize call
 *  starts and the returned operation calls `cb` exactly once later (answer, failure or
 *  timeout), unless cancelled first. Never fails otherwise (out of memory → cb with
 *  KVR_TOK_FAILED). */
kvr_tokenize_op *kvr_tokenize(kvr_tokenizer *t, const kvr_tokenize_req *r, kvr_tokenize_cb cb,
                              void *ud);
/** Cancels an operation in progress: `cb` will not run. */
void kvr_tokenize_cancel(kvr_tokenize_op *op);

/** Parses a comma-separated list of decimal ids (the header form). Returns the count and
 *  stores up to `max` ids in `out`, or -1 when malformed (empty item, non-digit, >= 2^32). */
long kvr_tokenize_parse_ids(const char *s, size_t len, uint32_t *out, size_t max);

/** Counters, for metrics. */
typedef struct kvr_tokenize_stats {
    uint64_t by_source[KVR_TOK_NSOURCES]; /**< answers given, by source */
    size_t cache_entries;                 /**< entries held */
    size_t cache_bytes;                   /**< bytes held by the cache */
} kvr_tokenize_stats;
void kvr_tokenize_stats_get(const kvr_tokenizer *t, kvr_tokenize_stats *out);

#endif
