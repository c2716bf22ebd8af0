/* The worker registry: the fleet as configured, with in-flight accounting (DESIGN §4 step 6). */
#ifndef KVR_WORKERS_REGISTRY_H
#define KVR_WORKERS_REGISTRY_H
#include <stddef.h>

#include "workers/worker.h"

typedef struct kvr_registry kvr_registry;

/** Creates an empty registry. Never returns NULL (aborts on OOM at boot). */
kvr_registry *kvr_registry_new(void);
/** Frees the registry and its workers. */
void kvr_registry_free(kvr_registry *r);
/** Adds a worker by base URL (copied; a trailing '/' is kept out of the URLs built from it but
 *  the label stays as given). Returns the worker, or NULL if the URL is already registered or
 *  is not an http:// URL. */
kvr_worker *kvr_registry_add(kvr_registry *r, const char *url);
/** Number of registered workers, and worker i (0-based, registration order). */
size_t kvr_registry_count(const kvr_registry *r);
kvr_worker *kvr_registry_at(const kvr_registry *r, size_t i);
/** Fills `out` (room for kvr_registry_count() pointers) with the eligible workers, in
 *  registration order; returns how many. */
size_t kvr_registry_eligible(const kvr_registry *r, kvr_worker **out);

/** Takes one in-flight unit on `w` when an upstream attempt starts. */
void kvr_worker_acquire(kvr_worker *w);
/** Releases the unit when that attempt ends (exactly once per acquire, whatever the path). */
void kvr_worker_release(kvr_worker *w);

/** Builds "<base URL without trailing slash><path>" into `out` (cap bytes, NUL-terminated).
 *  Returns 0, or -1 when it does not fit. */
int kvr_worker_url(const kvr_worker *w, const char *path, char *out, size_t cap);

#endif
