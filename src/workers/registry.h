/* The worker registry: the fleet as configured, with in-flight accounting (DESIGN §4 step 6).
 * Workers are found by position (iteration), by id (stable for the process's life), by URL
 * and by name. A reload removes workers with kvr_registry_remove(): they leave the registry at
 * once but live while a route still references them (kvr_worker_ref). */
#ifndef KVR_WORKERS_REGISTRY_H
#define KVR_WORKERS_REGISTRY_H
#include <stddef.h>

#include "workers/worker.h"

typedef struct kvr_registry kvr_registry;

/** Creates an empty registry. Never returns NULL (aborts on OOM at boot). */
kvr_registry *kvr_registry_new(void);
/** Drops the registry's references to its workers (each is freed when no route holds it) and
 *  frees the registry. */
void kvr_registry_free(kvr_registry *r);
/** Adds a worker by base URL (copied; a trailing '/' is kept out of the URLs built from it but
 *  the label stays as given), named `name` (copied; NULL = the URL), weight `weight` (<= 0 →
 *  1). Returns the worker (one reference, the registry's), or NULL if the URL or the name is
 *  already registered or the URL is not an http:// URL. */
kvr_worker *kvr_registry_add(kvr_registry *r, const char *url, const char *name, double weight);
/** Adds rank `rank` (0 ≤ rank < `size`) of the data-parallel engine at `base_url`: a worker
 *  whose url is "<base_url>#<rank>" (its identity in metrics, headers and indexes) and whose
 *  requests go to `base_url` with X-data-parallel-rank (vLLM's DP routing header). Rank 0 is
 *  its own engine; another rank shares the registered rank 0's health and circuit breaker
 *  (kvr_worker.engine), so add rank 0 first. `name`, `weight` as kvr_registry_add (`name`
 *  NULL = the rank's url). Returns the worker, or NULL as kvr_registry_add does (or a rank out
 *  of range). */
kvr_worker *kvr_registry_add_rank(kvr_registry *r, const char *base_url, int rank, int size,
                                  const char *name, double weight);
/** Registers again a worker removed earlier and still alive (its requests still running), so
 *  a worker dropped and restored by two reloads keeps its in-flight load. Returns 0, or -1
 *  when its URL or name is taken meanwhile. */
int kvr_registry_readd(kvr_registry *r, kvr_worker *w);
/** Removes `w`: marked removed (never eligible again), no longer found, its registry reference
 *  dropped. */
void kvr_registry_remove(kvr_registry *r, kvr_worker *w);
/** Number of registered workers, and worker i (0-based, registration order). */
size_t kvr_registry_count(const kvr_registry *r);
kvr_worker *kvr_registry_at(const kvr_registry *r, size_t i);
/** The registered worker with this id, URL or name (exact), or NULL. */
kvr_worker *kvr_registry_get(const kvr_registry *r, size_t id);
kvr_worker *kvr_registry_find_url(const kvr_registry *r, const char *url);
kvr_worker *kvr_registry_find_name(const kvr_registry *r, const char *name);
/** The registered workers other than `engine` whose engine it is (the ranks 1..N-1 of a
 *  data-parallel engine whose rank 0 is `engine`): up to `cap` into `out`. Returns how many
 *  there are (may exceed `cap`). */
size_t kvr_registry_ranks(const kvr_registry *r, const kvr_worker *engine, kvr_worker **out,
                          size_t cap);
/** 1 when `w` is a rank of the data-parallel engine `id` names: its URL (trailing slashes
 *  aside) or its name (the rank's name is "<id>#<rank>"). */
int kvr_worker_in_engine(const kvr_worker *w, const char *id);
/** The registered ranks of the data-parallel engine `id` names (kvr_worker_in_engine), in
 *  registration order, up to `cap` into `out`. Returns how many were stored (0: none). */
size_t kvr_registry_find_engine(const kvr_registry *r, const char *id, kvr_worker **out,
                                size_t cap);
/** Number of eligible workers (kvr_worker_eligible). */
size_t kvr_registry_eligible_count(const kvr_registry *r);
/** Number of eligible workers that answer requests themselves (role decode or both): a
 *  disaggregated fleet whose decode workers are all down serves nothing with its prefill
 *  workers alone (/readyz). */
size_t kvr_registry_serving_count(const kvr_registry *r);

/** Reference counting of a worker; the last unref frees it. */
void kvr_worker_ref(kvr_worker *w);
void kvr_worker_unref(kvr_worker *w);
/** Replaces the model list learned from its /v1/models (ids copied). Returns 1 when the list
 *  changed (as a set, in order), 0 when it is the same. */
int kvr_worker_set_models(kvr_worker *w, const char *const *ids, size_t n);
/** Replaces the worker's own API key (copied; NULL = none; the old one is wiped). */
void kvr_worker_set_api_key(kvr_worker *w, const char *key);
/** Replaces the URL its LMCache status is polled from (copied; NULL = none). When it changes,
 *  what was known from the old one is dropped (the worker is neutral until the new one
 *  answers) and returns 1; returns 0 when unchanged. */
int kvr_worker_set_lmcache(kvr_worker *w, const char *endpoint);
/** "both", "prefill" or "decode". */
const char *kvr_worker_role_name(kvr_worker_role role);
/** The role named `name` (as kvr_worker_role_name() spells it): 0 and `*out`, or -1. */
int kvr_worker_role_parse(const char *name, kvr_worker_role *out);
/** 1 when `w` listed `model` in its last /v1/models answer. */
int kvr_worker_lists(const kvr_worker *w, const char *model);

/** Takes one in-flight unit on `w` when an upstream attempt starts. */
void kvr_worker_acquire(kvr_worker *w);
/** Releases the unit when that attempt ends (exactly once per acquire, whatever the path). */
void kvr_worker_release(kvr_worker *w);

/** Builds "<base URL without trailing slash><path>" (the engine's URL for a data-parallel
 *  rank: kvr_worker_base) into `out` (cap bytes, NUL-terminated).
 *  Returns 0, or -1 when it does not fit. */
int kvr_worker_url(const kvr_worker *w, const char *path, char *out, size_t cap);

#endif
