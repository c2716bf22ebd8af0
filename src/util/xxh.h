/* xxHash (libxxhash), with its x86 runtime dispatch where there is one.
 *
 * Debian builds libxxhash for the x86-64 baseline: XXH3's long-input loop runs on SSE2. The
 * library also exports `*_dispatch` variants (xxh_x86dispatch.h) that pick AVX2 or AVX-512 at
 * run time when the CPU has them; their results are the same as the baseline's (one
 * algorithm, xxHash's spec). Including this header instead of <xxhash.h> makes every XXH3
 * call in the file use them: hashing a long prompt's messages and blocks is a measurable
 * share of a cache-aware request (docs/performance.md, "eighth pass"). */
#ifndef KVR_UTIL_XXH_H
#define KVR_UTIL_XXH_H

#include <xxhash.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xxh_x86dispatch.h>
#endif

#endif
