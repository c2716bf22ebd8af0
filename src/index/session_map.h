/* Session map (DESIGN §6): session key → (worker, last use), one per model. Sessions are kept
 * sticky by exact key: keys are compared for equality, never as prefixes ("session-1" and
 * "session-12" are unrelated).
 *
 * A key is identified by its XXH3-128 digest under a per-map random seed, so entries are fixed
 * size (40 bytes plus ~8 bytes of table) whatever the key length and nothing is copied; two
 * distinct keys are confused with probability ~2^-128, and the random seed keeps anyone from
 * crafting a collision offline.
 *
 * Limits: entries idle longer than the TTL are never returned (checked on lookup) and are
 * dropped by kvr_session_map_sweep(); at capacity, binding a new key evicts the least recently
 * used entry. The same structure serves as the Responses API pin map (response id → worker that
 * produced it): create a second instance.
 *
 * Not thread-safe: owned by the loop thread. Times are caller-supplied milliseconds from one
 * monotonic clock (kvr_now_ms()), so tests control them. */
#ifndef KVR_INDEX_SESSION_MAP_H
#define KVR_INDEX_SESSION_MAP_H
#include <stddef.h>
#include <stdint.h>

/** Why entries left, for kvroute_session_evictions_total{reason}. */
typedef enum kvr_session_evict_reason {
    KVR_SESSION_EVICT_TTL = 0,       /**< "ttl": idle longer than the TTL */
    KVR_SESSION_EVICT_CAPACITY,      /**< "capacity": least recently used at the cap */
    KVR_SESSION_EVICT_WORKER_REMOVED,/**< "worker_removed": its worker left */
    KVR_SESSION_EVICT_NREASONS
} kvr_session_evict_reason;

/** Label value of a reason ("ttl", "capacity", "worker_removed"). */
const char *kvr_session_evict_reason_name(kvr_session_evict_reason r);

/** Counters for metrics. */
typedef struct kvr_session_map_stats {
    size_t sessions;                                  /**< live entries (kvroute_sessions) */
    uint64_t evictions[KVR_SESSION_EVICT_NREASONS];   /**< by reason */
    size_t memory_bytes;                              /**< bytes allocated by the map */
} kvr_session_map_stats;

typedef struct kvr_session_map kvr_session_map;

/** Creates an empty map. `ttl_ms` = idle time after which an entry expires (0 = never);
 *  `capacity` = most entries held (>= 1; --max-sessions). Memory grows with use, up to ~48
 *  bytes per entry. Returns NULL on a zero capacity or out of memory. */
kvr_session_map *kvr_session_map_create(uint64_t ttl_ms, size_t capacity);
void kvr_session_map_destroy(kvr_session_map *m);

/** Looks `key` (`len` bytes, len >= 1) up at time `now_ms`. Returns 1 and stores the worker
 *  id in `*worker` when bound and not expired; 0 otherwise. An expired entry found here is
 *  dropped (reason ttl). Does not refresh the entry's last use: only a successful answer does
 *  (kvr_session_map_bind), so picking never teaches. */
int kvr_session_map_get(kvr_session_map *m, const void *key, size_t len, uint64_t now_ms,
                        size_t *worker);

/** Worker ids must be below this (the registry's dense indexes; per-worker counts are kept in
 *  an array indexed by them). */
#define KVR_SESSION_MAP_MAX_WORKER_ID ((size_t)1 << 20)

/** Binds `key` to `worker` (replacing any previous worker) with last use `now_ms`, evicting
 *  the least recently used entry first when the map is full (reason capacity). Returns 0, or
 *  -1 on an empty key, a worker id >= KVR_SESSION_MAP_MAX_WORKER_ID or out of memory (map
 *  unchanged). */
int kvr_session_map_bind(kvr_session_map *m, const void *key, size_t len, size_t worker,
                         uint64_t now_ms);

/** Removes `key` if present (no eviction counted). Returns 1 if it was there. */
int kvr_session_map_remove(kvr_session_map *m, const void *key, size_t len);

/** Drops every entry bound to `worker` at once (reason worker_removed). O(entries): workers
 *  leave rarely. Returns the number dropped. */
size_t kvr_session_map_forget_worker(kvr_session_map *m, size_t worker);

/** Drops up to `max` expired entries, oldest first (reason ttl); call from a timer or once per
 *  request with a small `max` so expiry costs O(1) amortized. Returns the number dropped. */
size_t kvr_session_map_sweep(kvr_session_map *m, uint64_t now_ms, size_t max);

/** Entries bound to `worker` (expired ones not yet swept included), for GET /workers. */
size_t kvr_session_map_worker_count(const kvr_session_map *m, size_t worker);

/** Fills `out`. */
void kvr_session_map_stats_get(const kvr_session_map *m, kvr_session_map_stats *out);

#endif
