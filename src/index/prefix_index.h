/* Prefix block index (DESIGN §6, §10): which workers most likely hold a routing text's prefix
 * in their KV cache, learned from kvroute's own decisions. One instance per model.
 *
 * The text is cut into blocks of `block_bytes` bytes (64 ≈ one 16-token vLLM block). Block i's
 * key is XXH3-64(bytes of block i, seed = key of block i-1), so a key names the whole prefix up
 * to and including its block and matching is anchored at the start of the text. The trailing
 * partial block gets its own key over exactly the remaining bytes: an exact repeat matches 1.00,
 * and since a partial block hashes a different byte count than any block of a longer text, it
 * never matches a longer text.
 *
 * Entries are (key, worker) pairs ("holdings"), each with its own position in that worker's LRU
 * list. Inserting a text touches its blocks from the last to the first, so every block is more
 * recent than its descendants: a worker's least recently used block is always a leaf, shared
 * prefixes outlive their tails, and what a worker holds is always prefix-closed. (An insert of
 * new blocks only, kvr_prefix_index_insert_new, places them right behind their held parent
 * instead: the same order holds.)
 *
 * Every holding carries a use stamp: the number of the insert call that last touched it, or
 * its parent's when placed behind it (a 32-bit clock per index, compared in serial-number
 * order). Stamps never decrease from a
 * worker's LRU tail to its head, nor from a block to its ancestors. A snapshot of the stamps of
 * the blocks a worker matched, taken when a request is routed there, lets a later correction
 * drop what that worker held no later than a given block as it was then, even though the
 * request's own blocks (and others) have been touched since (kvr_prefix_index_correct).
 *
 * Cost: matching hashes each block once and reads two cache lines per block (four or more
 * only for blocks many workers share, which stay cached), whatever the index size; stamps are
 * in a parallel array it never reads.
 *
 * Memory: one 16-byte slot per holding (44-bit key fingerprint, holder group, 14-bit worker,
 * 32-bit LRU links) plus its 4-byte use stamp, in a cuckoo table filled up to 92 %: ~21.7-22.6
 * bytes per held block at steady state (17.4-18 before stamps), up to 1.25x that right after a
 * growth step, i.e. 0.34-0.43 bytes of router memory per byte of text covered with 64-byte
 * blocks (docs/performance.md). The table is split into 256 shards that grow one at a time
 * (an O(shard) rebuild, ~40 K entries at 10 M blocks) and never past what the per-worker caps
 * can need. Two limits bound it whatever the traffic, both enforced on insert: a per-worker
 * count of holdings (`--worker-index-blocks`) and a global count of distinct keys
 * (`--max-index-blocks`).
 *
 * Not thread-safe: owned by the loop thread. */
#ifndef KVR_INDEX_PREFIX_INDEX_H
#define KVR_INDEX_PREFIX_INDEX_H
#include <stddef.h>
#include <stdint.h>

/** Worker ids must be below this (they are the registry's dense indexes 0..n-1; per-worker
 *  arrays are indexed by them). */
#define KVR_PREFIX_INDEX_MAX_WORKER_ID ((size_t)1 << 20)
/** Most workers one index tracks at once (the worker field of a slot is 14 bits). */
#define KVR_PREFIX_INDEX_MAX_WORKERS 16383u
/** Most workers recorded as holding one block; a further worker is simply not recorded for
 *  that block (a fleet that large shares its prefixes everywhere anyway). */
#define KVR_PREFIX_INDEX_MAX_HOLDERS 256u
/** Bytes of routing text per engine token assumed when converting a worker's KV capacity in
 *  tokens into index blocks (DESIGN §6: 64 bytes ≈ one 16-token vLLM block). */
#define KVR_PREFIX_INDEX_BYTES_PER_TOKEN 4

/** Configuration (flags). */
typedef struct kvr_prefix_index_cfg {
    size_t block_bytes;        /**< bytes per block, >= 1 (--block-bytes, 64) */
    size_t max_blocks;         /**< global cap on distinct block keys, >= 1
                                    (--max-index-blocks, 4,000,000) */
    size_t worker_blocks;      /**< default per-worker cap on held blocks; 0 = max_blocks
                                    (--worker-index-blocks when set) */
} kvr_prefix_index_cfg;

