/* kvroute-sim's store of Responses-API conversations, for `previous_response_id`.
 *
 * A stored response keeps the token ids of its conversation as the chat template renders it
 * (every input message, then the assistant message holding its output, without the
 * instructions' system message, which OpenAI does not carry over): a follow-up's prompt is its
 * own head (BOS, tools, instructions) + these ids + its new messages, so it renders exactly like
 * the same conversation sent to /v1/chat/completions and hits the same cached blocks.
 *
 * Ids are "resp_" + 16 hex digits (a digest of the seed and a counter) + the counter in hex.
 * The store is a ring of `max_entries` slots indexed by that counter: a response is dropped
 * when the response created `max_entries` after it is stored in its slot (or it finishes after
 * that one), so at most `max_entries` are kept, oldest dropped first, and memory is bounded by
 * max_entries × the longest conversation (max_model_len ids). No hashing or probing: a lookup
 * parses the counter and compares the whole id. Single-threaded. */
#ifndef KVR_SIM_RESPSTORE_H
#define KVR_SIM_RESPSTORE_H
#include <stddef.h>
#include <stdint.h>

#define KVR_SIM_RESP_ID_MAX 48 /**< bytes for an id and its NUL */

typedef struct kvr_sim_resp_store kvr_sim_resp_store;

/** A store of at most `max_entries` conversations (0 = keep nothing). `seed` makes ids differ
 *  between sims with different --seed. NULL on OOM. */
kvr_sim_resp_store *kvr_sim_resp_store_new(size_t max_entries, uint64_t seed);
/** Mixes `salt` into the ids issued from now on: sims of one fleet (same --seed) salt with
 *  their port, so no two of them issue the same id (kvroute pins ids to the worker that made
 *  them). Call before the first id. */
void kvr_sim_resp_store_salt(kvr_sim_resp_store *st, uint64_t salt);
/** Frees the store and every conversation in it (NULL is fine). */
void kvr_sim_resp_store_free(kvr_sim_resp_store *st);
/** Writes the next response id to `id` and returns its counter (pass it to _put). */
uint64_t kvr_sim_resp_store_next_id(kvr_sim_resp_store *st, char id[KVR_SIM_RESP_ID_MAX]);
/** Stores the conversation `ids` (malloc'd, `n` ids) and the response object as JSON text
 *  (`json`: malloc'd and NUL-terminated, or NULL), for GET /v1/responses/{id}, under the id
 *  made with `counter`. Ownership of both moves to the store (freed at once when the response
 *  is already too old to keep). */
void kvr_sim_resp_store_put(kvr_sim_resp_store *st, uint64_t counter, uint32_t *ids, size_t n,
                            char *json);
/** The stored conversation of `id` (valid until the next _put or _delete), or NULL when
 *  unknown, malformed, dropped, deleted, or never stored. */
const uint32_t *kvr_sim_resp_store_get(const kvr_sim_resp_store *st, const char *id, size_t *n);
/** The stored response object of `id` as JSON text (valid until the next _put or _delete),
 *  or NULL as for _get (or when it was stored without one). */
const char *kvr_sim_resp_store_get_json(const kvr_sim_resp_store *st, const char *id);
/** Forgets `id` (DELETE /v1/responses/{id}): 1 when it was stored, else 0. */
int kvr_sim_resp_store_delete(kvr_sim_resp_store *st, const char *id);
/** Conversations held now. */
size_t kvr_sim_resp_store_count(const kvr_sim_resp_store *st);

#endif
