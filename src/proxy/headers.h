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

/** Room for the value of kvr_worker_rank_header(). */
#define KVR_RANK_HEADER_BUF 12
/** `X-data-parallel-rank: r` for an attempt to rank r of a data-parallel engine into `*out`
 *  (its value written in `buf`, which must outlive the header's use): 1, or 0 (nothing sent)
 *  for a plain worker. vLLM's API server sends a request carrying it to that rank's engine
 *  core (vllm/entrypoints/openai/api_server.py, _get_data_parallel_rank). */
int kvr_worker_rank_header(const kvr_worker *w, char buf[KVR_RANK_HEADER_BUF],
                           kvr_http_header *out);

#endif
