/* Egress policy (DESIGN §12; seed 004): which endpoints kvroute may connect to. Rules are
 * CIDRs ("10.0.0.0/8", "fd00::/8"), single addresses ("192.0.2.7") or host-name globs
 * ("*.internal", fnmatch(3), case-insensitive). Deny wins over allow; an empty allow list
 * allows everything not denied.
 *
 * Two checks, both needed: at load, every configured endpoint's host (a name can only be
 * judged by the glob rules then); and at connect time, after DNS resolution, the address
 * actually dialled together with the host name, so a name that now resolves into a denied
 * range is refused. The connect-time check runs for every connection kvroute opens (proxied
 * requests, health checks, scrapes, discovery, every later poller) through the upstream
 * client's allow_connect hook. */
#ifndef KVR_UPSTREAM_EGRESS_H
#define KVR_UPSTREAM_EGRESS_H
#include <stddef.h>
#include <sys/socket.h>

#include "util/errlist.h"

typedef struct kvr_egress kvr_egress;

/** Parses the rules (strings copied). A malformed entry (a CIDR with a bad prefix length, a
 *  bad address, an empty string) is added to `errs` prefixed by `where` ("FILE:LINE:COL" or
 *  similar, may be NULL) and skipped. Never returns NULL (aborts on out of memory); with no
 *  rules at all every endpoint is allowed. */
kvr_egress *kvr_egress_new(const char *const *allow, size_t nallow, const char *const *deny,
                           size_t ndeny, const char *where, kvr_errlist *errs);
void kvr_egress_free(kvr_egress *e);
/** 1 when the policy has any rule. */
int kvr_egress_active(const kvr_egress *e);

/** Load-time check of a URL's host ("http://HOST[:PORT]/..." or "tcp://HOST:PORT"): an
 *  address literal is judged fully; a name by the glob rules (it is denied when a deny glob
 *  matches it, or when allow rules exist, none of them a glob matching it nor an address
 *  rule that could match its addresses later). Returns 1 allowed; 0 denied with the rule and
 *  list that decided written to `why` (cap bytes), e.g. "deny 10.0.0.0/8". */
int kvr_egress_check_url(const kvr_egress *e, const char *url, char *why, size_t cap);

/** Connect-time check of `host` (the URL's host as written, may be NULL) resolved to `sa`.
 *  Returns 1 allowed, 0 denied (with `why`). */
int kvr_egress_check_addr(const kvr_egress *e, const char *host, const struct sockaddr *sa,
                          char *why, size_t cap);

/** The host part of `url` copied into `out` (cap bytes; IPv6 brackets removed). Returns 0,
 *  or -1 when the URL has no host. */
int kvr_egress_url_host(const char *url, char *out, size_t cap);

#endif
