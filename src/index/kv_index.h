/* KV block index (DESIGN §6, issue 13): which workers hold which token blocks in their KV
 * cache, as their vLLM KV events say (BlockStored / BlockRemoved / AllBlocksCleared), plus
 * short-lived speculative entries for blocks kvroute just sent and no event has confirmed yet.
 *
 * Keys: kvroute never reproduces vLLM's block hash (reference/vllm-kv-events.md §0.4, §2.2,
 * the "dual key" design of llm-d and Dynamo). A block's *router key* is
 *   key_i = XXH3-64(token ids of block i as uint32 little-endian, seed = key_{i-1}), key_{-1} = 0
 * so a key names the whole token prefix up to its block, exactly as kvr_kv_index_keys()
 * computes it for a request. Per worker, a map engine hash → (router key, reference count per
 * tier) resolves a stored event's parent_block_hash and every BlockRemoved. vLLM does not
 * de-duplicate physical blocks (the same hash can be stored twice and removed twice), so each
 * (worker, engine hash, tier) is reference-counted and a block stays resident until its last
 * copy is removed (llm-d's dedup filter keys on pod, tier, group, hash).
 *
 * A worker holds a router key in a tier while at least one engine entry of that worker mapping
 * to the key has a non-zero count in that tier. Both tiers count as cached for matching; they
 * are reported separately. A stored event whose parent engine hash is unknown for that worker
 * is skipped and counted (its blocks cannot be placed in the chain), as llm-d does; so is a
 * block past the cap. An event without token ids (CPU-offload connectors re-announce blocks
 * the router has seen) resolves each hash through the engine map instead, and skips those it
 * does not know.
 *
 * Memory: bounded by `max_blocks`, the global number of (worker, engine hash) entries plus
 * speculative (worker, key) entries; a store past the cap is skipped and counted, never grows
 * memory. Every table is sized from what it holds (grows by doubling, shrinks when a worker is
 * cleared), so memory stays proportional to the entries, never above the cap's worth.
 *
 * Block size: per worker, learned from its events' block_size (the first stored event sets
 * it; a later different value clears that worker and takes the new size, since keys of the old
 * size no longer line up). Requests are hashed in that worker's block size.
 *
 * Time: speculative entries carry an expiry in ms of a monotonic clock the caller passes
 * (`now_ms`); nothing here reads a clock.
 *
 * Not thread-safe: owned by the loop thread. Worker ids are the registry's dense ids (< 2^20). */
#ifndef KVR_INDEX_KV_INDEX_H
#define KVR_INDEX_KV_INDEX_H
#include <stddef.h>
#include <stdint.h>

#include "events/decode.h"

/** Worker ids must be below this. */
#define KVR_KV_INDEX_MAX_WORKER_ID ((size_t)1 << 20)

typedef struct kvr_kv_index kvr_kv_index;

/** Counters for one worker (GET /workers, /debug/route, kvroute_kv_blocks). */
typedef struct kvr_kv_worker_stats {
    size_t blocks[KVR_KV_NMEDIA];  /**< distinct router keys the worker holds, per tier */
    size_t entries;                /**< engine-hash entries (counted against the cap) */
    size_t speculative;            /**< unexpired-or-unswept speculative keys */
    uint32_t block_size;           /**< learned from events; 0 until the first BlockStored */
} kvr_kv_worker_stats;

/** Index-wide counters. */
typedef struct kvr_kv_index_stats {
    size_t entries;                /**< engine entries + speculative entries (<= max_blocks) */
    uint64_t skipped_unknown_parent; /**< blocks skipped: parent engine hash unknown */
    uint64_t skipped_cap;          /**< blocks skipped: max_blocks reached (or out of memory) */
    uint64_t skipped_bad_tokens;   /**< blocks skipped: token count != hashes × block_size */
    size_t memory_bytes;           /**< bytes allocated by the index */
} kvr_kv_index_stats;

/** Creates an empty index holding at most `max_blocks` (>= 1) entries (--max-kv-blocks).
 *  NULL on 0 or out of memory. */
