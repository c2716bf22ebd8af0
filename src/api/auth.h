/* Client API keys (DESIGN §12): checked by kvroute, never forwarded to workers. The key file
 * has one key per line, optionally prefixed by `NAME:` (the name is the metrics label and the
 * rate-limit and fair-queue identity; never the key itself), `#` starts a comment, blank lines
 * are skipped. A key without a name is named `key-N` (N = its 1-based line number). */
#ifndef KVR_API_AUTH_H
#define KVR_API_AUTH_H
#include <stddef.h>

#include "http/server.h"
#include "util/errlist.h"

typedef struct kvr_auth kvr_auth;

/** Loads the key file. Returns the store, or NULL with a message in `errs` (a file that
 *  cannot be read, or holds no key). */
kvr_auth *kvr_auth_load(const char *path, kvr_errlist *errs);
void kvr_auth_free(kvr_auth *a);

/** Why a request was refused: the `reason` label of kvroute_auth_failures_total. */
typedef enum { KVR_AUTH_OK = 0, KVR_AUTH_MISSING, KVR_AUTH_INVALID } kvr_auth_result;
const char *kvr_auth_reason(kvr_auth_result r); /* "missing" or "invalid" */

/** Checks `Authorization: Bearer KEY` or `x-api-key: KEY` against every key in constant time
 *  (the time does not depend on which key or how many bytes matched). On KVR_AUTH_OK `*name`
 *  points at the key's name (owned by the store, valid until kvr_auth_free). */
kvr_auth_result kvr_auth_check(const kvr_auth *a, kvr_http_req *r, const char **name);

#endif
