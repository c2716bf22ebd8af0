/* kvroute-sim's KV block pool, modelled on vLLM V1's BlockPool (vllm/v1/core/block_pool.py):
 *
 * - `nblocks` physical blocks of `block_size` tokens each. A block is in use while a sequence
 *   holds it (ref count > 0) and free otherwise; free blocks sit in one LRU free queue,
 *   initially in block-id order.
 * - A full block can be *cached*: it is then findable by its block hash, a chain hash of the
 *   parent block's hash and the block's token ids, so a hash names the whole prefix up to it.
 *   Cached blocks stay cached after they are freed, until reused.
 * - Allocation pops the head of the free queue; a popped cached block loses its hash then
 *   (eviction, one BlockRemoved event per block). Freed blocks go to the tail, and callers free
 *   a sequence's blocks last-first (vLLM frees in reverse), so the tail of a prefix is evicted
 *   before its head. Touching a free block (a prefix-cache hit) takes it out of the queue.
 * - Like vLLM, identical content computed twice gives two physical blocks with the same hash;
 *   both are announced (BlockStored) and removed (BlockRemoved) separately; a lookup returns
 *   any one of them.
 * - Differences from vLLM: no reserved null block (all `nblocks` are usable); one KV group;
 *   hashes are XXH3-64 (vLLM: SHA-256 of pickled tuples, truncated to 64 bits on the wire).
 *
 * Single-threaded (the loop thread). Block ids are uint32 in [0, nblocks). */
#ifndef KVR_SIM_KVCACHE_H
#define KVR_SIM_KVCACHE_H
#include <stddef.h>
#include <stdint.h>

typedef struct kvr_sim_kv kvr_sim_kv;

/** Receives the cache events as they happen (the KV-event publisher batches them per step).
 *  All pointers are valid only during the call. Any callback may be NULL. */
typedef struct kvr_sim_kv_sink {
    /** Blocks entered the prefix cache: `n` hashes in prefix order; `parent` is the hash of the
     *  block before the first one, absent (`has_parent` 0) when the first is block 0 of its
     *  sequence; `tokens` holds n × block_size ids (vLLM's BlockStored). */
    void (*stored)(void *ud, const uint64_t *hashes, size_t n, int has_parent, uint64_t parent,
                   const uint32_t *tokens, size_t ntokens, uint32_t block_size);
    /** A cached block was evicted (vLLM's BlockRemoved, one per hash). */
    void (*removed)(void *ud, uint64_t hash);
    /** The whole prefix cache was reset (vLLM's AllBlocksCleared). */
    void (*cleared)(void *ud);
    void *ud;
} kvr_sim_kv_sink;

/** Creates a pool of `nblocks` (>= 1) blocks of `block_size` (>= 1) tokens. `hash_seed` seeds
 *  the hash of the empty prefix (vLLM's NONE_HASH, from PYTHONHASHSEED). NULL on OOM. */
kvr_sim_kv *kvr_sim_kv_new(uint32_t nblocks, uint32_t block_size, uint64_t hash_seed);
/** Frees the pool (NULL is fine). Blocks still held by sequences are simply forgotten. */
void kvr_sim_kv_free_pool(kvr_sim_kv *kv);
/** Sets the event sink (copied); a zeroed sink turns events off. */
void kvr_sim_kv_set_sink(kvr_sim_kv *kv, const kvr_sim_kv_sink *sink);

/** Tokens per block. */
uint32_t kvr_sim_kv_block_size(const kvr_sim_kv *kv);
/** Capacity in blocks (vllm:cache_config_info's num_gpu_blocks). */
uint32_t kvr_sim_kv_num_blocks(const kvr_sim_kv *kv);
/** Blocks in the free queue (never used, cached-and-evictable, or plain free). */
uint32_t kvr_sim_kv_num_free(const kvr_sim_kv *kv);
/** Blocks held by sequences (ref count > 0). */
uint32_t kvr_sim_kv_num_used(const kvr_sim_kv *kv);
/** Physical blocks currently holding a hash (in use or free). */
uint32_t kvr_sim_kv_num_cached(const kvr_sim_kv *kv);
/** vllm:kv_cache_usage_perc: used / total, in [0, 1]. */
double kvr_sim_kv_usage(const kvr_sim_kv *kv);
/** Blocks evicted (hash dropped on reuse, or by kvr_sim_kv_evict_free) since creation. */
uint64_t kvr_sim_kv_evictions(const kvr_sim_kv *kv);

/** Hash of a block of `block_size` tokens whose prefix hash is `parent`; use
 *  kvr_sim_kv_root_hash() as the parent of block 0. XXH3-64 of the token ids (native u32s)
 *  seeded with the parent. */
uint64_t kvr_sim_kv_hash_block(const kvr_sim_kv *kv, uint64_t parent, const uint32_t *tokens);
/** The parent hash of block 0 (vLLM's NONE_HASH), derived from the pool's hash_seed. */
uint64_t kvr_sim_kv_root_hash(const kvr_sim_kv *kv);

/** Longest cached leading run: for i = 0.. while hashes[i] is cached, stores one block holding
 *  it in out[i]. Returns the run length (<= n). Changes nothing (vLLM's find_longest_cache_hit). */
size_t kvr_sim_kv_longest_hit(const kvr_sim_kv *kv, const uint64_t *hashes, size_t n,
                              uint32_t *out);
/** How many of `blocks` are free (ref 0) and would leave the free queue if touched. */
size_t kvr_sim_kv_count_free(const kvr_sim_kv *kv, const uint32_t *blocks, size_t n);
/** Takes a reference on each block (prefix-cache hit); free ones leave the free queue. */
void kvr_sim_kv_touch(kvr_sim_kv *kv, const uint32_t *blocks, size_t n);
/** Allocates `n` blocks from the head of the free queue into `out` (ref 1), evicting cached
 *  ones. Returns 0, or -1 (nothing changed) when fewer than `n` are free. */
int kvr_sim_kv_alloc(kvr_sim_kv *kv, size_t n, uint32_t *out);
/** Puts `n` in-use, not-yet-cached blocks into the prefix cache under `hashes` and reports one
 *  `stored` event (see kvr_sim_kv_sink). `tokens` are the n × block_size ids they hold. */
void kvr_sim_kv_cache(kvr_sim_kv *kv, const uint32_t *blocks, const uint64_t *hashes, size_t n,
                      int has_parent, uint64_t parent, const uint32_t *tokens);
/** Drops one reference from each of `n` blocks, last block first; blocks reaching 0 go to the
 *  tail of the free queue in that order (their hashes stay cached). */
void kvr_sim_kv_release(kvr_sim_kv *kv, const uint32_t *blocks, size_t n);
/** Evicts every free (ref 0) cached block now, in free-queue order (least recently freed
 *  first), reporting one `removed` per block exactly as reuse would, and counts them as
 *  evictions. Blocks held by sequences keep their hashes, so unlike kvr_sim_kv_reset() this
 *  works while requests run. The blocks stay where they are in the free queue. Returns the
 *  number evicted. (No vLLM counterpart: it models memory pressure on demand.) */
size_t kvr_sim_kv_evict_free(kvr_sim_kv *kv);
/** vLLM's reset_prefix_cache(): drops every hash and reports `cleared`. Refused (returns -1,
 *  nothing changes) while any block is in use, as vLLM refuses. Returns 0 on success. */
int kvr_sim_kv_reset(kvr_sim_kv *kv);

#endif