/** Counters, for kvroute_index_blocks / kvroute_index_evictions_total. */
typedef struct kvr_prefix_index_stats {
    size_t blocks;             /**< distinct block keys held by at least one worker */
    size_t holdings;           /**< (key, worker) entries; >= blocks */
    size_t workers;            /**< workers with a record (held blocks or a set capacity) */
    uint64_t evictions;        /**< holdings evicted to respect a cap (not worker removal) */
    uint64_t forgotten;        /**< holdings dropped because their worker left */
    uint64_t corrected;        /**< holdings dropped by kvr_prefix_index_correct() */
    size_t memory_bytes;       /**< bytes allocated by the index (table, workers, scratch) */
    size_t table_slots;        /**< slots in the table (memory_bytes is ~20 per slot) */
} kvr_prefix_index_stats;

/** Runs kept by a use snapshot; a chain with more keeps its oldest stamp for the rest. */
#define KVR_PREFIX_USE_RUNS 8

/** Use stamps of the leading blocks one worker was recorded as holding, as they were when the
 *  snapshot was taken (kvr_prefix_index_match_use). Stamps never increase along a chain, so
 *  they are kept as runs: blocks [end[r-1], end[r]) (end[-1] = 0) were last used at stamp[r].
 *  A plain value, copied with the request it belongs to; runs = 0 means no snapshot. */
typedef struct kvr_prefix_use {
    uint32_t runs;                        /**< runs filled, 0..KVR_PREFIX_USE_RUNS */
    uint32_t gen;                         /**< the worker's record then (a record forgotten
                                               since makes the snapshot void) */
    uint32_t end[KVR_PREFIX_USE_RUNS];    /**< blocks covered up to each run's end */
    uint32_t stamp[KVR_PREFIX_USE_RUNS];  /**< that run's last use (the last run's is the
                                               oldest of its blocks when runs ran out) */
} kvr_prefix_use;

typedef struct kvr_prefix_index kvr_prefix_index;

/** Block keys of one request's routing text, kept with the request so that its match, its
 *  teach when the answer starts and its reply's teach hash each block once, whatever texts the
 *  index sees between them (the index itself keeps the keys of the last text only, and
 *  concurrent requests interleave). The text passed with it may only grow from call to call
 *  (the prompt, then prompt + reply): the keys of its full blocks then never change.
 *  All-zero is empty; owned by the caller; free with kvr_prefix_keys_free(). */
typedef struct kvr_prefix_keys {
    uint64_t *key;      /**< keys of the text's first `n` full blocks */
    size_t n;
    size_t alloc;       /**< keys allocated */
    size_t block_bytes; /**< the block size they are for (0 = none yet); an index of another
                             block size neither reads nor changes them */
    uint64_t text_id;   /**< 0, or an id of the first `text_id_len` bytes of every text passed
                             with these keys (routing/text_scan.h kvr_route_text_scan_id()):
                             equal ids are taken as equal bytes, which are then not compared
                             with the text the index last bound (set by the caller) */
    size_t text_id_len;
} kvr_prefix_keys;

/** Frees the keys; `k` is then empty. NULL is a no-op. */
void kvr_prefix_keys_free(kvr_prefix_keys *k);


/** Creates an empty index. Returns NULL on a zero block_bytes/max_blocks or out of memory.
 *  Free with kvr_prefix_index_destroy(). */
kvr_prefix_index *kvr_prefix_index_create(const kvr_prefix_index_cfg *cfg);
void kvr_prefix_index_destroy(kvr_prefix_index *ix);

/** For each of the `n` workers in `workers` (registry ids, distinct), stores in `matched[i]`
 *  the bytes of `text` covered by the leading consecutive blocks that worker holds (0 when
 *  none, when the text is empty, or when the worker is unknown). The match ratio is
 *  matched / len. Hashes each block once and does one table probe per block, stopping at the
 *  first block none of these workers holds; cost does not grow with the index size. Does not
 *  touch LRU positions (picking never teaches). Never fails. Keeps the blocks' fingerprints for
 *  kvr_prefix_index_match_use(). */
