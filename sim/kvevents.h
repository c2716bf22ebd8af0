/* vLLM KV-cache events from kvroute-sim, in vLLM's wire format
 * (vllm/distributed/kv_events.py; ../shared/reference/vllm-kv-events.md §1):
 *
 * - ZMQ PUB, one 3-frame message per engine step that produced events:
 *   topic (UTF-8, default empty) / sequence (8-byte big-endian uint64, 0, 1, 2, … per process) /
 *   payload (msgpack `[ts float64, events array, data_parallel_rank int]`).
 * - Events as vLLM v0.26 writes them, either positional tagged arrays ("array", the older and
 *   default msgspec array_like encoding) or maps with a "type" key ("map", vLLM PR #42892):
 *     BlockStored: block_hashes (uint64 each), parent_block_hash (uint64 | nil), token_ids,
 *                  block_size, lora_id nil, medium "GPU", lora_name nil,
 *                  extra_keys (nil per block), group_idx 0, kv_cache_spec_kind "full_attention"
 *     BlockRemoved: block_hashes (one hash per event, as vLLM emits), medium "GPU", group_idx 0
 *     AllBlocksCleared: no fields.
 *   The bytes equal the worked example of the reference (§1.5) for the same values.
 * - Bind or connect follows vLLM: bind when the endpoint contains "*" or "::" or is ipc:// or
 *   inproc://, connect otherwise; KVR_SIM_EV_BIND/CONNECT override that.
 * - Replay: a ROUTER socket (always bound, as vLLM) keeps the last `buffer_steps` batches.
 *   A request `[client_id, empty, start_seq(8B BE)]` (a DEALER sends `[empty, start_seq]`) is
 *   answered with `[client_id, empty, topic, seq, payload]` for every buffered seq >= start_seq
 *   (the topic frame as since vLLM PR #45177), then the end marker
 *   `[client_id, empty, topic, FF×8, empty payload]`. Other shapes are ignored, as vLLM does.
 *
 * Everything runs on the loop thread: PUB sends never block (ZMQ drops past the high-water
 * mark, like vLLM), the ROUTER is polled through its ZMQ_FD with uv_poll. */
#ifndef KVR_SIM_KVEVENTS_H
#define KVR_SIM_KVEVENTS_H
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "faults.h"
#include "kvcache.h"
#include "util/buf.h"

/* ---- encoder (no sockets; used by the publisher and by tests) ---- */

/** A batch of events being encoded. Zero-initialise, then kvr_sim_evbatch_init(). */
typedef struct kvr_sim_evbatch {
    kvr_buf events;  /**< msgpack of the events so far (owned) */
    size_t nevents;  /**< events in `events` */
    int map;         /**< 1: map encoding, 0: array encoding */
} kvr_sim_evbatch;

/** Starts an empty batch; `map` selects the map encoding. `cap_bytes` caps the encoded size
 *  (0 = unlimited); an event that does not fit is not added (its append returns -1). */
void kvr_sim_evbatch_init(kvr_sim_evbatch *b, int map, size_t cap_bytes);
/** Frees the encoded bytes; the batch is empty and reusable after kvr_sim_evbatch_init(). */
void kvr_sim_evbatch_free(kvr_sim_evbatch *b);
/** Appends a BlockStored (fields as in the file comment). Returns 0 or -1 (cap/OOM). */
int kvr_sim_evbatch_stored(kvr_sim_evbatch *b, const uint64_t *hashes, size_t n, int has_parent,
                           uint64_t parent, const uint32_t *tokens, size_t ntokens,
                           uint32_t block_size);
/** Appends a BlockRemoved for one hash. Returns 0 or -1. */
int kvr_sim_evbatch_removed(kvr_sim_evbatch *b, uint64_t hash);
/** Appends an AllBlocksCleared. Returns 0 or -1. */
int kvr_sim_evbatch_cleared(kvr_sim_evbatch *b);
/** Writes the payload `[ts, events, dp_rank]` to `out` (appended) and empties the batch.
 *  `ts` is Unix seconds. Returns 0 or -1 when `out` is full. */
int kvr_sim_evbatch_finish(kvr_sim_evbatch *b, double ts, int dp_rank, kvr_buf *out);

/* ---- publisher ---- */

typedef enum { KVR_SIM_EV_AUTO, KVR_SIM_EV_BIND, KVR_SIM_EV_CONNECT } kvr_sim_ev_bind;

