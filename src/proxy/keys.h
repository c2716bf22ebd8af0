/* Routing keys of an inbound request: binds routing/keys.h to the HTTP request's headers and
 * the configured session-key sources. Used by the proxy and by POST /debug/route, so both
 * decide from exactly the same keys. */
#ifndef KVR_PROXY_KEYS_H
#define KVR_PROXY_KEYS_H
#include <jansson.h>

#include "app/app.h"
#include "routing/keys.h"
#include "util/buf.h"

/** Request keys with their storage. Free with kvr_request_keys_free(). */
typedef struct kvr_request_keys {
    kvr_buf session;        /**< session key bytes (empty = none) */
    kvr_buf text;           /**< routing text bytes */
    kvr_route_keys k;       /**< views into the two buffers, as policies take them */
} kvr_request_keys;

/** Builds the keys of `body` (a validated request for `ep`) with the headers of `r`. Keys are
 *  only built when `route`'s policy uses them (else both stay empty). Returns 0, or -1 when
 *  memory ran out. */
int kvr_request_keys_build(kvr_app *app, const kvr_route *route, const json_t *body,
                           kvr_endpoint ep, kvr_http_req *r, kvr_request_keys *out);
/** Frees the buffers; `k` is then empty. */
void kvr_request_keys_free(kvr_request_keys *rk);

#endif
