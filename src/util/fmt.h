/* Number formatting for hot paths (header values, request ids, metric labels) where
 * snprintf()'s format parsing costs more than the digits (issue 18's per-request CPU). */
#ifndef KVR_UTIL_FMT_H
#define KVR_UTIL_FMT_H
#include <stddef.h>
#include <stdint.h>

/** Longest kvr_fmt_u64() output (20 digits) plus its NUL, bytes. */
#define KVR_FMT_U64_MAX 21

/** Writes `v` in decimal and a NUL into `out` (at least KVR_FMT_U64_MAX bytes). Returns the
 *  number of digits written (without the NUL). */
size_t kvr_fmt_u64(char *out, uint64_t v);

/** Writes `v` as exactly 16 lowercase hex digits (leading zeros kept) into `out`, no NUL. */
void kvr_fmt_hex64(char *out, uint64_t v);

#endif
