/* A ring of one-second buckets over the last 15 minutes: what the admin GET /status reports
 * as rates and trends (requests, errors, prompt and cached tokens). Fixed size, no
 * allocation; timestamps are monotonic seconds. */
#ifndef KVR_OBS_TREND_H
#define KVR_OBS_TREND_H
#include <stdint.h>

/** Seconds the ring covers. */
#define KVR_TREND_SPAN_S 900

/** The sums of one second, or of a range of seconds. */
typedef struct kvr_trend_sums {
    uint64_t requests; /**< requests finished */
    uint64_t errors;   /**< of which answered with a status >= 500 */
    uint64_t prompt;   /**< prompt tokens reported by usage */
    uint64_t cached;   /**< of which served from a prefix cache */
} kvr_trend_sums;

/** The ring. Zero-initialised = empty (or kvr_trend_init). */
typedef struct kvr_trend {
    uint64_t stamp[KVR_TREND_SPAN_S]; /**< second + 1 the slot holds (0 = empty) */
    kvr_trend_sums slot[KVR_TREND_SPAN_S];
} kvr_trend;

/** Empties the ring. */
void kvr_trend_init(kvr_trend *t);

/** Adds `add` to second `now_s` (monotonic seconds). A second older than the span is
 *  ignored; a slot holding an older second is reset first. */
void kvr_trend_add(kvr_trend *t, uint64_t now_s, const kvr_trend_sums *add);

/** Sums of the seconds from `from_s` to `to_s` inclusive (only those still in the ring as of
 *  `now_s`: seconds after now_s or older than the span count nothing). */
kvr_trend_sums kvr_trend_range(const kvr_trend *t, uint64_t now_s, uint64_t from_s,
                               uint64_t to_s);

#endif
