/* What the files of src/cluster/ share (not for other modules: cluster/cluster.h is the
 * interface). conn.c owns the connections and the lifecycle, log.c the routing log (out and
 * in), load.c load sharing, rate.c rate limits. */
#ifndef KVR_CLUSTER_INTERNAL_H
#define KVR_CLUSTER_INTERNAL_H
#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#include "cluster/cluster.h"
#include "util/buf.h"

/** One Redis connection. `ac` NULL while down. */
typedef struct kvr_conn {
    struct kvr_cluster *c;
    redisAsyncContext *ac;
    int ready;                /* AUTH/SELECT/PING answered */
    size_t pending;           /* commands sent, not answered */
    uint64_t progress_ms;     /* last reply, or when pending went from 0 to 1 */
    uint64_t allowance_ms;    /* extra stall allowance (a blocking XREAD's BLOCK time) */
    const char *name;         /* "cmd" or "log" (errors{op}) */
} kvr_conn;

/** A remote replica as last seen by the load script. */
typedef struct kvr_replica_seen {
    char id[KVR_ENTRY_MAX_NAME + 1];
    uint64_t age_ms;          /* of its load entry, when last polled */
    char pos[48];             /* its log position (last id it read or wrote) */
} kvr_replica_seen;

struct kvr_cluster {
    uv_loop_t *loop;
    kvr_cluster_cfg cfg;
    kvr_cluster_hooks hooks;
    kvr_redis_url url;
    char password[256];
    char replica[KVR_ENTRY_MAX_NAME + 1];
    char key_log[512], key_replicas[512], key_load[768];
    int closing;

    kvr_conn cmd, rd;
    uv_timer_t reconnect_timer, watchdog_timer, flush_timer, load_timer;
    uint64_t backoff_ms;
    int was_up;
    char addr[256];           /* the host's address (numeric) the connections go to */
    struct resolve *resolving; /* a host name lookup in flight (uv_getaddrinfo), or NULL */

    /* log out */
    kvr_buf queue;            /* frames (cluster/entry.h) waiting for the next flush */
    size_t queued;
    int flush_armed;
    uint64_t out_total;

    /* log in */
    char last_id[48];         /* last id read ("0-0" before any) */
    char gap_at[48];          /* the oldest id a gap was last counted for */
    int warm;                 /* first catch-up over (or timed out) */
    int warming;              /* catching up with XRANGE pages (0: XREAD BLOCK) */
    size_t warm_skip;         /* entries still to pass over (older than the warm window) */
    size_t warm_applied;
    uint64_t start_ms;
    uint64_t start_wall_ms;   /* entries of this replica id written before are replayed */
    int holding;              /* requests wait for the warm start (until it ends or fails) */
    struct kvr_cluster_wait *waiters;
    uint64_t in_total;
    double lag_s;

    /* load */
    kvr_replica_seen *seen;
    size_t nseen;
    size_t replicas;          /* fresh, self included */
    uint64_t load_ok_ms;      /* last answered poll */
    int load_pending;
    char inst[20];            /* this process's nonce in its load entry (16 hex digits) */
    int load_written;         /* a poll of ours was answered: the entry is ours since then */
    int id_conflict;          /* another live process writes under this --replica-id */
    uint64_t conflict_ms;     /* when its nonce was last found in our entry */

    kvr_metric *m_up, *m_entries, *m_lag, *m_errors, *m_replicas, *m_conflict;
};

/* conn.c */
uint64_t kvr_cluster_wall_ms(void);
/** Counts kvroute_redis_errors_total{op}. */
void kvr_cluster_error(struct kvr_cluster *c, const char *op);
/** Sends a command on `k` (argv form); the reply goes to `fn` with `priv`. Returns 0, or -1
 *  when `k` is down or hiredis refused it (fn is then not called). */
int kvr_conn_send(kvr_conn *k, redisCallbackFn *fn, void *priv, int argc, const char **argv,
                  const size_t *lens);
/** Called first by every reply callback: 1 when the reply belongs to `k`'s live context
 *  (then the pending count is settled), 0 for a stale one (ignore it). */
int kvr_conn_settle(kvr_conn *k, redisAsyncContext *ac);
/** Drops both connections and schedules a reconnect (a failure seen on `k`, op for the
 *  error counter; NULL = nothing counted). */
void kvr_cluster_fail(struct kvr_cluster *c, const char *op);
/** The reconnect timer's callback (also the first connection attempt). */
void kvr_cluster_reconnect_cb(uv_timer_t *t);

/* log.c */
/** Both connections are ready: start (or resume) reading and flush what waits. */
void kvr_log_on_up(struct kvr_cluster *c);
void kvr_log_flush_cb(uv_timer_t *t);
void kvr_log_warm_deadline(struct kvr_cluster *c);
void kvr_log_free(struct kvr_cluster *c);
/** The log's oldest retained entry is `first` (`len` bytes; empty: no log): when it is newer
 *  than the last id read, the log was trimmed past this replica's position (counted once per
 *  such oldest id as errors{op="log_gap"}). */
void kvr_log_check_first(struct kvr_cluster *c, const char *first, size_t len);

/* hold.c */
/** The warm start ended or failed: waiting requests go on (on the next loop turn). */
void kvr_hold_release(struct kvr_cluster *c);

/* load.c */
void kvr_load_tick(uv_timer_t *t);
void kvr_load_free(struct kvr_cluster *c);

#endif
