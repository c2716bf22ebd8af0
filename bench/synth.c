/* Pseudo-token text: splitmix64 over (seed, domain, id, position) picks each word, so any
 * block's text can be regenerated on demand without a table. */
#include "synth.h"

static uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Domains keep Mooncake block texts and Azure texts from ever coinciding. */
enum { DOMAIN_BLOCK = 1, DOMAIN_RANDOM = 2 };

static int words(uint64_t key, size_t ntokens, kvr_buf *out)
{
    char chunk[256];
    size_t k = 0;
    for (size_t i = 0; i < ntokens; i++) {
        uint64_t r = mix(key ^ mix(i));
        chunk[k++] = (char)('a' + r % 26);
        chunk[k++] = (char)('a' + (r >> 8) % 26);
        chunk[k++] = (char)('a' + (r >> 16) % 26);
        chunk[k++] = ' ';
        if (k == sizeof(chunk)) {
            if (kvr_buf_append(out, chunk, k) < 0)
                return -1;
            k = 0;
        }
    }
    return k ? kvr_buf_append(out, chunk, k) : 0;
}

int kvr_bench_block_text(uint64_t seed, uint64_t id, size_t ntokens, kvr_buf *out)
{
    if (ntokens > KVR_BENCH_MOONCAKE_BLOCK_TOKENS)
        ntokens = KVR_BENCH_MOONCAKE_BLOCK_TOKENS;
    return words(mix(mix(seed) ^ DOMAIN_BLOCK) ^ mix(id * 2 + 1), ntokens, out);
}

int kvr_bench_random_text(uint64_t seed, uint64_t stream, size_t ntokens, kvr_buf *out)
{
    return words(mix(mix(seed) ^ DOMAIN_RANDOM) ^ mix(stream * 2 + 1), ntokens, out);
}

int kvr_bench_mooncake_prompt(uint64_t seed, const uint64_t *ids, size_t nids,
                              size_t input_tokens, kvr_buf *out)
{
    size_t left = input_tokens;
    for (size_t i = 0; i < nids && left; i++) {
        size_t n = left < KVR_BENCH_MOONCAKE_BLOCK_TOKENS ? left : KVR_BENCH_MOONCAKE_BLOCK_TOKENS;
        if (kvr_bench_block_text(seed, ids[i], n, out) < 0)
            return -1;
        left -= n;
    }
    return 0;
}
