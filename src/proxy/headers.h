/* Header filtering between client and worker (RFC 9110 §7.6.1 hop-by-hop fields). */
#ifndef KVR_PROXY_HEADERS_H
#define KVR_PROXY_HEADERS_H
#include <stddef.h>
#include <strings.h>

#include "http/server.h"
#include "workers/worker.h"

/** True when `name` (len bytes, any case) must not be forwarded in either direction:
 *  Connection, Keep-Alive, Proxy-Authenticate, Proxy-Authorization, Proxy-Connection, TE,
 *  Trailer, Transfer-Encoding, Upgrade, or a field listed in the message's Connection header
 *  value `connection` (may be NULL). */
int kvr_hop_by_hop(const char *name, size_t len, const char *connection);
/** Case-insensitive equality of a header name range with a NUL-terminated name. */
static inline int kvr_header_is(const char *name, size_t len, const char *want)
{
    /* inline: with a literal `want` the length test folds to a constant */
    return __builtin_strlen(want) == len && strncasecmp(name, want, len) == 0;
}

/** The worker's own key as `Authorization: Bearer <key>` into `*out` (its value written in
 *  `buf`, cap bytes, which must outlive the header's use): 1 when `w` has a key that fits,
 *  else 0 (nothing sent). Every request kvroute makes to `w` carries it. */
int kvr_worker_authorization(const kvr_worker *w, char *buf, size_t cap, kvr_http_header *out);

#endif
