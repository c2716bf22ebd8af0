/* The most recent values of a measurement (e.g. TTFT) and their quantiles: a ring of at most
 * `cap` (value, time) pairs; quantiles are taken over the ones not older than a window. */
#ifndef KVR_OBS_SAMPLES_H
#define KVR_OBS_SAMPLES_H
#include <stddef.h>
#include <stdint.h>

/** The ring (opaque). */
typedef struct kvr_samples kvr_samples;

/** A ring of `cap` (>= 1) samples; NULL when out of memory. Free with kvr_samples_free. */
kvr_samples *kvr_samples_new(size_t cap);
/** Frees `s` (NULL is fine). */
void kvr_samples_free(kvr_samples *s);

/** Records `v` taken at `now_ms` (monotonic ms), replacing the oldest sample when full. */
void kvr_samples_add(kvr_samples *s, double v, uint64_t now_ms);

/** The nearest-rank quantiles `q[i]` (0..1) of the samples taken at or after `since_ms`,
 *  written to `out[i]` (n of them). Returns how many samples they cover; 0 means none (then
 *  `out` is left untouched). Allocates a scratch copy; -1 when out of memory. */
long kvr_samples_quantiles(const kvr_samples *s, uint64_t since_ms, const double *q,
                           double *out, size_t n);

#endif
