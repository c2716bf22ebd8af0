/* Replicas (DESIGN §13): several kvroute processes sharing one Redis (same URL and key
 * prefix) are one cluster. This module talks to Redis, with hiredis's async API on kvroute's
 * libuv loop (no thread, no blocking call), over two connections: one for commands (log
 * appends, load publishing, rate-limit scripts, pings) and one that reads the routing log
 * (XRANGE pages during the warm start, then XREAD BLOCK).
 *
 *  - Routing log: the stream `{prefix}log`. kvr_cluster_append() queues an entry (what this
 *    replica learned, cluster/entry.h); a timer flushes the queue every --redis-flush-ms as
 *    pipelined `XADD {prefix}log MAXLEN ~ --redis-log-max-len * field value ...`. The reader
 *    hands every other replica's entry to the `apply` hook, in log order.
 *  - Warm start: after each (re)connection the reader catches up from its last id (from the
 *    start of the retained log the first time, at most --redis-warm-max-entries of its newest
 *    entries); until the first catch-up ended or --redis-warm-timeout-ms passed,
 *    kvr_cluster_warm() says 0 (GET /readyz is then 503).
 *  - Load: every --redis-load-interval-ms one script (EVALSHA-free EVAL) publishes this
 *    replica's in-flight count per worker name in the hash `{prefix}load:{replica}` (expiring
 *    after three intervals), registers the replica in the sorted set `{prefix}replicas`
 *    (score: wall-clock ms) and returns the other fresh replicas' hashes; their sum per worker
 *    name goes to the `remote_load` hook.
 *  - Failures: a command unanswered for --redis-stall-ms (a SIGSTOPped server), or a dropped
 *    connection, closes both connections; they are opened again after a backoff that doubles
 *    from 50 ms up to 1 s. Entries queued meanwhile wait (up to --redis-queue-max); the reader
 *    resumes from its last id, counting a gap when the log was trimmed past it.
 *
 * Metrics (registered in the registry given): kvroute_redis_up, kvroute_redis_log_entries_total
 * {direction="out|in"}, kvroute_redis_log_lag_seconds, kvroute_redis_errors_total{op},
 * kvroute_cluster_replicas. All on the loop thread. */
#ifndef KVR_CLUSTER_CLUSTER_H
#define KVR_CLUSTER_CLUSTER_H
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "cluster/entry.h"
#include "obs/metrics.h"

/** Settings (flags; config `redis: {url, key_prefix, password_file}`). */
typedef struct kvr_cluster_cfg {
    const char *url;              /**< --redis: redis://[user:pass@]host:port/db (NULL = off) */
    const char *key_prefix;       /**< --redis-key-prefix ("kvroute:") */
    const char *password_file;    /**< --redis-password-file: first line is the password
                                       (wins over the URL's), NULL = none */
    const char *replica_id;       /**< --replica-id (NULL = host name + "-" + pid) */
    size_t log_max_len;           /**< --redis-log-max-len: XADD MAXLEN ~ (1000000) */
    uint64_t flush_ms;            /**< --redis-flush-ms: longest wait of a queued entry (2) */
    size_t warm_max_entries;      /**< --redis-warm-max-entries: newest entries replayed at
                                       start (1000000) */
    uint64_t warm_timeout_ms;     /**< --redis-warm-timeout-ms: readiness waits no longer for
                                       the replay (10000) */
    uint64_t warm_hold_ms;        /**< --redis-warm-hold-ms: a request arriving while the warm
                                       start runs waits for it at most this long (1000; 0 =
                                       never waits) */
    uint64_t load_interval_ms;    /**< --redis-load-interval-ms (200) */
    uint64_t timeout_ms;          /**< --redis-timeout-ms: the rate-limit round trip's bound
                                       (5) */
    uint64_t stall_ms;            /**< --redis-stall-ms: a command unanswered this long marks
                                       Redis down (1000) */
    size_t queue_max;             /**< --redis-queue-max: entries waiting while Redis is away
                                       (100000); more are dropped and counted */
    size_t queue_max_bytes;       /**< --redis-queue-max-bytes: and at most this many bytes of
                                       them (64 MiB) */
    size_t entry_max_blocks;      /**< --redis-entry-max-blocks: block keys per entry (8192) */
    size_t read_count;            /**< entries per XRANGE/XREAD reply (512; not a flag) */
} kvr_cluster_cfg;

/** Defaults of the above (url NULL). */
void kvr_cluster_cfg_default(kvr_cluster_cfg *c);

/** Per-worker load as published (sums of the other replicas' fresh counts). */
typedef struct kvr_cluster_load {
    const char *worker;           /**< worker name (borrowed for the call) */
    size_t worker_len;
    int64_t inflight;             /**< summed over the other fresh replicas */
} kvr_cluster_load;

