/* Consistent-hash ring and rendezvous scoring for the hash policies (DESIGN §7, §10).
 *
 * Ring: each worker owns `vnodes` points (160 by default, as vLLM router's consistent_hash
 * does; the policy gives a target of weight w round(160 × w) points, at least 1, so its share
 * of the keys follows its weight); point i of a worker is XXH3-64(worker URL, seed = i), so
 * positions depend only on the URL (and weight) as configured and every router instance
 * computes the same ring. A weight change keeps the points the worker had (seeds 0..), adding
 * or dropping only the difference, so only keys moving to or from that worker move. A key
 * belongs to the first point at or after its hash, clockwise (wrapping). A worker that may not take the request is
 * skipped, passing the key to the next distinct worker clockwise — the same owner a ring built
 * without that worker would give — so adding or removing one of N workers moves ~1/N of the
 * keys and no others.
 *
 * Rendezvous (highest random weight): score(key, worker) = XXH3-64(worker URL, seed = key
 * hash); the eligible worker with the highest score owns the key. Same movement property, no
 * state.
 *
 * Not thread-safe. */
#ifndef KVR_ROUTING_HASHRING_H
#define KVR_ROUTING_HASHRING_H
#include <stddef.h>
#include <stdint.h>

/** Virtual nodes per unit of weight on the consistent_hash ring. */
#define KVR_HASHRING_VNODES 160
/** Cap on one worker's points (weight 100): weights beyond count as 100, so a typo'd weight
 *  cannot make the ring eat the heap. */
#define KVR_HASHRING_MAX_VNODES 16000

typedef struct kvr_hashring kvr_hashring;

/** Creates an empty ring with `vnodes` (>= 1) points per worker. NULL on bad input / OOM. */
kvr_hashring *kvr_hashring_create(unsigned vnodes);
void kvr_hashring_destroy(kvr_hashring *r);

/** Adds worker `id` (the registry's stable id) keyed by `url` (copied). If `id` is already on
 *  the ring with the same URL this is a no-op; with another URL it is replaced. O(points log
 *  points). Returns 0, or -1 out of memory (ring unchanged). */
int kvr_hashring_add(kvr_hashring *r, size_t id, const char *url);
/** As kvr_hashring_add with `vnodes` (>= 1) points for this worker instead of the ring's
 *  default; re-adding it with another count replaces its points. */
int kvr_hashring_add_vnodes(kvr_hashring *r, size_t id, const char *url, unsigned vnodes);
/** Points of a target of weight `weight`: round(KVR_HASHRING_VNODES × weight), clamped to
 *  [1, KVR_HASHRING_MAX_VNODES]. */
unsigned kvr_hashring_vnodes_for(double weight);
/** Points worker `id` has on the ring (0 when it is not on it). */
unsigned kvr_hashring_member_vnodes(const kvr_hashring *r, size_t id);
/** Removes worker `id`'s points. Returns 1 if it was on the ring. */
int kvr_hashring_remove(kvr_hashring *r, size_t id);
/** 1 if worker `id` is on the ring with exactly this URL. */
int kvr_hashring_has(const kvr_hashring *r, size_t id, const char *url);
/** Workers on the ring. */
size_t kvr_hashring_workers(const kvr_hashring *r);

/** Predicate: may worker `id` take the request? */
typedef int (*kvr_hashring_ok_fn)(void *ctx, size_t id);

/** Owner of `key_hash`: the worker of the first point clockwise from it whose worker passes
 *  `ok` (NULL = all pass). Stores its id in `*id` and returns 0; -1 when no worker passes.
 *  O(log points) plus one step per skipped point. */
int kvr_hashring_lookup(const kvr_hashring *r, uint64_t key_hash, kvr_hashring_ok_fn ok,
                        void *ctx, size_t *id);

/** Rendezvous score of a worker URL (`url_len` bytes) for `key_hash`. */
uint64_t kvr_rendezvous_score(uint64_t key_hash, const char *url, size_t url_len);
/** Weighted rendezvous score (weighted HRW, Schindelhauer & Schomaker): -weight / ln(u), u the
 *  score mapped into (0, 1). A worker then owns a key with probability weight / total weight,
 *  and removing a worker still moves only its own keys. */
double kvr_rendezvous_weighted(uint64_t score, double weight);

/** Hash of a routing key (session key bytes, or the first block of the routing text). */
uint64_t kvr_hash_key(const void *key, size_t len);

/** The hash policies' key (DESIGN §7): the session key when there is one (`session_len` > 0),
 *  else the first `block_bytes` bytes of the routing text (all of it when shorter). Stores its
 *  hash in `*h` and returns 1; returns 0 when the request has neither (caller picks at
 *  random). */
int kvr_hash_route_key(const char *session, size_t session_len, const char *text,
                       size_t text_len, size_t block_bytes, uint64_t *h);

#endif