kvr_kv_index *kvr_kv_index_create(size_t max_blocks);
/** Frees the index (NULL is fine). */
void kvr_kv_index_destroy(kvr_kv_index *ix);
/** Changes the cap; entries above a lowered cap stay until removed (new stores are skipped). */
void kvr_kv_index_set_max_blocks(kvr_kv_index *ix, size_t max_blocks);

/** Applies one BlockStored of `worker`: `n` engine hashes in prefix order, `parent` (when
 *  `has_parent`) the engine hash of the block before the first, `tokens` the n × block_size
 *  token ids (or none: resolve each hash through the engine map; the parent is then not
 *  needed and not checked), in tier `medium` (any value but GPU counts as CPU). `block_size`
 *  0 means "absent": the learned size applies. A stored hash whose router key the worker
 *  already held as a speculative entry turns it into a real one.
 *  Returns the number of blocks recorded (the rest were skipped and counted). */
size_t kvr_kv_index_stored(kvr_kv_index *ix, size_t worker, const uint64_t *hashes, size_t n,
                           int has_parent, uint64_t parent, const uint32_t *tokens,
                           size_t ntokens, uint32_t block_size, kvr_kv_medium medium);
/** Applies one BlockRemoved of `worker`: drops one reference per hash in tier `medium`
 *  (unknown hashes and tiers with no reference are ignored). Returns the router keys the
 *  worker no longer holds in tier `medium` (it may still hold them in the other tier). */
size_t kvr_kv_index_removed(kvr_kv_index *ix, size_t worker, const uint64_t *hashes, size_t n,
                            kvr_kv_medium medium);
/** Forgets everything about `worker` (AllBlocksCleared, engine restart, worker left),
 *  speculative entries and block size included. Returns the entries dropped. */
size_t kvr_kv_index_clear_worker(kvr_kv_index *ix, size_t worker);

/** Router keys of a request: writes the keys of the first min(full blocks, max) full blocks of
 *  `tokens` (`n` ids, blocks of `block_size` >= 1) into `keys` and returns the number of full
 *  blocks (the trailing partial block has no key: engines cache only full blocks). */
size_t kvr_kv_index_keys(const uint32_t *tokens, size_t n, uint32_t block_size,
                         uint64_t *keys, size_t max);
/** Length of the leading run of `keys` (in order, `nkeys`) that `worker` holds in any tier, or
 *  as a speculative entry not expired at `now_ms`. `gpu_run` (may be NULL) gets the leading
 *  run held in the GPU tier alone (speculative entries count as GPU). Never changes state. */
size_t kvr_kv_index_match(const kvr_kv_index *ix, size_t worker, const uint64_t *keys,
                          size_t nkeys, uint64_t now_ms, size_t *gpu_run);
/** Records that `worker` will hold `keys` (`n`, a request just sent there) until
 *  `expires_ms`, unless an event settles them first. Keys it already holds for real are left
 *  alone; existing speculative ones get the later expiry. Respects the cap, and speculative
 *  entries never take more than a quarter of it (keys past either are not recorded, nor
 *  counted as skipped). Returns the keys recorded or extended (not those
 *  held for real). `expires_ms` 0 records nothing. */
size_t kvr_kv_index_speculate(kvr_kv_index *ix, size_t worker, const uint64_t *keys, size_t n,
                              uint64_t expires_ms);
/** Drops up to `max` speculative entries expired at `now_ms`. Returns how many. */
size_t kvr_kv_index_sweep(kvr_kv_index *ix, uint64_t now_ms, size_t max);

/** The block size learned for `worker` (0 when none yet). */
uint32_t kvr_kv_index_block_size(const kvr_kv_index *ix, size_t worker);
/** Fills `out` for `worker` (zeros when unknown). */
void kvr_kv_index_worker_stats(const kvr_kv_index *ix, size_t worker, kvr_kv_worker_stats *out);
/** Fills `out`. */
void kvr_kv_index_stats_get(const kvr_kv_index *ix, kvr_kv_index_stats *out);

#endif