/** What the cluster calls back (all on the loop; `ud` given back). */
typedef struct kvr_cluster_hooks {
    /** Another replica's entry, in log order; `age_ms` = now − its ts (>= 0). */
    void (*apply)(void *ud, const kvr_entry *e, uint64_t age_ms);
    /** This replica's in-flight count per worker name, to publish: fills `names`, `counts`
     *  (room for `max`) and returns how many (names borrowed until the call returns). */
    size_t (*local_load)(void *ud, const char **names, int64_t *counts, size_t max);
    /** The other replicas' loads, replacing the previous call's (`n` = 0: none, or Redis
     *  unreachable for three intervals). */
    void (*remote_load)(void *ud, const kvr_cluster_load *loads, size_t n);
    void *ud;
} kvr_cluster_hooks;

typedef struct kvr_cluster kvr_cluster;

/** Checks `cfg` (URL, prefix, password file readable) without connecting. Returns 0, or -1
 *  with a one-line reason in `err`. */
int kvr_cluster_check(const kvr_cluster_cfg *cfg, char *err, size_t cap);

/** Starts the cluster client (connects in the background). `cfg` strings must outlive it.
 *  Returns NULL with a reason in `err` on a bad configuration (kvr_cluster_check). */
kvr_cluster *kvr_cluster_new(uv_loop_t *loop, const kvr_cluster_cfg *cfg, kvr_metrics *metrics,
                             const kvr_cluster_hooks *hooks, char *err, size_t cap);
/** Disconnects and frees (handles close on the loop). NULL is fine. Call it once no request
 *  waits on it (kvr_cluster_wait_warm, kvr_cluster_rate). */
void kvr_cluster_close(kvr_cluster *c);

/** The replica id in use. */
const char *kvr_cluster_replica_id(const kvr_cluster *c);

/** Queues an entry (its replica, ts are filled here) for the next flush. Never blocks, never
 *  fails the caller: a full queue (--redis-queue-max entries or --redis-queue-max-bytes)
 *  drops it (kvroute_redis_errors_total{op="queue"}). */
void kvr_cluster_append(kvr_cluster *c, kvr_entry *e);

/** 1 while a request arriving now should wait for the warm start: it is under way (from the
 *  first connection attempt until the replay ended), no Redis failure was seen meanwhile, and
 *  --redis-warm-hold-ms is not 0. NULL is fine (0). */
int kvr_cluster_holding(const kvr_cluster *c);
/** Waits for the warm start: `cb(ud)` runs exactly once, on a later loop turn, when it ends,
 *  fails, or --redis-warm-hold-ms passed (at once, on the next turn, when nothing is held).
 *  Returns the wait to cancel (then `cb` never runs), or NULL when memory ran out (go on). */
typedef struct kvr_cluster_wait kvr_cluster_wait;
kvr_cluster_wait *kvr_cluster_wait_warm(kvr_cluster *c, void (*cb)(void *ud), void *ud);
void kvr_cluster_wait_cancel(kvr_cluster_wait *w);

/** 1 once the warm start is over (replayed, or timed out); 0 before. */
int kvr_cluster_warm(const kvr_cluster *c);
/** 1 while both connections are up. */
int kvr_cluster_up(const kvr_cluster *c);
/** Replicas with fresh load entries (this one included once it published). */
size_t kvr_cluster_replicas(const kvr_cluster *c);

/** GET /cluster's body: {replica_id, redis, key_prefix, redis_up, warm, log: {last_id, out,
 *  in, lag_seconds, queued}, live_replicas (this one included, so at least 1), replicas: [{id,
 *  load_age_ms, log_position, self}]}, this replica first. Ages are as of now (they grow
 *  while Redis is down); this replica's is the time since its last load exchange went
 *  through, null before the first. New reference. */
json_t *kvr_cluster_json(const kvr_cluster *c);

/** Rate limit across replicas: counts one request of `key` (`cost` units) against `limit`
 *  per minute in Redis (a Lua sliding window), answering through `cb` within --redis-timeout-ms:
 *  `allowed` 1/0, or `allowed` -1 when Redis did not answer in time or is down (the caller
 *  then enforces limit ÷ live replicas itself). `cb` is always called exactly once, never
 *  before this returns. Returns an operation to cancel with kvr_cluster_rate_cancel (which
 *  then calls nothing), or NULL when `cb` can not be scheduled (out of memory: treat as -1). */
typedef void (*kvr_cluster_rate_cb)(void *ud, int allowed, uint64_t retry_ms);
typedef struct kvr_cluster_rate_op kvr_cluster_rate_op;
kvr_cluster_rate_op *kvr_cluster_rate(kvr_cluster *c, const char *key, uint64_t limit,
                                      uint64_t cost, kvr_cluster_rate_cb cb, void *ud);
void kvr_cluster_rate_cancel(kvr_cluster_rate_op *op);

#endif
