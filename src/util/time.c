/* Clock helpers. */
#include "util/time.h"

#include <time.h>

uint64_t kvr_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t kvr_now_ms(void)
{
    return kvr_now_ns() / 1000000ull;
}

uint64_t kvr_unix_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int64_t kvr_unix_time(void)
{
    return (int64_t)time(NULL);
}
