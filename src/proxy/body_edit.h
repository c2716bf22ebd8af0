/* Rewrites of a client's JSON request body for an upstream attempt: top-level members
 * replaced, removed or appended, every other byte as the client sent it (DESIGN §9: framing is
 * recomputed by the upstream client from the new length). The model-name rewrite of a route
 * target and the prefill/decode disaggregation copies (proxy/pd.h) are built with it. */
#ifndef KVR_PROXY_BODY_EDIT_H
#define KVR_PROXY_BODY_EDIT_H
#include <stddef.h>

#include "util/buf.h"

/** One change to a top-level member. */
typedef struct kvr_body_edit {
    const char *key;   /**< the member's name (ASCII; matched as decoded, so "mod\u0065l" is
                            "model") */
    const char *value; /**< the new value as JSON text (len bytes, not checked), or NULL to
                            remove the member */
    size_t len;
    int if_present;    /**< replace only: never appended when the body lacks the member */
} kvr_body_edit;

/** Writes `body` (len bytes of valid JSON whose top level is an object, as api validated it)
 *  into `out` (reset first) with the `n` edits applied: every member an edit names is
 *  replaced by its value (or dropped when it has none); an edit with a value whose member is
 *  absent is appended after the last member, in edit order (unless
 *  `if_present`). A member named by several edits
 *  takes the first. Whitespace and every other member stay byte for byte. Returns 0, or -1
 *  when the top level is no object or memory ran out. */
int kvr_body_edit_apply(const char *body, size_t len, const kvr_body_edit *e, size_t n,
                        kvr_buf *out);

/** The edit that names a route target's upstream model: when the client sent `client_model`
 *  (NULL: none, nothing to rewrite) and it differs from `target_model`, `*e` replaces `model`
 *  with `target_model` as a JSON string kept in `*enc` (malloc'd; the caller frees it once the
 *  edit is applied). Returns 1 (an edit written), 0 (none needed, *enc NULL) or -1 (out of
 *  memory). */
int kvr_body_edit_model(const char *target_model, const char *client_model, char **enc,
                        kvr_body_edit *e);

#endif
