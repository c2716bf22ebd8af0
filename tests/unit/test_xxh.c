/* util/xxh.h: the hashes every file that includes it computes (dispatched to AVX2/AVX-512
 * for long inputs, with the vector state cleared after) equal libxxhash's baseline ones, the
 * spec's: block keys, message memo keys and cluster entries must not depend on the CPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

/* The baseline entry points, taken before util/xxh.h renames them. */
#define XXH_STATIC_LINKING_ONLY /* XXH3_generateSecret_fromSeed() */
#include <xxhash.h>
static XXH64_hash_t (*const base64)(const void *, size_t) = XXH3_64bits;
static XXH64_hash_t (*const base64s)(const void *, size_t, XXH64_hash_t) = XXH3_64bits_withSeed;
static XXH128_hash_t (*const base128)(const void *, size_t) = XXH3_128bits;
static XXH128_hash_t (*const base128s)(const void *, size_t, XXH64_hash_t) =
    XXH3_128bits_withSeed;
static XXH_errorcode (*const base128u)(XXH3_state_t *, const void *, size_t) =
    XXH3_128bits_update;

#include "util/xxh.h"

#define MAXLEN 70000

static unsigned char *input(void)
{
    unsigned char *b = malloc(MAXLEN);
    assert_non_null(b);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < MAXLEN; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        b[i] = (unsigned char)x;
    }
    return b;
}

/* Every length up to 2,000 (both sides of the 240-byte switch to the vector path), then
 * every 997th, at odd offsets too. */
static int next_len(size_t n)
{
    return n < 2000 ? 1 : 997;
}

static void test_one_shot_hashes_equal_the_baseline(void **state)
{
    (void)state;
    unsigned char *b = input();
    for (size_t n = 0; n + 3 <= MAXLEN; n += next_len(n)) {
        const unsigned char *p = b + (n & 3);
        uint64_t seed = n * 0x100000001b3ull;
        assert_true(XXH3_64bits(p, n) == base64(p, n));
        assert_true(XXH3_64bits_withSeed(p, n, seed) == base64s(p, n, seed));
        assert_true(XXH128_isEqual(XXH3_128bits(p, n), base128(p, n)));
        assert_true(XXH128_isEqual(XXH3_128bits_withSeed(p, n, seed), base128s(p, n, seed)));
        /* the memo's keys: withSeed's result from a secret made once */
        unsigned char secret[XXH3_SECRET_DEFAULT_SIZE];
        XXH3_generateSecret_fromSeed(secret, seed);
        assert_true(XXH128_isEqual(kvr_xxh3_128_seed_secret(p, n, seed, secret),
                                   base128s(p, n, seed)));
    }
    free(b);
}

/* The streaming hash fed in pieces of several sizes (short ones take the baseline, long ones
 * the dispatch, on one state) ends where the baseline's does. */
static void test_streaming_equals_the_baseline(void **state)
{
    (void)state;
    unsigned char *b = input();
    static const size_t piece[] = {1, 7, 64, 240, 241, 1000, 5000};
    for (size_t k = 0; k < sizeof(piece) / sizeof(piece[0]); k++) {
        XXH3_state_t *a = XXH3_createState(), *c = XXH3_createState();
        assert_non_null(a);
        assert_non_null(c);
        XXH3_128bits_reset_withSeed(a, 42);
        XXH3_128bits_reset_withSeed(c, 42);
        size_t off = 0, i = 0;
        while (off < 40000) {
            size_t n = piece[(k + i++) % (sizeof(piece) / sizeof(piece[0]))];
            assert_int_equal(XXH3_128bits_update(a, b + off, n), XXH_OK);
            assert_int_equal(base128u(c, b + off, n), XXH_OK);
            off += n;
        }
        assert_true(XXH128_isEqual(XXH3_128bits_digest(a), XXH3_128bits_digest(c)));
        XXH3_freeState(a);
        XXH3_freeState(c);
    }
    free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_shot_hashes_equal_the_baseline),
        cmocka_unit_test(test_streaming_equals_the_baseline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
