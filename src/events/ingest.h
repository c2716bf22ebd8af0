/* KV-event ingest (issue 13; reference/vllm-kv-events.md §1.2, §9): one thread owns every
 * ZeroMQ socket — per worker a SUB connected to the worker's PUB and a DEALER connected to its
 * replay ROUTER — decodes each message (events/decode.h) and hands the results, in order per
 * worker, to the loop thread through a bounded queue and a uv_async. The loop thread applies
 * them to the KV block index; nothing here touches routing state.
 *
 * Per worker the thread keeps the last applied sequence number and enforces contiguity:
 *   - on connect: replay from 0 (llm-d's "proactive replay"), live batches buffered meanwhile;
 *   - seq jumps forward (a gap): replay from last+1;
 *   - seq goes backwards (engine restart): clear the worker, replay from 0;
 *   - AllBlocksCleared: passed on as an event (the loop clears the worker);
 *   - the first replayed seq must be the one asked for; when it is later, the batches in
 *     between are gone from the worker's buffer: a gap repair then clears the worker and
 *     replays from 0; a replay from 0 accepts what the buffer still holds (result "partial");
 *   - a replay waits at most `replay_idle_ms` (2000) for each message and `replay_max_ms`
 *     (30000) in all; at most `max_concurrent_replays` (8) run at once; after
 *     `replay_attempts` (3) failures in a row the worker goes to fallback and the thread retries
 *     after `retry_ms` (5000), for ever;
 *   - a SUB that cannot connect (nothing listens: no ZMQ connected event within
 *     `connect_timeout_ms`, 3000) or disconnects puts the worker in fallback; libzmq keeps
 *     reconnecting and the worker is resynchronised when it comes back;
 *   - without a replay endpoint a worker can only be exact from seq 0 on (a fresh engine);
 *     otherwise, and after any gap, it is in fallback until the engine restarts.
 * When the queue is full, a batch is dropped: the worker is marked overflowed (the loop sees it
 * degraded) and resynchronised (clear + replay from 0) once the queue has room.
 *
 * Endpoints must be address literals (the loop resolves names and applies the egress policy
 * before adding a worker, so the thread never resolves anything). */
#ifndef KVR_EVENTS_INGEST_H
#define KVR_EVENTS_INGEST_H
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "events/decode.h"

/** Trust state of a worker's event stream (metric kvroute_kv_events_state: the enum value). */
typedef enum {
    KVR_KV_EXACT = 0,     /**< contiguous events, replay reconciled */
    KVR_KV_DEGRADED = 1,  /**< gap, restart, overflow or silence: being repaired */
    KVR_KV_FALLBACK = 2,  /**< no events configured, unreachable, or replay impossible */
} kvr_kv_trust;
/** "exact", "degraded", "fallback". */
const char *kvr_kv_trust_name(kvr_kv_trust t);

/** Replay outcomes (label `result` of kvroute_kv_events_replays_total). */
typedef enum {
    KVR_KV_REPLAY_OK = 0,      /**< "ok": reconciled from the seq asked for */
    KVR_KV_REPLAY_PARTIAL,     /**< "partial": the worker's buffer started later */
    KVR_KV_REPLAY_TIMEOUT,     /**< "timeout": no answer in time */
    KVR_KV_REPLAY_ERROR,       /**< "error": malformed or out-of-order reply */
    KVR_KV_REPLAY_NRESULTS
} kvr_kv_replay_result;
const char *kvr_kv_replay_result_name(kvr_kv_replay_result r);

/** What the thread hands to the loop, in order per worker. */
typedef enum {
    KVR_KV_OP_BATCH,  /**< apply `batch` (owned by the op; freed by kvr_kv_op_free) */
    KVR_KV_OP_CLEAR,  /**< forget everything the worker held (restart, resync) */
    KVR_KV_OP_STATE,  /**< the worker's trust state is now `state` */
} kvr_kv_op_kind;

