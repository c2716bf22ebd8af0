/* The routing text (routing/keys.h) of a chat or completions request from the spans of one
 * validating scan of its body (util/json_scan.h, routing/fields.h), without a jansson tree
 * (issue 18): for every body kvr_json_scan() accepts, the same bytes and the same return as
 * kvr_route_text_build() on the tree of those bytes, cap included (fuzz/fuzz_route_text.c
 * checks it). Strings are decoded from their spans; the rare odd values whose text is their
 * canonical JSON or its digest (a non-string role, a non-text content part, non-string tool
 * call arguments, an odd message) are read with jansson from their own span only.
 *
 * The tools section (tools and legacy functions, sorted, parameters as canonical JSON) is
 * built from a jansson tree of the two spans, then kept in a kvr_text_cache keyed by the
 * XXH3-128 of their raw bytes: a fleet whose requests all carry the same tool list reads it
 * once per KVR_TEXT_CACHE_ENTRIES distinct lists. */
#ifndef KVR_ROUTING_TEXT_SCAN_H
#define KVR_ROUTING_TEXT_SCAN_H
#include <stddef.h>
#include <stdint.h>

#include "util/buf.h"
#include "util/json_scan.h"

/** Tool lists a kvr_text_cache keeps (the least recently used one is replaced). */
#define KVR_TEXT_CACHE_ENTRIES 8
/** Longest tools section kept, bytes: a larger one is rebuilt by every request rather than
 *  held (it is a client's mistake more often than a fleet's tool list). */
#define KVR_TEXT_CACHE_MAX_BYTES (1u << 20)

/** The tools sections of recent requests, by the hash of their raw `tools` and `functions`
 *  bytes. Not thread-safe: one per event loop. Create with kvr_text_cache_new(). */
typedef struct kvr_text_cache kvr_text_cache;

/** A new empty cache, or NULL when memory ran out. */
kvr_text_cache *kvr_text_cache_new(void);
/** Frees the cache and every text it holds; NULL is a no-op. */
void kvr_text_cache_free(kvr_text_cache *c);
/** Lookups that found their tools section (`*hits`) and that built it (`*misses`) so far. */
void kvr_text_cache_stats(const kvr_text_cache *c, uint64_t *hits, uint64_t *misses);

/** Appends the chat routing text (kvr_route_text_build() with KVR_ROUTE_CHAT) of the body
 *  `buf` that kvr_json_scan() accepted, given the spans of its top-level `tools`,
 *  `functions` and `messages` members (each KVR_JSON_ABSENT when the body has none; as
 *  kvr_body_fields_scan() locates them) to `out`, cut at its cap. `cache` (may be NULL: no
 *  caching) keeps the tools sections. Returns 0, 1 when the text was cut at the cap, -1 out of
 *  memory (`out` then holds a prefix of the text). */
int kvr_route_text_scan(const char *buf, const kvr_json_span *tools,
                        const kvr_json_span *functions, const kvr_json_span *messages,
                        kvr_text_cache *cache, kvr_buf *out);

/** The completions routing text (kvr_route_text_build() with KVR_ROUTE_COMPLETIONS) from the
 *  span of the body's top-level `prompt` (KVR_JSON_ABSENT when none): a string prompt is
 *  decoded from its span; token ids and batches are read with jansson from the prompt's
 *  span. Same returns as kvr_route_text_scan(). */
int kvr_route_text_scan_prompt(const char *buf, const kvr_json_span *prompt, kvr_buf *out);

#endif
