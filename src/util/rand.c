/* xoshiro256** seeded through splitmix64. */
#include "util/rand.h"

#include "util/time.h"

static uint64_t s[4];
static int seeded;

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void kvr_rand_seed(uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        s[i] = splitmix(&seed);
    seeded = 1;
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t kvr_rand_u64(void)
{
    if (!seeded)
        kvr_rand_seed(kvr_now_ns());
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

uint64_t kvr_rand_below(uint64_t n)
{
    /* Lemire's multiply-shift; the tiny bias is irrelevant for tie-breaks. */
    return (uint64_t)(((unsigned __int128)kvr_rand_u64() * n) >> 64);
}

double kvr_rand_double(void)
{
    return (double)(kvr_rand_u64() >> 11) * 0x1.0p-53;
}
