/* The request-body fields kvroute reads on every proxied request, located by one validating
 * scan of the body (util/json_scan.h) instead of a jansson tree (issue 18): `model`, `stream`,
 * `stream_options`, what validation checks (`messages`, `prompt`, `input`, ...), the rate
 * limiter's `max_tokens` / `max_completion_tokens`, the Responses API's
 * `previous_response_id`, and the top-level members the configured session-key body paths
 * start with (`session_params` of session_params.session_id, `user`, ...).
 *
 * Every function here gives what the tree-based function of routing/keys.h gives for the same
 * body (kvr_session_key_build(), kvr_route_previous_response_id(); json_integer_value() for
 * the token counts); fuzz/fuzz_keys.c checks it. The routing text of chat and completions is
 * built from the same scan (routing/text_scan.h); the other endpoints' text still needs the
 * tree: kvr_json_read() the same bytes and call kvr_route_text_build(). */
#ifndef KVR_ROUTING_FIELDS_H
#define KVR_ROUTING_FIELDS_H
#include <stddef.h>

#include "routing/keys.h"
#include "util/buf.h"
#include "util/json_scan.h"

/** The fixed fields, in kvr_body_fields.v[] order. */
typedef enum kvr_field {
    KVR_FIELD_MODEL = 0,
    KVR_FIELD_STREAM,
    KVR_FIELD_STREAM_OPTIONS,
    KVR_FIELD_MESSAGES,
    KVR_FIELD_PROMPT,
    KVR_FIELD_INPUT,
    KVR_FIELD_TOKENS,
    KVR_FIELD_SYSTEM,
    KVR_FIELD_TOOLS,
    KVR_FIELD_QUERY,
    KVR_FIELD_DOCUMENTS,
    KVR_FIELD_TEXT_1,
    KVR_FIELD_TEXT_2,
    KVR_FIELD_MAX_TOKENS,
    KVR_FIELD_MAX_COMPLETION_TOKENS,
    KVR_FIELD_PREVIOUS_RESPONSE_ID,
    KVR_FIELD_FUNCTIONS, /**< legacy chat `functions` (routing text) */
    KVR_FIELD_COUNT /**< how many there are */
} kvr_field;

/** Most names one scan looks for: the fixed fields and one per session body source. */
#define KVR_BODY_NAMES_MAX (KVR_FIELD_COUNT + KVR_SESSION_SOURCES_MAX)

/** Messages whose place in the body one scan records (kvr_body_fields.msgs): a longer
 *  conversation's later messages are found by walking on from the last one recorded. */
#define KVR_BODY_MESSAGES_MAX 128

/** One body's scan (~7 KB; meant for the stack). Borrows the body bytes: valid while they
 *  are. Fill with kvr_body_fields_scan(). */
typedef struct kvr_body_fields {
    const char *buf;    /**< the body (borrowed) */
    size_t len;         /**< its bytes */
    int object;         /**< 1 when its top level is an object (else an array) */
    size_t n;           /**< names looked for: the KVR_FIELD_COUNT fixed ones first */
    const char *names[KVR_BODY_NAMES_MAX];                         /**< their names */
    char seg[KVR_SESSION_SOURCES_MAX][KVR_SESSION_SOURCE_NAME_MAX + 1]; /**< storage of the
                                                      session paths' first segments */
    kvr_json_span v[KVR_BODY_NAMES_MAX]; /**< the value of each top-level member named */
    /** The source list of the scan (borrowed; compared by address only) and, for each of its
     *  body paths, the index in `names` of its first segment (-1 for a header): the session
     *  key of the same list then looks no name up again. */
    const kvr_session_sources *src;
    signed char src_name[KVR_SESSION_SOURCES_MAX];
    /** Where the first KVR_BODY_MESSAGES_MAX elements of `messages` lie, when it is an array
     *  (valid: the first min(KVR_BODY_MESSAGES_MAX, v[KVR_FIELD_MESSAGES].count)). */
    kvr_json_elem msgs[KVR_BODY_MESSAGES_MAX];
} kvr_body_fields;

/** Scans `len` bytes at `buf` for the fixed fields and the first segment of every body path
 *  of `src` (NULL: KVR_SESSION_SOURCES_DEFAULT). Returns 0 when the body is valid JSON by
 *  kvr_json_read()'s rules (util/json_scan.h), -1 when not (kvr_json_read() then gives the
 *  error's wording). Never allocates. */
int kvr_body_fields_scan(kvr_body_fields *f, const char *buf, size_t len,
                         const kvr_session_sources *src);
/** kvr_body_fields_scan() taking the messages `known` (may be NULL; util/json_scan.h's
 *  kvr_json_known: routing/text_scan.h's kvr_text_cache_known() offers the messages whose
 *  texts are kept) as they were taken before instead of validating them again. Same returns
 *  and fields. */
int kvr_body_fields_scan_known(kvr_body_fields *f, const char *buf, size_t len,
                               const kvr_session_sources *src, const kvr_json_known *known);

/** The recorded elements of `messages` (kvr_body_fields.msgs) into `*n`: how many of them
 *  are valid (0 when `messages` is no array). */
const kvr_json_elem *kvr_body_messages(const kvr_body_fields *f, size_t *n);

/** The span of fixed field `which` (kind KVR_JSON_ABSENT when the body has none). */
const kvr_json_span *kvr_body_field(const kvr_body_fields *f, kvr_field which);

/** The string value of field `which`, decoded, as a new NUL-terminated string in `*out`
 *  (caller frees) with its length in `*len` (may be NULL). Returns 1, 0 when the field is no
 *  string (`*out` NULL), -1 when memory ran out. */
int kvr_body_strdup(const kvr_body_fields *f, kvr_field which, char **out, size_t *len);

/** The value of field `which` when it is an integer, else 0 (as json_integer_value()). */
long long kvr_body_integer(const kvr_body_fields *f, kvr_field which);

/** kvr_session_key_build() from a scan: the same key for the same body, headers and
 *  sources (`src` NULL: the default list; must be the list `f` was scanned with). `f` may be
 *  NULL (headers only). Returns 1 when a key was appended to `out`, 0 when there is none, -1
 *  when `out`'s cap was too small or memory ran out. A body value that is neither a string
 *  nor null is read with jansson to give its canonical JSON text (rare). */
int kvr_body_session_key(const kvr_body_fields *f, kvr_header_get_fn get, void *ctx,
                         const kvr_session_sources *src, kvr_buf *out);

#endif
