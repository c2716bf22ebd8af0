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
 * once per KVR_TEXT_CACHE_ENTRIES distinct lists.
 *
 * The same cache keeps the text of each message of at least `memo_min` raw bytes, keyed by
 * the XXH3-128 (seeded per cache) of the message as written, up to a byte budget (LRU): every
 * turn of a conversation sends its earlier messages again byte for byte, and a fleet's
 * conversations share their system prompts, so most messages are decoded once rather than
 * once per turn. A message's text depends on its bytes alone (routing/keys.h), and a hit
 * appends it through the same cap rule (routing/text_writer.h), so texts and returns are the
 * same with and without the cache (fuzz/fuzz_route_text.c checks both against the tree). */
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

/** Smallest message, raw bytes as written, whose text kvroute keeps. A 64- to 127-byte
 *  message (a short user turn, a tool's small result) costs ~2 K instructions to validate and
 *  decode again on every turn, its lookup a few hundred; below 64 bytes the two meet. */
#define KVR_TEXT_MEMO_MIN 64

/** A new empty cache keeping the texts of messages of at least `memo_min` raw bytes in at
 *  most `memo_bytes` bytes (texts and their bookkeeping; 0 keeps none: tools sections
 *  only), or NULL when memory ran out. kvroute passes --routing-text-cache-bytes and
 *  KVR_TEXT_MEMO_MIN. */
kvr_text_cache *kvr_text_cache_new(size_t memo_bytes, size_t memo_min);
/** Frees the cache and every text it holds; NULL is a no-op. */
void kvr_text_cache_free(kvr_text_cache *c);
/** Lookups that found their tools section (`*hits`) and that built it (`*misses`) so far. */
void kvr_text_cache_stats(const kvr_text_cache *c, uint64_t *hits, uint64_t *misses);
/** Message texts found (`*hits`) and built (`*misses`, counted only for messages long enough
 *  to keep) so far, and the bytes the kept ones take now (`*bytes`). NULL `c`: all 0. */
void kvr_text_cache_memo_stats(const kvr_text_cache *c, uint64_t *hits, uint64_t *misses,
                               size_t *bytes);

/** Fills `*out` so that a scan (kvr_body_fields_scan_known()) takes the messages whose texts
 *  `c` keeps without validating them again: a text is kept only from a body the scan
 *  accepted, so its message's bytes are known good. Its find() hashes the bytes as the text
 *  lookup does and leaves the hash in the element, so kvr_route_text_scan() does not hash
 *  them again. Returns 1, or 0 (nothing filled) when `c` is NULL or keeps no message texts.
 *  `*out` borrows `c`. */
int kvr_text_cache_known(kvr_text_cache *c, kvr_json_known *out);

/** Keeps the messages of a body whose scan (with kvr_text_cache_known()) accepted it, for a
 *  route that builds no routing text: `el`, `n` its recorded messages (kvr_body_messages()).
 *  Messages the scan hashed and did not find are kept without a text (only their hash and
 *  role, 80 bytes each in the budget), so a later body resending them byte for
 *  byte skips their validation, as cache_aware's do; those it found become the most recent.
 *  A text-reading route that later meets such a message builds its text then and keeps it.
 *  NULL `c`, or one without a memo budget: a no-op. Out of memory keeps fewer. */
void kvr_text_cache_accept(kvr_text_cache *c, const char *buf, const kvr_json_elem *el,
                           size_t n);

/** Appends the chat routing text (kvr_route_text_build() with KVR_ROUTE_CHAT) of the body
 *  `buf` that kvr_json_scan() accepted, given the spans of its top-level `tools`,
 *  `functions` and `messages` members (each KVR_JSON_ABSENT when the body has none; as
 *  kvr_body_fields_scan() locates them) to `out`, cut at its cap. `msgs` (may be NULL) holds
 *  where the first `nmsgs` messages lie (kvr_body_messages()), so they are not walked to; the
 *  rest are. `cache` (may be NULL: no caching) keeps the tools sections and message texts.
 *  Returns 0, 1 when the text was cut at the cap, -1 out of memory (`out` then holds a
 *  prefix of the text). */
int kvr_route_text_scan(const char *buf, const kvr_json_span *tools,
                        const kvr_json_span *functions, const kvr_json_span *messages,
                        const kvr_json_elem *msgs, size_t nmsgs, kvr_text_cache *cache,
                        kvr_buf *out);

/** kvr_route_text_scan(), also giving the text an id in `*id` (0 = none): a 64-bit digest of
 *  the bytes the text is made from (each message's and the tools section's 128-bit hash as
 *  the scan and the cache take them), so that two texts with one id are the same bytes but
 *  for a 2^-64 chance, and the prefix index compares no more of them (kvr_prefix_keys
 *  text_id). Given only with a `cache` that keeps message texts (it has those hashes);
 *  otherwise, and out of memory, 0. */
int kvr_route_text_scan_id(const char *buf, const kvr_json_span *tools,
                           const kvr_json_span *functions, const kvr_json_span *messages,
                           const kvr_json_elem *msgs, size_t nmsgs, kvr_text_cache *cache,
                           kvr_buf *out, uint64_t *id);

/** The completions routing text (kvr_route_text_build() with KVR_ROUTE_COMPLETIONS) from the
 *  span of the body's top-level `prompt` (KVR_JSON_ABSENT when none): a string prompt is
 *  decoded from its span; token ids and batches are read with jansson from the prompt's
 *  span. Same returns as kvr_route_text_scan(). */
int kvr_route_text_scan_prompt(const char *buf, const kvr_json_span *prompt, kvr_buf *out);

#endif
