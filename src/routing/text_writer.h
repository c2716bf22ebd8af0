/* The routing text's writer and framing (routing/keys.h describes the text), shared by the
 * two builders of the same text: routing/keys.c from a jansson tree and routing/text_scan.c
 * from the spans of a scanned body. Both must write byte-identical text, so the framing,
 * the cap rule and the canonical JSON live here once.
 *
 * Cap rule: every append goes up to the buffer's cap; once anything was cut nothing more is
 * appended, so a cut text is always a byte prefix of the full one, whatever the order and
 * size of the appends that wrote it. */
#ifndef KVR_ROUTING_TEXT_WRITER_H
#define KVR_ROUTING_TEXT_WRITER_H
#include <jansson.h>
#include <stddef.h>
#include "util/xxh.h"

#include "util/buf.h"

/** Record separator: starts a record (a message, a tool, ...). */
#define KVR_TEXT_RS '\x1e'
/** Unit separator: starts one field of a record. */
#define KVR_TEXT_US '\x1f'
/** Group separator: ends a record. */
#define KVR_TEXT_GS '\x1d'
/** jansson flags of canonical JSON: compact, sorted keys, any value. */
#define KVR_TEXT_CANON (JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY)

/** A routing text being appended to `b` (borrowed). Start as {.b = buf}: `cut` and `oom`
 *  then say how it ended (kvr_route_text_build()'s 1 and -1). */
typedef struct kvr_text_writer {
    kvr_buf *b; /**< the text (its cap applies) */
    int cut;    /**< the cap was reached: nothing more is appended */
    int oom;    /**< memory ran out: nothing more is appended */
} kvr_text_writer;

/** Appends `n` bytes at `p`, cut at the cap (see above). */
void kvr_text_put(kvr_text_writer *w, const void *p, size_t n);
/** Appends one byte. */
void kvr_text_putc(kvr_text_writer *w, char c);
/** Starts a field: US then its letter `tag`. */
void kvr_text_field(kvr_text_writer *w, char tag);
/** Starts a record: RS then its tag (`n` bytes). */
void kvr_text_rec_start(kvr_text_writer *w, const char *tag, size_t n);
/** kvr_text_rec_start() with a NUL-terminated tag. */
void kvr_text_rec_start_s(kvr_text_writer *w, const char *tag);
/** Ends a record: GS. */
void kvr_text_rec_end(kvr_text_writer *w);
/** Appends the canonical JSON of `v` (streamed, cut at the cap like any append). */
void kvr_text_canon(kvr_text_writer *w, const json_t *v);
/** Appends a non-text value as a field: 'x' then the hex digest of its canonical JSON
 *  (kvr_text_canon_digest()). */
void kvr_text_digest_field(kvr_text_writer *w, const json_t *v);
/** The 32 lowercase hex digits (and a NUL) of an XXH3-128 hash, high half first. */
void kvr_text_hex128(XXH128_hash_t h, char out[33]);
/** The hex XXH3-128 digest of the canonical JSON of `v` into `out`, streamed: a
 *  multi-megabyte data: URL is hashed without being copied. Returns 0, or -1 (out of
 *  memory). */
int kvr_text_canon_digest(const json_t *v, char out[33]);

#endif
