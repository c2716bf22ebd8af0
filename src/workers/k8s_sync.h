/* The state of one watched Service: its EndpointSlices by name (as the last list and the watch
 * events since say) and the workers the owner was told about, and the rules that turn one into
 * the other (k8s.h: ready → added, serving+terminating or not ready → draining, gone from every
 * slice → removed; an endpoint never seen ready is not added; a refused one is left alone
 * until it disappears). No I/O: the owner's hooks are the only effect, so it is tested alone
 * (tests/unit/test_k8s_sync.c). */
#ifndef KVR_WORKERS_K8S_SYNC_H
#define KVR_WORKERS_K8S_SYNC_H
#include <stddef.h>

#include "workers/k8s.h"
#include "workers/k8s_parse.h"

/** An endpoint the owner was told about (or offered and refused). */
typedef struct kvr_k8s_tracked {
    char url[80];
    int added;    /**< hooks->add returned 0 */
    int draining; /**< as last told (hooks->set_draining) */
    int seen;     /**< scratch of kvr_k8s_sync_apply */
} kvr_k8s_tracked;

/** One Service's slices and workers. All-zero (with `service` set) is empty; owns its slices
 *  and list (kvr_k8s_sync_free). */
typedef struct kvr_k8s_sync {
    const char *service;     /**< the Service's name (borrowed), passed to hooks->add */
    kvr_k8s_slice *slices;
    size_t nslices;
    kvr_k8s_tracked *cur;
    size_t ncur;
} kvr_k8s_sync;

/** A list's slices replace all of them (a relist): takes `slices` (malloc'd array of `n`, as
 *  kvr_k8s_parse_list gives). */
void kvr_k8s_sync_replace(kvr_k8s_sync *s, kvr_k8s_slice *slices, size_t n);
/** A watch event: ADDED/MODIFIED (`del` 0) replaces the slice of its name or adds it; DELETED
 *  (`del` 1) drops it. Takes `slice`'s endpoints. */
void kvr_k8s_sync_event(kvr_k8s_sync *s, kvr_k8s_slice *slice, int del);
/** Tells the owner what changed since the last call (add, set_draining, remove). An endpoint
 *  listed in several slices counts with its best state (ready > draining > not ready). */
void kvr_k8s_sync_apply(kvr_k8s_sync *s, const kvr_k8s_hooks *h);
/** Workers added and not removed. */
size_t kvr_k8s_sync_added(const kvr_k8s_sync *s);
/** Frees the slices and the list (no hook runs). */
void kvr_k8s_sync_free(kvr_k8s_sync *s);

#endif
