/* The shared routing log's entries (DESIGN §13, docs/operations.md "Running several
 * replicas"): what one kvroute replica learned, as the fields of one Redis Stream entry, and
 * the Redis URL. Pure functions over bytes (no I/O), so both are fuzzed
 * (fuzz/fuzz_cluster_log.c): entries come from a Redis server, which any client may write.
 *
 * Entry format, version 1: the stream entry's fields, in any order (unknown fields are
 * ignored, so later versions may add some; an entry whose `v` is not 1 is skipped whole):
 *   v    "1"
 *   r    the writing replica's id (--replica-id), 1..255 bytes
 *   t    "teach" (a prefix taught to a worker, and the session bound there),
 *        "forget" (the worker lost its cache: everything learned about it goes),
 *        "correct" (the self-correcting index found the worker without the block b names,
 *        the one key of b: it lost what it used no later; keep = the cap's floor)
 *   m    the route (its public model name), 1..255 bytes; absent for "forget"
 *   w    the worker's name (config `name`, which defaults to its URL), 1..255 bytes
 *   ts   when it was learned: wall-clock milliseconds since the Unix epoch, decimal
 *   bb   block size in bytes the keys were cut with (--block-bytes), decimal
 *   b    the block keys (routing/prefix_index.h), 8 bytes each, little-endian, in order;
 *        at most KVR_ENTRY_MAX_KEYS
 *   s    the session: 32 lowercase hex digits, the XXH3-128 digest of the session id (never
 *        the id itself; kvr_entry_session_digest), optional
 *   ttl  with s: the writer's session TTL in seconds (--session-ttl), decimal, optional
 *   keep "correct": the blocks the worker's cap keeps at least, decimal
 * Never prompt text, never a session id. */
#ifndef KVR_CLUSTER_ENTRY_H
#define KVR_CLUSTER_ENTRY_H
#include <stddef.h>
#include <stdint.h>

#include "util/buf.h"

/** Entry format version written (and the only one read). */
#define KVR_ENTRY_VERSION 1
/** Longest replica id, route name or worker name carried (bytes). */
#define KVR_ENTRY_MAX_NAME 255
/** Most block keys one entry carries (a 4 MiB routing text at 64-byte blocks); decoding
 *  refuses more. --redis-entry-max-blocks may lower what is written. */
#define KVR_ENTRY_MAX_KEYS 65536u
/** Most fields an encoded entry has (argv slots to reserve, XADD's own arguments aside). */
#define KVR_ENTRY_MAX_FIELDS 20

/** Entry types (field `t`). */
typedef enum kvr_entry_type {
    KVR_ENTRY_TEACH = 1, /**< "teach" */
    KVR_ENTRY_FORGET,    /**< "forget" */
    KVR_ENTRY_CORRECT,   /**< "correct" */
} kvr_entry_type;

/** One decoded (or to be encoded) entry. Strings are byte ranges (not NUL-terminated),
 *  borrowed from the fields decoded or from the caller. */
typedef struct kvr_entry {
    kvr_entry_type type;
    const char *replica;      /**< field r */
    size_t replica_len;
    const char *route;        /**< field m (NULL/0 for forget) */
    size_t route_len;
    const char *worker;       /**< field w */
    size_t worker_len;
    uint64_t ts_ms;           /**< field ts */
    size_t block_bytes;       /**< field bb (0 = none given) */
    const unsigned char *keys; /**< field b: nkeys × 8 bytes little-endian (read them with
                                    kvr_entry_key) */
    size_t nkeys;
    int has_session;          /**< field s present */
    unsigned char session[16]; /**< its digest bytes */
    uint64_t ttl_s;           /**< field ttl: the writer's session TTL (0 = not given) */
    uint64_t keep_blocks;     /**< field keep (correct) */
} kvr_entry;

/** Block key `i` (< e->nkeys) of `e`. */
uint64_t kvr_entry_key(const kvr_entry *e, size_t i);

/** The digest an entry carries for a session id (`len` bytes): XXH3-128 with seed 0, 16
 *  bytes big-endian (high half first). Replicas also key their session maps by it when they
 *  share state (proxy/keys.c), so a remote binding is found by the same id. */
void kvr_entry_session_digest(const void *id, size_t len, unsigned char out[16]);

/** Decodes the `n` field strings of a stream entry (`f[i]`, `flen[i]` bytes; names and values
 *  alternating, so n is even) into `out`, whose ranges then point into them. Returns 0;
 *  1 when the entry is of another version or type (skip it, not an error); -1 when it is
 *  malformed (a required field missing or out of bounds, a bad number, keys not a multiple of
 *  8 bytes, an odd n). Never reads outside the given ranges. */
int kvr_entry_decode(const char *const *f, const size_t *flen, size_t n, kvr_entry *out);

/** Appends `e` encoded as fields to `out` in a frame read back by kvr_entry_frame_next: a
 *  u32 field count, then each string as a u32 length and its bytes (host order; the frame
 *  never leaves the process). Keys past `max_keys` are not written. Returns 0, or -1 when a
 *  string is empty or too long (KVR_ENTRY_MAX_NAME) or memory ran out (`out` then unchanged). */
int kvr_entry_encode(const kvr_entry *e, size_t max_keys, kvr_buf *out);

/** Reads the frame at `*off` of `buf` (`len` bytes): fills `argv`/`lens` (room for
 *  KVR_ENTRY_MAX_FIELDS) with pointers into `buf`, advances `*off` and returns the number of
 *  strings; 0 at the end of `buf` or on a truncated frame. */
size_t kvr_entry_frame_next(const char *buf, size_t len, size_t *off, const char **argv,
                            size_t *lens);

/** A parsed `redis://[user:pass@]host[:port][/db]` URL. */
typedef struct kvr_redis_url {
    char host[256];           /**< host name or address (IPv6 without its brackets) */
    int port;                 /**< 1..65535 (6379 when absent) */
    char user[128];           /**< "" = none */
    char password[256];       /**< "" = none (percent-decoded) */
    int db;                   /**< 0..65535 (0 when absent) */
} kvr_redis_url;

/** Parses `url` into `out`. Returns 0, or -1 with a one-line reason in `err` (cap bytes):
 *  another scheme, `rediss://` (this build's hiredis has no TLS), an empty or oversized host,
 *  a bad port or db, a bad percent escape. */
int kvr_redis_url_parse(const char *url, kvr_redis_url *out, char *err, size_t cap);

#endif
