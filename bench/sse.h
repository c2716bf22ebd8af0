/* Incremental parser for Server-Sent Events (the WHATWG "event stream" format that OpenAI and
 * vLLM use for `"stream": true`). Bytes arrive in arbitrary pieces from libcurl; an event may be
 * split anywhere, even inside a CRLF, so the parser keeps the unfinished line and the data lines
 * of the current event between calls and only hands out whole events. */
#ifndef KVR_BENCH_SSE_H
#define KVR_BENCH_SSE_H
#include <stdbool.h>
#include <stddef.h>

#include "util/buf.h"

/** Called once per complete event (after its terminating blank line). `data` is the event's
 *  data lines joined with "\n" (WHATWG rule), NUL-terminated, `len` bytes, valid only during the
 *  call; `event` is the last `event:` field's value or "" when absent. Return 0 to continue,
 *  non-zero to make kvr_sse_feed() stop and return that value. */
typedef int (*kvr_sse_cb)(void *ud, const char *event, const char *data, size_t len);

/** Parser state. Initialise with kvr_sse_init(), release with kvr_sse_free(). */
typedef struct kvr_sse {
    kvr_buf line;      /**< unfinished line, bytes */
    kvr_buf data;      /**< data lines of the current event, joined with "\n" */
    char event[64];    /**< current `event:` name (truncated to 63 bytes) */
    bool has_data;     /**< a `data:` field was seen in the current event */
    bool after_cr;     /**< last byte fed was CR, so a following LF belongs to the same break */
    size_t events;     /**< events dispatched so far */
    kvr_sse_cb cb;     /**< event callback */
    void *ud;          /**< passed to cb */
} kvr_sse;

/** Prepares a parser. `max_event_bytes` caps both one line and one event's data (bytes; 0 =
 *  unlimited): a longer event makes kvr_sse_feed() return -1, since a worker sending megabytes
 *  without a blank line is broken, not slow. */
void kvr_sse_init(kvr_sse *p, size_t max_event_bytes, kvr_sse_cb cb, void *ud);
/** Parses `n` more bytes, calling the callback for each event they complete. Lines end in LF,
 *  CRLF or CR; lines starting with ':' are comments; a field without ':' has an empty value; one
 *  space after the colon is dropped. Returns 0, -1 when an event exceeded the cap (the parser
 *  must then be freed), or the callback's non-zero return value. */
int kvr_sse_feed(kvr_sse *p, const char *bytes, size_t n);
/** Frees the parser's buffers (an event left unterminated at the end is dropped, as the WHATWG
 *  spec says). */
void kvr_sse_free(kvr_sse *p);

#endif
