/* The one-second ring behind /status's rates and trends. */
#include "obs/trend.h"

#include <string.h>

void kvr_trend_init(kvr_trend *t)
{
    memset(t, 0, sizeof(*t));
}

void kvr_trend_add(kvr_trend *t, uint64_t now_s, const kvr_trend_sums *add)
{
    size_t i = now_s % KVR_TREND_SPAN_S;
    if (t->stamp[i] > now_s + 1)
        return; /* a second the ring already moved past */
    if (t->stamp[i] != now_s + 1) {
        t->stamp[i] = now_s + 1;
        memset(&t->slot[i], 0, sizeof(t->slot[i]));
    }
    t->slot[i].requests += add->requests;
    t->slot[i].errors += add->errors;
    t->slot[i].prompt += add->prompt;
    t->slot[i].cached += add->cached;
}

kvr_trend_sums kvr_trend_range(const kvr_trend *t, uint64_t now_s, uint64_t from_s,
                               uint64_t to_s)
{
    kvr_trend_sums s = {0};
    uint64_t oldest = now_s + 1 > KVR_TREND_SPAN_S ? now_s + 1 - KVR_TREND_SPAN_S : 0;
    if (from_s < oldest)
        from_s = oldest;
    if (to_s > now_s)
        to_s = now_s;
    for (uint64_t sec = from_s; sec <= to_s; sec++) {
        size_t i = sec % KVR_TREND_SPAN_S;
        if (t->stamp[i] != sec + 1)
            continue;
        s.requests += t->slot[i].requests;
        s.errors += t->slot[i].errors;
        s.prompt += t->slot[i].prompt;
        s.cached += t->slot[i].cached;
    }
    return s;
}
