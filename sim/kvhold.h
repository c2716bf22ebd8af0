/* kvroute-sim's held KV blocks: what a prefill keeps for a decode to fetch. vLLM's
 * NixlConnector on a prefill (kv_transfer_params.do_remote_decode) does not free a finished
 * request's blocks (request_finished() returns delay_free_blocks) until the decode has read
 * them or VLLM_NIXL_ABORT_REQUEST_TIMEOUT passes; SGLang's prefill keeps a bootstrap room's KV
 * until its decode has pulled it. Here an entry takes one reference on each block, so the pool
 * can neither reuse nor evict them, and gives it back when the blocks are fetched, the hold
 * expires (--kv-hold-ms) or the table is full (--kv-hold-max-requests, oldest first).
 *
 * Entries are kept in insertion order; with one hold time for all, that is expiry order.
 * Single-threaded (the loop thread); no timers here: the caller runs kvr_sim_hold_expire(). */
#ifndef KVR_SIM_KVHOLD_H
#define KVR_SIM_KVHOLD_H
#include <stddef.h>
#include <stdint.h>

#include "kvcache.h"

/** One held transfer. Owned by the table; valid until it is released. */
typedef struct kvr_sim_hold_entry {
    char *key;          /**< remote_request_id, or "room:<bootstrap_room>" */
    kvr_sim_kv *kv;     /**< the pool holding the blocks (the rank that computed them) */
    int rank;           /**< that rank */
    uint32_t *blocks;   /**< `n` block ids in prefix order (remote_block_ids) */
    size_t n;
    uint32_t *tokens;   /**< n × block_size token ids: what the blocks hold */
    uint64_t expires_ms;/**< monotonic ms after which the hold lapses */
} kvr_sim_hold_entry;

typedef struct kvr_sim_hold kvr_sim_hold;

/** An empty table of at most `max_entries` (>= 1) holds. NULL on OOM. */
kvr_sim_hold *kvr_sim_hold_new(size_t max_entries);
/** Releases every hold (the pools must still exist) and frees the table; NULL is fine. */
void kvr_sim_hold_free(kvr_sim_hold *h);

/** Holds `n` in-use blocks of `kv` (one more reference each) under `key` (copied), with their
 *  `tokens` (n × block size ids, copied), until `expires_ms`. A hold already under `key` is
 *  released first; when the table is full the oldest hold is released (counted in
 *  kvr_sim_hold_evicted). Returns 0, or -1 on OOM (nothing held). */
int kvr_sim_hold_put(kvr_sim_hold *h, const char *key, kvr_sim_kv *kv, int rank,
                     const uint32_t *blocks, size_t n, const uint32_t *tokens,
                     uint64_t expires_ms);
/** The hold under `key`, or NULL. */
const kvr_sim_hold_entry *kvr_sim_hold_get(const kvr_sim_hold *h, const char *key);
/** Gives the blocks of `key` back to their pool (last block first, as vLLM frees) and forgets
 *  it. Returns 0, or -1 when there is no such hold. */
int kvr_sim_hold_release(kvr_sim_hold *h, const char *key);
/** Releases every hold whose expires_ms <= now_ms. Returns how many. */
size_t kvr_sim_hold_expire(kvr_sim_hold *h, uint64_t now_ms);
/** The earliest expires_ms of the holds, or UINT64_MAX when there is none. */
uint64_t kvr_sim_hold_next_expiry(const kvr_sim_hold *h);
/** Holds in the table. */
size_t kvr_sim_hold_count(const kvr_sim_hold *h);
/** Blocks held over all entries. */
uint64_t kvr_sim_hold_blocks(const kvr_sim_hold *h);
/** Holds released because they expired / because the table was full, since creation. */
uint64_t kvr_sim_hold_expired(const kvr_sim_hold *h);
uint64_t kvr_sim_hold_evicted(const kvr_sim_hold *h);

#endif