void kvr_prefix_index_match(kvr_prefix_index *ix, const void *text, size_t len,
                            const size_t *workers, size_t n, size_t *matched);
/** kvr_prefix_index_match() taking and keeping the request's block keys in `kept` (NULL:
 *  exactly kvr_prefix_index_match()). Same results; only the hashing is saved. */
void kvr_prefix_index_match_kept(kvr_prefix_index *ix, const void *text, size_t len,
                                 kvr_prefix_keys *kept, const size_t *workers, size_t n,
                                 size_t *matched);

/** Fills `out` with the use stamps of the blocks covering the first `matched` bytes of the
 *  text of the last kvr_prefix_index_match() call, for `worker`, one of those it matched
 *  (pass its matched[] value). Call it right after that match: an insert in between voids
 *  it (`out->runs` is then 0, as for an unknown worker or matched = 0). Probes O(runs × log
 *  blocks) table entries and hashes nothing: cheap enough to take for every routed request. */
void kvr_prefix_index_match_use(kvr_prefix_index *ix, size_t worker, size_t matched,
                                kvr_prefix_use *out);

/** `worker` turned out not to hold block `block` (0-based) of a text it was predicted to hold
 *  when `use` was taken: an LRU cache evicts in use order, so it also lost everything it had
 *  used no later than that block. Drops the worker's holdings whose stamp is no later than
 *  block's stamp in `use` (holdings touched since the snapshot stay), then lowers its cap to
 *  the holdings left, but never below `keep_blocks` (at least 1; the caller's room for the
 *  request that showed it) nor above the current cap. Returns the holdings dropped (>= 0), or -1 when nothing applies:
 *  `block` is past the snapshot, the snapshot is empty, or the worker's record was forgotten
 *  (or never made) since. The lowered cap stays until kvr_prefix_index_raise_capacity(),
 *  kvr_prefix_index_set_worker_capacity() or forgetting the worker lifts it. */
long kvr_prefix_index_correct(kvr_prefix_index *ix, size_t worker, const kvr_prefix_use *use,
                              size_t block, size_t keep_blocks);

/** Another replica's correction (cluster/cluster.h): `worker` turned out not to hold the block
 *  whose key is `key`. As kvr_prefix_index_correct with this index's own use stamp of that
 *  holding: drops the worker's holdings used no later than it (the block included), then
 *  lowers its cap to what is left, never below `keep_blocks` (at least 1). Returns the
 *  holdings dropped, or -1 when the worker does not hold `key` here (nothing changes). */
long kvr_prefix_index_correct_key(kvr_prefix_index *ix, size_t worker, uint64_t key,
                                  size_t keep_blocks);

/** `worker` held `blocks` more than the index predicted: lifts a cap lowered by corrections by
 *  that much, back to its uncorrected value at most (no effect when none was lowered). */
void kvr_prefix_index_raise_capacity(kvr_prefix_index *ix, size_t worker, size_t blocks);

/** Advances the use clock as `calls` insert calls would, without inserting anything (for tests
 *  of clock wrap-around: stamps stay ordered however far the clock runs). */
void kvr_prefix_index_tick(kvr_prefix_index *ix, uint64_t calls);

/** Records that `worker` now holds every block of `text` (the full blocks and the trailing
 *  partial one), touching them last block first so ancestors stay more recent. Only the first
 *  min(blocks, worker cap, global cap) blocks are recorded. Then evicts, least recently used
 *  first, until the worker is within its cap, and until the distinct keys are within the
 *  global cap (taking each time the least recently used block of the worker holding the most
 *  blocks, ties at random). Returns 0, or -1 when the worker id is out of range or memory ran
 *  out (the index then holds a consistent subset of the blocks). An empty text is a no-op. */
int kvr_prefix_index_insert(kvr_prefix_index *ix, size_t worker, const void *text, size_t len);
/** kvr_prefix_index_insert() taking and keeping the request's block keys in `kept` (NULL:
 *  exactly kvr_prefix_index_insert()). Same effect and return. */
