/* Rank selection for data-parallel kvroute-sim. */
#include "dp.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

long kvr_sim_dp_pick(kvr_sim_dp *d, const char *hdr, char *err, size_t cap)
{
    if (!hdr) {
        size_t r = d->next;
        d->next = (d->next + 1) % (d->nranks ? d->nranks : 1);
        return (long)r;
    }
    const char *p = hdr;
    while (*p == ' ' || *p == '\t')
        p++;
    int neg = *p == '-';
    if (*p == '+' || *p == '-')
        p++;
    unsigned long long v = 0;
    size_t digits = 0;
    for (; isdigit((unsigned char)*p); p++, digits++)
        v = v > 1000000000ull ? v : v * 10 + (unsigned)(*p - '0'); /* saturates: out of range */
    while (*p == ' ' || *p == '\t')
        p++;
    if (!digits || *p) {
        snprintf(err, cap, "X-data-parallel-rank must be an integer, got '%.40s'", hdr);
        return -1;
    }
    if ((neg && v) || v >= d->nranks) {
        snprintf(err, cap, "X-data-parallel-rank %s%llu is out of range: the engine has %zu "
                 "data-parallel rank%s (0 to %zu)", neg ? "-" : "", v, d->nranks,
                 d->nranks == 1 ? "" : "s", d->nranks - 1);
        return -1;
    }
    return (long)v;
}
