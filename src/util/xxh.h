/* xxHash (libxxhash), with its x86 run-time dispatch for long inputs: the one include point
 * for every file that hashes.
 *
 * Debian builds libxxhash for the x86-64 baseline: XXH3's long-input loop runs on SSE2. The
 * library also exports `*_dispatch` variants (xxh_x86dispatch.h) that pick AVX2 or AVX-512 at
 * run time, with the same results (one algorithm, xxHash's spec): 30 KB hash in 1.3 µs
 * instead of 4.4 µs here.
 *
 * Libxxhash 0.8.1's AVX-512 variant returns without `vzeroupper`, leaving the upper halves of
 * the vector registers dirty. Until something clears them, every legacy-SSE instruction after
 * it (kvroute's scanner, built for baseline x86-64, is full of them) waits on a merge with the
 * dirty state. Calling the dispatch as such made a cache-aware request slower, not faster
 * (docs/performance.md, "ninth pass"). So the wrappers below clear the state after each
 * dispatched call, and inputs too short for XXH3's vector loop (240 bytes and less, XXH3's
 * "midsize" bound) go to the baseline entry points, where no vector state is touched. The
 * names the rest of the code calls (XXH3_64bits_withSeed and the others it uses) are these
 * wrappers. */
#ifndef KVR_UTIL_XXH_H
#define KVR_UTIL_XXH_H

#include <xxhash.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define XXH_DISPATCH_DISABLE_REPLACE 1
#include <immintrin.h>
#include <xxh_x86dispatch.h>

/* Inputs above this take XXH3's long (vector) path (xxhash.h, XXH3_MIDSIZE_MAX). */
#define KVR_XXH_LONG 240

/* Clears the upper vector state a dispatched call may leave; a no-op without AVX, where no
 * call could have set it (and vzeroupper does not exist). */
__attribute__((target("avx"))) static inline void kvr_xxh_vzeroupper(void)
{
    _mm256_zeroupper();
}

static inline void kvr_xxh_clean(void)
{
    if (__builtin_cpu_supports("avx"))
        kvr_xxh_vzeroupper();
}

/* `name` PARAMS: the baseline `base` ARGS for inputs of n <= KVR_XXH_LONG bytes, else the
 * dispatched `base`_dispatch ARGS followed by kvr_xxh_clean(). */
#define KVR_XXH_WRAP(type, name, base, params, args)                                          \
    static inline type name params                                                            \
    {                                                                                         \
        if (n <= KVR_XXH_LONG)                                                                \
            return base args;                                                                 \
        type h = base##_dispatch args;                                                        \
        kvr_xxh_clean();                                                                      \
        return h;                                                                             \
    }

KVR_XXH_WRAP(XXH64_hash_t, kvr_xxh3_64, XXH3_64bits, (const void *p, size_t n), (p, n))
KVR_XXH_WRAP(XXH64_hash_t, kvr_xxh3_64_seed, XXH3_64bits_withSeed,
             (const void *p, size_t n, XXH64_hash_t seed), (p, n, seed))
KVR_XXH_WRAP(XXH128_hash_t, kvr_xxh3_128, XXH3_128bits, (const void *p, size_t n), (p, n))
KVR_XXH_WRAP(XXH128_hash_t, kvr_xxh3_128_seed, XXH3_128bits_withSeed,
             (const void *p, size_t n, XXH64_hash_t seed), (p, n, seed))
/* Streaming: short pieces are buffered, or run one stripe at most, where the baseline is as
 * fast. */
KVR_XXH_WRAP(XXH_errorcode, kvr_xxh3_128_update, XXH3_128bits_update,
             (XXH3_state_t * st, const void *p, size_t n), (st, p, n))

#ifdef XXH3_SECRET_DEFAULT_SIZE /* XXH_STATIC_LINKING_ONLY */
/* XXH3_128bits_withSeed() of n bytes, the long ones through the dispatch with `secret`, which
 * XXH3_generateSecret_fromSeed(seed) made once: for inputs above 240 bytes withSeed derives
 * that very secret again on every call (~280 instructions, ~23 times per resent tau-bench
 * request); xxhash.h (XXH3_128bits_withSecretandSeed) documents that the result is the same. */
static inline XXH128_hash_t kvr_xxh3_128_seed_secret(const void *p, size_t n, XXH64_hash_t seed,
                                                     const void *secret)
{
    if (n <= KVR_XXH_LONG)
        return XXH3_128bits_withSeed(p, n, seed);
    XXH128_hash_t h = XXH3_128bits_withSecret_dispatch(p, n, secret, XXH3_SECRET_DEFAULT_SIZE);
    kvr_xxh_clean();
    return h;
}
#endif

#define XXH3_64bits kvr_xxh3_64
#define XXH3_64bits_withSeed kvr_xxh3_64_seed
#define XXH3_128bits kvr_xxh3_128
#define XXH3_128bits_withSeed kvr_xxh3_128_seed
#define XXH3_128bits_update kvr_xxh3_128_update
#endif

/** Mixes 64 bits so that every output bit depends on every input bit (a splitmix64-style
 *  finalizer with shifts 31/29/32; a bijection). For deriving bucket positions from a key and
 *  for folding digests into one; not a hash of bytes. */
static inline uint64_t kvr_mix64(uint64_t h)
{
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 29;
    h *= 0x94d049bb133111ebull;
    return h ^ (h >> 32);
}

#if !(defined(__x86_64__) && defined(__GNUC__)) && defined(XXH3_SECRET_DEFAULT_SIZE)
static inline XXH128_hash_t kvr_xxh3_128_seed_secret(const void *p, size_t n, XXH64_hash_t seed,
                                                     const void *secret)
{
    return XXH3_128bits_withSecretandSeed(p, n, secret, XXH3_SECRET_DEFAULT_SIZE, seed);
}
#endif

#endif