int kvr_prefix_index_insert_kept(kvr_prefix_index *ix, size_t worker, const void *text,
                                 size_t len, kvr_prefix_keys *kept);
/** kvr_prefix_index_insert_kept() for a teach that a fuller one of the same text follows
 *  soon (a request's prompt when its answer starts; its reply's end teaches prompt + reply):
 *  records the blocks `worker` does not hold yet and leaves the recency of the leading run it
 *  holds alone. The new blocks go right behind the run's last block, with its use stamp, so
 *  each block stays at least as recent as its descendants (what evicts the deepest first and
 *  keeps holdings prefix-closed) and the cost is O(log held + new blocks) instead of one
 *  touch per held block. It refreshes nothing when the worker holds every block. Room under
 *  the worker's cap is made from its least recent holdings outside the text. Where the worker
 *  holds no leading block, or one of the text's own blocks is among those least recent, it
 *  is exactly kvr_prefix_index_insert_kept(). Same return. */
int kvr_prefix_index_insert_new(kvr_prefix_index *ix, size_t worker, const void *text,
                                size_t len, kvr_prefix_keys *kept);

/** As kvr_prefix_index_insert for a text whose block keys (kvr_prefix_index_block_keys with
 *  this index's block_bytes, `n` of them, in order) were computed elsewhere: what another
 *  kvroute replica taught (cluster/cluster.h). Keys of another block size simply never match.
 *  Returns 0, or -1 as insert does. n = 0 is a no-op. */
int kvr_prefix_index_insert_keys(kvr_prefix_index *ix, size_t worker, const uint64_t *keys,
                                 size_t n);

/** Drops every block `worker` holds, at once (it left, restarted or cleared its cache), and its
 *  capacity setting (and any cap learned from corrections). Returns the number of holdings
 *  dropped. Use snapshots taken before are void for it. */
size_t kvr_prefix_index_forget_worker(kvr_prefix_index *ix, size_t worker);

/** Sets `worker`'s cap on held blocks (0 = back to the configured default), clamped to the
 *  global cap and replacing any cap learned from corrections, evicting its least recently used
 *  blocks at once if it holds more. Returns 0, or -1 when the id is out of range or memory ran
 *  out. */
int kvr_prefix_index_set_worker_capacity(kvr_prefix_index *ix, size_t worker, size_t blocks);

/** Index blocks for a worker whose KV cache holds `kv_tokens` tokens (vLLM
 *  cache_config_info num_gpu_blocks × block_size), assuming KVR_PREFIX_INDEX_BYTES_PER_TOKEN
 *  bytes of routing text per token; at least 1. */
size_t kvr_prefix_index_blocks_for_kv_tokens(int64_t kv_tokens, size_t block_bytes);

/** Blocks `worker` currently holds (0 if unknown). */
size_t kvr_prefix_index_worker_blocks(const kvr_prefix_index *ix, size_t worker);
/** `worker`'s effective cap in blocks (the default when it has no record; lowered by
 *  corrections). */
size_t kvr_prefix_index_worker_capacity(const kvr_prefix_index *ix, size_t worker);

/** Fills `out` with the counters. */
void kvr_prefix_index_stats_get(const kvr_prefix_index *ix, kvr_prefix_index_stats *out);

/** Block keys of `text` in order (full blocks, then the partial one): writes up to `max` keys
 *  into `keys` and returns the total number of blocks. For tests and the consistent_hash
 *  policy (whose key is the first block). */
size_t kvr_prefix_index_block_keys(size_t block_bytes, const void *text, size_t len,
                                   uint64_t *keys, size_t max);
/** kvr_prefix_index_block_keys() taking the keys a request kept (`kept`, for its text
 *  `text`; NULL or kept for another block size: all hashed) instead of hashing those blocks
 *  again: what a replica sends the others when it teaches (app/replicas.c). */
size_t kvr_prefix_keys_get(const kvr_prefix_keys *kept, size_t block_bytes, const void *text,
                           size_t len, uint64_t *keys, size_t max);

#endif
