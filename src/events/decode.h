/* Decoder of vLLM KV-cache event batches (the msgpack payload, frame 3 of a KV-event message;
 * vllm/distributed/kv_events.py, ../shared/reference/vllm-kv-events.md §1.4). Pure: no sockets,
 * no globals, thread-safe (the KV-event thread calls it; fuzz/fuzz_kvevents.c feeds it bytes).
 *
 * Accepted shapes:
 * - batch: array [ts float, events array, data_parallel_rank int] (the rank may be absent:
 *   length 2; extra trailing elements ignored), or a map with keys "ts", "events",
 *   "data_parallel_rank" (unknown keys ignored). ts may be float64, float32 or an integer.
 * - event: a positional tagged array ["BlockStored", field…] (msgspec array_like, older vLLM)
 *   or a map with "type" (vLLM PR #42892); field order and names in the reference §1.4.
 *   BlockStored: block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
 *   lora_name, extra_keys, group_idx, … (array form: any length >= 5, i.e. tag + 4 fields;
 *   trailing fields absent = default; extra trailing elements ignored; unknown map keys
 *   ignored). BlockRemoved: block_hashes, medium, group_idx. AllBlocksCleared: no fields.
 * - hashes: positive or negative integers (negative ones, from old vLLM's Python hash(), are
 *   reinterpreted as their two's-complement uint64 bits), or bin (folded to the last 8 bytes
 *   read big-endian, left-padded with zeros when shorter), as llm-d and Dynamo do.
 * - parent_block_hash: nil, or a hash as above. The integer 0 also means "no parent"
 *   (llm-d-inference-sim writes 0 for none in its array mode).
 * - medium: nil or "GPU" (any case) → GPU; any other string ("CPU", "cpu", "DISK", …) → CPU
 *   tier (everything off the GPU counts as the lower tier).
 * - token_ids: non-negative integers < 2^32.
 * An event whose tag is a string kvroute does not know is skipped and counted (`unknown`).
 * Anything else that does not fit (not msgpack, trailing bytes after the batch, wrong types,
 * a known event with a field of the wrong type, a token id out of range) makes the whole batch
 * malformed: kvr_kv_decode returns NULL.
 *
 * Memory: one allocation per batch holding everything, at most a small constant times the
 * payload size plus msgpack-c's zone, which is freed before returning. */
#ifndef KVR_EVENTS_DECODE_H
#define KVR_EVENTS_DECODE_H
#include <stddef.h>
#include <stdint.h>

/** Event kinds (vLLM's tags). */
typedef enum {
    KVR_KV_EV_STORED = 0,   /**< "BlockStored" */
    KVR_KV_EV_REMOVED = 1,  /**< "BlockRemoved" */
    KVR_KV_EV_CLEARED = 2,  /**< "AllBlocksCleared" */
    KVR_KV_EV_NTYPES
} kvr_kv_ev_type;

/** Cache tiers: GPU memory, and everything below it (CPU offload, LMCache, disk). */
typedef enum { KVR_KV_GPU = 0, KVR_KV_CPU = 1, KVR_KV_NMEDIA } kvr_kv_medium;

/** One decoded event; its arrays point into the batch's allocation. */
typedef struct kvr_kv_event {
    kvr_kv_ev_type type;
    kvr_kv_medium medium;      /**< GPU when absent or nil */
    const uint64_t *hashes;    /**< block_hashes (folded to uint64), NULL when n is 0 */
    size_t nhashes;
    int has_parent;            /**< 1 when parent_block_hash is a non-zero hash */
    uint64_t parent;           /**< parent_block_hash when has_parent */
    const uint32_t *tokens;    /**< token_ids of the new blocks, concatenated; NULL when none */
    size_t ntokens;
    uint32_t block_size;       /**< tokens per block; 0 when absent */
    int64_t group_idx;         /**< KV-cache group; -1 when absent or nil */
} kvr_kv_event;

/** A decoded batch (one KV-event message). Free with kvr_kv_batch_free(). */
typedef struct kvr_kv_batch {
    double ts;                 /**< Unix seconds, as sent */
    int64_t dp_rank;           /**< data_parallel_rank; -1 when absent or nil */
    kvr_kv_event *events;      /**< the known events, in wire order */
    size_t nevents;
    size_t unknown;            /**< events skipped because their tag is unknown */
} kvr_kv_batch;

/** Decodes one payload of `len` bytes. Returns a new batch (caller frees with
 *  kvr_kv_batch_free), or NULL when the bytes are malformed (see the file comment) or memory
 *  ran out; then `err` (when not NULL) gets a one-line reason, truncated to `errlen`. */
kvr_kv_batch *kvr_kv_decode(const void *payload, size_t len, char *err, size_t errlen);
/** Frees a batch (NULL is fine). */
void kvr_kv_batch_free(kvr_kv_batch *b);
/** The vLLM tag of an event kind ("BlockStored", …), for metric labels. */
const char *kvr_kv_ev_type_name(kvr_kv_ev_type t);
/** "GPU" or "CPU", for metric labels. */
const char *kvr_kv_medium_name(kvr_kv_medium m);

#endif
