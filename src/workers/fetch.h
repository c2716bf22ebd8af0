/* A small GET whose whole (capped) body is wanted: health checks, model discovery, metric
 * scraping. Runs on the upstream client, so it never blocks the loop. */
#ifndef KVR_WORKERS_FETCH_H
#define KVR_WORKERS_FETCH_H
#include <stddef.h>

#include "upstream/upstream.h"

/** Result callback: `status` is the HTTP status (0 when no response came, then `err` says
 *  why); `body` holds up to the cap's bytes (NUL-terminated, valid during the call only);
 *  `truncated` is 1 when the body was longer than the cap. */
typedef void (*kvr_fetch_cb)(void *ud, int status, const char *body, size_t len, int truncated,
                             kvr_upstream_err err);

/** GETs `url` (with `Authorization: Bearer <bearer>` when `bearer` is not NULL: the worker's
 *  own key, at most 1 KiB), keeping at most `max_bytes` of the body; gives up after `timeout_ms` (the whole
 *  exchange; the callback then gets status 0 and KVR_UP_FIRST_BYTE_TIMEOUT). Returns 0, or -1
 *  when the request could not start (the callback then never runs). */
int kvr_fetch(uv_loop_t *loop, kvr_upstream *u, const char *url, const char *bearer,
              size_t max_bytes, uint64_t timeout_ms, kvr_fetch_cb cb, void *ud);

/** Ends every fetch in progress: cancels its request, calls its callback with status 0 and
 *  KVR_UP_OTHER, and closes its timer. Call at shutdown, before kvr_upstream_close(). */
void kvr_fetch_cancel_all(void);

#endif
