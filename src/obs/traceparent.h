/* W3C Trace Context (https://www.w3.org/TR/trace-context/, level 1): the `traceparent`
 * header's parse and format, and the random ids of new spans and traces. */
#ifndef KVR_OBS_TRACEPARENT_H
#define KVR_OBS_TRACEPARENT_H
#include <stddef.h>
#include <stdint.h>

/** `traceparent` value length for version 00: "00-" 32 hex "-" 16 hex "-" 2 hex. */
#define KVR_TRACEPARENT_LEN 55

/** Flag bit 0 of trace-flags: the caller may have recorded the trace (W3C "sampled"). */
#define KVR_TRACE_SAMPLED 0x01

/** A parent span context as a `traceparent` header carries it. */
typedef struct kvr_trace_parent {
    uint8_t trace_id[16]; /**< never all zero once parsed */
    uint8_t span_id[8];   /**< the caller's span (W3C "parent-id"); never all zero */
    uint8_t flags;        /**< trace-flags (KVR_TRACE_SAMPLED) */
} kvr_trace_parent;

/** Parses a `traceparent` value of `len` bytes (need not be NUL-terminated), by the rules of
 *  W3C Trace Context §3.2: lowercase hex only; version ff is invalid; version 00 is exactly
 *  55 bytes; a later version may append "-..." after the 55 bytes (read as 00, the rest
 *  ignored); an all-zero trace-id or parent-id is invalid. Returns 0 and fills `out`, or -1
 *  (then the caller starts a new trace and, by the same spec, ignores `tracestate`). */
int kvr_traceparent_parse(const char *s, size_t len, kvr_trace_parent *out);

/** Writes "00-TRACE-SPAN-FLAGS" and a NUL into `out` (KVR_TRACEPARENT_LEN + 1 bytes). */
void kvr_traceparent_format(const uint8_t trace_id[16], const uint8_t span_id[8], uint8_t flags,
                            char *out);

/** Writes `n` bytes as lowercase hex and a NUL into `out` (2n + 1 bytes). */
void kvr_trace_hex(const uint8_t *id, size_t n, char *out);

/** Fills `n` bytes with random bytes from the kernel (getrandom(2), buffered), never all zero
 *  (W3C: an all-zero id is invalid). Not tied to --seed: ids must differ across restarts.
 *  Loop thread only. */
void kvr_trace_random_id(uint8_t *id, size_t n);

#endif
