/* libFuzzer harness for the worker /metrics reader (src/workers/scrape.c): any bytes a worker
 * sends, read as one engine's figures or as data-parallel rank r's (split by the `engine`
 * label), give well-formed results, never a crash, a leak or undefined behaviour. */
#include <stddef.h>
#include <stdint.h>

#include "workers/scrape.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(const kvr_scrape_result *r)
{
    /* Unknown is -1; a figure is never NaN (a NaN would poison every load comparison). */
    const double v[] = {r->running, r->waiting, r->kv_usage, r->kv_tokens, r->start_time};
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
        if (v[i] != v[i])
            __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvr_scrape_result r;
    kvr_scrape_parse((const char *)data, size, &r);
    check(&r);
    /* The first byte picks the rank and the engine's size. */
    int ranks = size ? 1 + data[0] % 8 : 4, rank = size ? (data[0] >> 3) % ranks : 1;
    kvr_scrape_parse_rank((const char *)data, size, rank, ranks, &r);
    check(&r);
    return 0;
}
