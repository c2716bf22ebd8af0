/* Routing keys of an inbound request: binds routing/keys.h to the HTTP request's headers and
 * the configured session-key sources. Used by the proxy and by POST /debug/route, so both
 * decide from exactly the same keys. */
#ifndef KVR_PROXY_KEYS_H
#define KVR_PROXY_KEYS_H
#include <jansson.h>

#include "app/app.h"
#include "index/prefix_index.h"
#include "proxy/tokenize.h"
#include "routing/fields.h"
#include "routing/keys.h"
#include "util/buf.h"

/** Request keys with their storage. Free with kvr_request_keys_free(). */
typedef struct kvr_request_keys {
    kvr_buf session;        /**< session key bytes (empty = none) */
    kvr_buf text;           /**< routing text bytes */
    uint32_t *tokens;       /**< the prompt's token ids (owned; NULL until known), k.tokens */
    kvr_prefix_keys kept;   /**< the text's block keys as the prefix index hashed them, k.kept */
    kvr_route_keys k;       /**< views into the buffers, as policies take them */
} kvr_request_keys;

/** Sets the prompt's token ids (copied; `n` ids): k.tokens/k.ntokens then point to them.
 *  Returns 0, or -1 when memory ran out (the keys then have none). */
int kvr_request_keys_set_tokens(kvr_request_keys *rk, const uint32_t *ids, size_t n);

/** Builds the keys of `body` (a validated request for `ep`) with the headers of `r`. Keys are
 *  only built when `route`'s policy uses them (else both stay empty). Returns 0, or -1 when
 *  memory ran out. count_tokens requests have none (they must teach nothing). */
int kvr_request_keys_build(kvr_app *app, const kvr_route *route, const json_t *body,
                           kvr_endpoint ep, kvr_http_req *r, kvr_request_keys *out);
/** kvr_request_keys_build() from a scan of the body (routing/fields.h; NULL: a request
 *  without one, whose keys then come from the headers only): the same keys for the same
 *  body, without a tree: the routing text of chat and completions comes from the scan
 *  (routing/text_scan.h, its tools sections cached in app->text_cache); the other
 *  endpoints' text is built from a jansson tree of the body (routing/keys.h). The text is
 *  built when `route`'s policy uses keys,
 *  except for a policy that reads the text only without a session key
 *  (kvr_policy_ops.text_without_session: the hash policies) when the request has one.
 *  Returns 0, or -1 when memory ran out. */
int kvr_request_keys_build_fields(kvr_app *app, const kvr_route *route,
                                  const kvr_body_fields *body, kvr_endpoint ep,
                                  kvr_http_req *r, kvr_request_keys *out);
/** Asks for the prompt's token ids of request `r` (a validated `ep` request for `route`,
 *  whose keys `rk` are built), the way the precise policy needs them (proxy/tokenize.h): the
 *  route's least loaded eligible worker tokenizes, with its target's model name; the routing
 *  text keys the cache. Returns 0 when nothing can be asked (no eligible worker, a request to
 *  another endpoint than chat or completions, no tokenizer, or a policy that reads ids only
 *  for workers with KV events (uses_tokens 2) and no eligible one has them): `cb` is not
 *  called. Else 1, and `cb` runs exactly as kvr_tokenize() says (maybe before this returns);
 *  `*op` gets the operation to cancel, or NULL when `cb` already ran. */
int kvr_request_keys_tokenize(kvr_app *app, kvr_route *route, kvr_endpoint ep, kvr_http_req *r,
                              const kvr_request_keys *rk, kvr_tokenize_cb cb, void *ud,
                              kvr_tokenize_op **op);
/** Frees the buffers; `k` is then empty. */
void kvr_request_keys_free(kvr_request_keys *rk);

#endif
