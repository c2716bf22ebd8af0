/* Clock helpers. */
#ifndef KVR_UTIL_TIME_H
#define KVR_UTIL_TIME_H
#include <stdint.h>

/** Monotonic clock in nanoseconds (CLOCK_MONOTONIC); only differences are meaningful. */
uint64_t kvr_now_ns(void);
/** Monotonic clock in milliseconds. */
uint64_t kvr_now_ms(void);
/** Wall clock in nanoseconds since the Unix epoch (CLOCK_REALTIME; span timestamps). */
uint64_t kvr_unix_ns(void);
/** Wall clock in seconds since the Unix epoch (for OpenAI `created` fields). */
int64_t kvr_unix_time(void);

#endif
