/* Fast non-cryptographic PRNG (xoshiro256**) for tie-breaks and sampling; one global state on
 * the loop thread. Seeded from the clock unless kvr_rand_seed() is called. */
#ifndef KVR_UTIL_RAND_H
#define KVR_UTIL_RAND_H
#include <stdint.h>

/** Seeds the global generator (same seed → same sequence). */
void kvr_rand_seed(uint64_t seed);
/** Next 64 random bits. */
uint64_t kvr_rand_u64(void);
/** Uniform integer in [0, n); n must be > 0. */
uint64_t kvr_rand_below(uint64_t n);
/** Uniform double in [0, 1). */
double kvr_rand_double(void);

#endif