/** Publisher settings; strings are copied. */
typedef struct kvr_sim_events_cfg {
    const char *endpoint;        /**< PUB endpoint, e.g. "tcp://127.0.0.1:5557" (required) */
    const char *replay_endpoint; /**< ROUTER endpoint (always bound) or NULL for no replay */
    const char *topic;           /**< frame 0 of every message ("" by default, as vLLM) */
    int map_format;              /**< 1: map-encoded events, 0: array-encoded */
    kvr_sim_ev_bind bind;        /**< PUB bind or connect (AUTO = vLLM's rule) */
    int hwm;                     /**< PUB send high-water mark, messages (vLLM: 100000) */
    size_t buffer_steps;         /**< batches kept for replay (vLLM's buffer_steps: 10000) */
    size_t buffer_bytes;         /**< payload bytes kept for replay (cap; oldest dropped) */
    size_t max_batch_bytes;      /**< cap on one batch's encoded events (events past it are
                                      dropped and counted) */
    int dp_rank;                 /**< data_parallel_rank of the first rank (0) */
    size_t nranks;               /**< data-parallel ranks publishing here, each with its own
                                      batch carrying dp_rank + its index (0 or 1 = one; more
                                      with --kv-events-dp shared: all ranks on one socket and
                                      one sequence, told apart by data_parallel_rank) */
    kvr_sim_faults *faults;      /**< not owned, may be NULL: drop_event_batches (counted down
                                      here) and replay_silent are read at each batch/request */
} kvr_sim_events_cfg;

typedef struct kvr_sim_events kvr_sim_events;

/** Opens the sockets (and the uv_poll for replay on `loop`). Returns NULL with a message in
 *  `err` when an endpoint cannot be bound or connected. */
kvr_sim_events *kvr_sim_events_new(uv_loop_t *loop, const kvr_sim_events_cfg *cfg, char *err,
                                   size_t errlen);
/** The current batch of the first rank, to which kvr_sim_evbatch_* calls append. */
kvr_sim_evbatch *kvr_sim_events_batch(kvr_sim_events *ev);
/** Fills `sink` so that a KV pool's events are appended to the current batch of rank index
 *  `idx` (< nranks; events that do not fit max_batch_bytes are dropped and counted). */
void kvr_sim_events_sink_rank(kvr_sim_events *ev, size_t idx, kvr_sim_kv_sink *sink);
/** kvr_sim_events_sink_rank() for index 0. */
void kvr_sim_events_sink(kvr_sim_events *ev, kvr_sim_kv_sink *sink);
/** Publishes rank index `idx`'s current batch, if it holds any event, as the next sequence
 *  number and keeps it for replay. Called once per step of that rank's engine (vLLM publishes
 *  one batch per step). Under the drop_event_batches fault the batch is numbered and kept but
 *  not sent. */
void kvr_sim_events_flush_rank(kvr_sim_events *ev, size_t idx);
/** Flushes every rank's batch, in rank order. */
void kvr_sim_events_flush(kvr_sim_events *ev);
/** vLLM's per-rank endpoint (offset_endpoint_port in vllm/distributed/kv_events.py): a tcp://
 *  endpoint's port plus `rank`; an inproc:// or ipc:// name with "_dp<rank>" appended; rank 0
 *  is the endpoint itself. Writes to `out`; returns 0, or -1 for another scheme, a tcp
 *  endpoint without a numeric port, a port past 65535 or a too small `out`. */
int kvr_sim_events_offset_endpoint(const char *ep, int rank, char *out, size_t cap);
/** The sequence number the next batch will get (= batches published so far). */
uint64_t kvr_sim_events_next_seq(const kvr_sim_events *ev);
/** Events dropped because a batch exceeded max_batch_bytes, or a send failed. */
uint64_t kvr_sim_events_dropped(const kvr_sim_events *ev);
/** Batches withheld from the PUB socket by the drop_event_batches fault. */
uint64_t kvr_sim_events_batches_dropped(const kvr_sim_events *ev);
/** Replay requests ignored under the replay_silent fault. */
uint64_t kvr_sim_events_replays_ignored(const kvr_sim_events *ev);
/** Closes the sockets; `ev` is freed once the poll handle is closed (the loop must run). */
void kvr_sim_events_close(kvr_sim_events *ev);

#endif