typedef struct kvr_kv_op {
    struct kvr_kv_op *next;
    kvr_kv_op_kind kind;
    size_t worker;            /**< the id given to kvr_kv_ingest_add */
    uint64_t gen;             /**< the subscription's generation (ops of a removed or re-added
                                   subscription carry an older one) */
    uint64_t seq;             /**< BATCH: its sequence number */
    kvr_kv_batch *batch;      /**< BATCH */
    kvr_kv_trust state;       /**< STATE */
    int partial;              /**< STATE: the worker's history before its replay buffer is
                                   unknown (a full replay started later than seq 0), so blocks
                                   it stored before then are missing from the index */
} kvr_kv_op;
/** Frees an op and its batch. */
void kvr_kv_op_free(kvr_kv_op *op);

/** Counters of one worker's stream, updated by the thread, read by any thread. */
typedef struct kvr_kv_stream_stats {
    uint64_t gaps;                               /**< kvroute_kv_events_gaps_total */
    uint64_t replays[KVR_KV_REPLAY_NRESULTS];    /**< kvroute_kv_events_replays_total */
    uint64_t malformed;                          /**< kvroute_kv_events_malformed_total */
    uint64_t overflows;                          /**< batches dropped: queue full */
    uint64_t last_seq;                           /**< last applied seq (UINT64_MAX = none) */
    int connected;                               /**< SUB connected (ZMQ monitor) */
} kvr_kv_stream_stats;

/** Settings (flags; times in ms). */
typedef struct kvr_kv_ingest_cfg {
    size_t queue_batches;          /**< --kv-events-queue: batches waiting for the loop (10000) */
    size_t max_message_bytes;      /**< --kv-events-max-bytes: larger messages are refused by
                                        ZeroMQ and counted as malformed (64 MiB) */
    uint64_t replay_idle_ms;       /**< 2000 */
    uint64_t replay_max_ms;        /**< 30000 */
    unsigned max_concurrent_replays; /**< 8 */
    unsigned replay_attempts;      /**< 3 */
    uint64_t retry_ms;             /**< 5000 */
    uint64_t connect_timeout_ms;   /**< 3000 */
} kvr_kv_ingest_cfg;
void kvr_kv_ingest_cfg_default(kvr_kv_ingest_cfg *c);

typedef struct kvr_kv_ingest kvr_kv_ingest;

/** Called on the loop thread whenever ops are waiting: take them with kvr_kv_ingest_take. */
typedef void (*kvr_kv_ingest_notify)(void *ud);

/** Starts the thread. Returns NULL (with `err`) when ZeroMQ or the thread cannot start. */
kvr_kv_ingest *kvr_kv_ingest_new(uv_loop_t *loop, const kvr_kv_ingest_cfg *cfg,
                                 kvr_kv_ingest_notify notify, void *ud, char *err, size_t errlen);
/** Stops the thread, closes every socket, frees waiting ops; `ing` is freed once its uv handle
 *  is closed (the loop must run). NULL is fine. */
void kvr_kv_ingest_close(kvr_kv_ingest *ing);

/** Subscribes worker `worker` (any id the caller chooses, unique among subscriptions): `sub`
 *  is the PUB endpoint ("tcp://IP:PORT"), `replay` the ROUTER one or NULL, `topic` the SUB
 *  prefix ("" = everything). Strings are copied. Replaces an existing subscription of the same
 *  id. Returns the subscription's generation (ops carry it). */
uint64_t kvr_kv_ingest_add(kvr_kv_ingest *ing, size_t worker, const char *sub, const char *replay,
                           const char *topic);
/** Unsubscribes (its waiting ops are dropped by generation on the loop side). */
void kvr_kv_ingest_remove(kvr_kv_ingest *ing, size_t worker);
/** Asks for a resynchronisation (the worker turns degraded until it is done): with `clear`,
 *  the thread sends CLEAR and replays from 0; without, it replays from the last seq + 1 (a
 *  silent stream: did we miss anything?). A worker without a replay endpoint goes to fallback
 *  on a clearing resync and ignores the other kind. */
void kvr_kv_ingest_resync(kvr_kv_ingest *ing, size_t worker, int clear);
/** Takes every waiting op, oldest first (a list linked by `next`; caller frees each). */
kvr_kv_op *kvr_kv_ingest_take(kvr_kv_ingest *ing);
/** Copies worker's counters into `out`; 0, or -1 when it has no subscription. */
int kvr_kv_ingest_stats(kvr_kv_ingest *ing, size_t worker, kvr_kv_stream_stats *out);

#endif
