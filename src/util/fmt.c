/* Number formatting for hot paths. See fmt.h. */
#include "util/fmt.h"

#include <string.h>

size_t kvr_fmt_u64(char *out, uint64_t v)
{
    char tmp[KVR_FMT_U64_MAX];
    size_t i = sizeof(tmp);
    do {
        tmp[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    size_t n = sizeof(tmp) - i;
    memcpy(out, tmp + i, n);
    out[n] = '\0';
    return n;
}

void kvr_fmt_hex64(char *out, uint64_t v)
{
    static const char hex[] = "0123456789abcdef";
    for (int i = 15; i >= 0; i--) {
        out[i] = hex[v & 15];
        v >>= 4;
    }
}
