/* kvroute-sim's embeddings (POST /v1/embeddings, in OpenAI's and vLLM's shape): every input is
 * tokenized as /tokenize would (a string) or taken as token ids, and gets a unit vector that
 * depends only on the model name and those ids, so a fleet of sims serving one model answers
 * alike and a string embeds exactly as the ids /tokenize gives for it. No engine time is
 * spent: there is nothing to schedule for a pooling pass this simple. */
#ifndef KVR_SIM_EMBED_H
#define KVR_SIM_EMBED_H
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"
#include "util/buf.h"

#define KVR_SIM_EMBED_DIM 64        /**< vector size unless the request asks `dimensions` */
#define KVR_SIM_EMBED_DIM_MAX 4096  /**< largest `dimensions` */
#define KVR_SIM_EMBED_INPUTS_MAX 2048 /**< most inputs in one request (OpenAI's limit) */

/** How to embed. */
typedef struct kvr_sim_embed_opts {
    const char *model;          /**< the served model: part of every vector's key */
    size_t dim;                 /**< floats per vector, 1..KVR_SIM_EMBED_DIM_MAX */
    int base64;                 /**< encoding_format "base64": little-endian float32 bytes */
    int add_special_tokens;     /**< a BOS before each string input (vLLM's default: 1) */
    size_t max_model_len;       /**< most tokens per input (vLLM's context-length 400) */
    kvr_sim_pieces *seen;       /**< pieces recorded for /detokenize (may be NULL) */
} kvr_sim_embed_opts;

/** Appends the `data` array of the answer to `input` (a string, an array of strings, an array
 *  of token ids or an array of token-id arrays) to `out`: [{"index","object":"embedding",
 *  "embedding"}...]. `*tokens` gets the input tokens in all (usage.prompt_tokens) and
 *  `*digest` a digest of every vector's key (for a reproducible response id). Returns 0; 400
 *  with a message in `msg` (cap bytes) for a malformed or too long input; 503 when memory or
 *  `out`'s cap ran out. */
int kvr_sim_embed_data(const json_t *input, const kvr_sim_embed_opts *o, kvr_buf *out,
                       size_t *tokens, uint64_t *digest, char *msg, size_t cap);

/** The unit vector (L2 norm 1, `dim` floats into `out`) of the input whose key is `key`. */
void kvr_sim_embed_vector(uint64_t key, float *out, size_t dim);

#endif
