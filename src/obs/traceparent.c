/* W3C traceparent parse/format and random span/trace ids. */
#include "obs/traceparent.h"

#include <string.h>
#include <sys/random.h>

#include "util/rand.h"

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1; /* uppercase is invalid in traceparent (W3C §3.2.2) */
}

/* Reads `n` bytes of lowercase hex at `s`; returns 0, or -1 on a non-hex byte. */
static int unhex(const char *s, uint8_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

static int all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return 0;
    return 1;
}

int kvr_traceparent_parse(const char *s, size_t len, kvr_trace_parent *out)
{
    uint8_t version;
    if (!s || len < KVR_TRACEPARENT_LEN || unhex(s, &version, 1) < 0 || version == 0xff)
        return -1;
    if (version == 0 ? len != KVR_TRACEPARENT_LEN
                     : len > KVR_TRACEPARENT_LEN && s[KVR_TRACEPARENT_LEN] != '-')
        return -1;
    if (s[2] != '-' || s[35] != '-' || s[52] != '-')
        return -1;
    kvr_trace_parent p;
    if (unhex(s + 3, p.trace_id, 16) < 0 || unhex(s + 36, p.span_id, 8) < 0 ||
        unhex(s + 53, &p.flags, 1) < 0 || all_zero(p.trace_id, 16) || all_zero(p.span_id, 8))
        return -1;
    *out = p;
    return 0;
}

void kvr_trace_hex(const uint8_t *id, size_t n, char *out)
{
    static const char d[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = d[id[i] >> 4];
        out[2 * i + 1] = d[id[i] & 15];
    }
    out[2 * n] = '\0';
}

void kvr_traceparent_format(const uint8_t trace_id[16], const uint8_t span_id[8], uint8_t flags,
                            char *out)
{
    memcpy(out, "00-", 3);
    kvr_trace_hex(trace_id, 16, out + 3);
    out[35] = '-';
    kvr_trace_hex(span_id, 8, out + 36);
    out[52] = '-';
    kvr_trace_hex(&flags, 1, out + 53);
}

void kvr_trace_random_id(uint8_t *id, size_t n)
{
    static uint8_t pool[4096];
    static size_t left;
    do {
        for (size_t i = 0; i < n; i++) {
            if (left == 0) {
                ssize_t got = getrandom(pool, sizeof(pool), 0);
                if (got <= 0) { /* no kernel entropy interface: the seeded generator */
                    for (size_t k = 0; k < sizeof(pool); k += 8) {
                        uint64_t r = kvr_rand_u64();
                        memcpy(pool + k, &r, 8);
                    }
                    got = sizeof(pool);
                }
                left = (size_t)got;
            }
            id[i] = pool[--left];
        }
    } while (all_zero(id, n));
}
