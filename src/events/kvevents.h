/* KV events on the loop thread (issue 13, DESIGN §6): which workers publish vLLM KV events,
 * their trust states, and the KV block index the events feed. The ingest thread
 * (events/ingest.h) owns the sockets; this module resolves endpoints (under the egress
 * policy), applies the decoded batches to the index in order, mirrors each worker's trust
 * state and exports the kvroute_kv_events_* metrics.
 *
 * Trust state per worker (kvr_kv_trust): a worker without `kv_events` is in fallback; one
 * with them starts degraded and turns exact once its replay reconciled, or fallback when its
 * endpoint does not answer (ingest.h). A worker that served requests but sent no event for
 * `stale_ms` turns degraded and is asked for a replay from its last seq (a silent stream may
 * have lost a batch). Policies use a worker's KV index entries only while it is exact.
 *
 * Worker ids are the registry's (kvr_worker.id). All on the loop thread. */
#ifndef KVR_EVENTS_KVEVENTS_H
#define KVR_EVENTS_KVEVENTS_H
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <uv.h>

#include "events/ingest.h"
#include "index/kv_index.h"
#include "obs/metrics.h"
#include "workers/worker.h"

/** Settings (flags). */
typedef struct kvr_kv_events_cfg {
    kvr_kv_ingest_cfg ingest;  /**< thread settings (read once, at start) */
    size_t max_blocks;         /**< --max-kv-blocks: index entries, all workers (4,000,000) */
    uint64_t stale_ms;         /**< --kv-events-stale-ms (10000) */
    uint64_t speculative_ms;   /**< --kv-speculative-ms (2000) */
} kvr_kv_events_cfg;
void kvr_kv_events_cfg_default(kvr_kv_events_cfg *c);

/** Where a worker publishes (config `kv_events`). Strings are copied. */
typedef struct kvr_kv_events_spec {
    const char *endpoint;         /**< "tcp://HOST:PORT" of its PUB socket */
    const char *replay_endpoint;  /**< "tcp://HOST:PORT" of its replay ROUTER, NULL = none */
    const char *topic;            /**< SUB prefix, NULL or "" = every message */
    int rank;                     /**< with `ranks`: the data-parallel rank this worker is */
    int ranks;                    /**< > 1 when the engine's `ranks` data-parallel ranks share
                                       this endpoint: only batches whose data_parallel_rank is
                                       `rank` (absent or nil = 0) are applied, and rank 0's
                                       subscription counts a batch naming no rank in
                                       0..ranks-1 as dropped
                                       (kvroute_kv_events_dropped_total{worker,reason="rank"});
                                       0 or 1 = every batch applied */
} kvr_kv_events_spec;

/** Splits a KV-event endpoint "tcp://HOST:PORT" (HOST a name or address, [v6] bracketed;
 *  PORT 1..65535) into `host` and `port` (NUL-terminated, caps in bytes). Returns 0, or -1
 *  when malformed — including vLLM's bind form (tcp, star host, port), which names no host to dial.
 *  The config check and the runtime use this one parser. */
int kvr_kv_events_split(const char *url, char *host, size_t hcap, char *port, size_t pcap);

/** Writes endpoint `url` ("tcp://HOST:PORT") with its port raised by `add` into `out` (cap
 *  bytes): where data-parallel rank `add` of a vLLM engine publishes (vLLM offsets each
 *  rank's publisher and replay ports by its rank). Returns 0, or -1 when `url` is malformed,
 *  the port passes 65535 or `out` is too small. */
int kvr_kv_events_offset(const char *url, unsigned add, char *out, size_t cap);

/** Connect-time egress check (kvr_app_allow_connect): 1 allows dialling `sa` for `url`. */
typedef int (*kvr_kv_allow_fn)(void *ud, const char *url, const struct sockaddr *sa);

typedef struct kvr_kv_events kvr_kv_events;

/** Starts the ingest thread and registers the metric families in `metrics`. Returns NULL with
 *  `err` when the thread cannot start. */
kvr_kv_events *kvr_kv_events_new(uv_loop_t *loop, const kvr_kv_events_cfg *cfg,
                                 kvr_metrics *metrics, kvr_kv_allow_fn allow, void *allow_ud,
                                 char *err, size_t errlen);
/** Stops the thread and frees everything once its handles closed (the loop must run). */
void kvr_kv_events_close(kvr_kv_events *ev);
/** Applies new settings that can change at run time (stale_ms, speculative_ms, max_blocks). */
void kvr_kv_events_set_cfg(kvr_kv_events *ev, const kvr_kv_events_cfg *cfg);

/** Sets where `w` publishes (NULL = nowhere: fallback). The same spec as before changes
 *  nothing; a new one resubscribes (resolving the hosts first, each address checked by
 *  `allow`; a denied or unresolvable endpoint leaves the worker in fallback, retried on tick).
 *  Returns 0, or -1 when `spec` is malformed (not tcp://HOST:PORT). */
int kvr_kv_events_configure(kvr_kv_events *ev, kvr_worker *w, const kvr_kv_events_spec *spec);
/** `w` left the fleet: unsubscribe and forget its blocks. */
void kvr_kv_events_drop(kvr_kv_events *ev, const kvr_worker *w);
/** `w` restarted or lost its cache (health, scrape): forget its blocks and resynchronise. */
void kvr_kv_events_forget(kvr_kv_events *ev, const kvr_worker *w);
/** A request was sent to `w` (for the staleness rule). */
void kvr_kv_events_served(kvr_kv_events *ev, const kvr_worker *w);
/** Periodic work (call about once a second): staleness, expired speculative entries,
 *  retrying failed resolutions. */
void kvr_kv_events_tick(kvr_kv_events *ev);

/** The trust state of worker id `worker` (fallback when unknown). */
kvr_kv_trust kvr_kv_events_trust(const kvr_kv_events *ev, size_t worker);
/** 1 when `worker`'s history before its replay buffer is unknown (its last full replay started
 *  later than seq 0, vLLM keeping only `buffer_steps` batches): blocks it stored then, and
 *  only hit since, are missing from the index, so policies also consult the approximate
 *  index for it. Cleared by AllBlocksCleared or a complete replay. */
int kvr_kv_events_partial(const kvr_kv_events *ev, size_t worker);
/** 1 when `worker` has kv_events configured. */
int kvr_kv_events_configured(const kvr_kv_events *ev, size_t worker);
/** The KV block index (owned by `ev`). */
kvr_kv_index *kvr_kv_events_index(kvr_kv_events *ev);
/** --kv-speculative-ms. */
uint64_t kvr_kv_events_speculative_ms(const kvr_kv_events *ev);

#endif
