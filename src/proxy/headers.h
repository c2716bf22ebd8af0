/* Header filtering between client and worker (RFC 9110 §7.6.1 hop-by-hop fields). */
#ifndef KVR_PROXY_HEADERS_H
#define KVR_PROXY_HEADERS_H
#include <stddef.h>
#include <strings.h>

#include "http/server.h"

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

#endif
