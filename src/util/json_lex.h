/* Lexical helpers shared by the JSON readers (util/json_read.c builds jansson values,
 * util/json_scan.c only validates and locates): UTF-8 and \u escapes as RFC 8259 §7-8 and
 * jansson read them. Internal to src/util: static inline, nothing exported. */
#ifndef KVR_UTIL_JSON_LEX_H
#define KVR_UTIL_JSON_LEX_H
#include <stddef.h>
#include <stdint.h>

/* Length of the valid UTF-8 sequence at p (2-4 bytes; p[0] >= 0x80, p < end), or 0 when it is
 * not one (jansson's utf8_check_full: no overlongs, no surrogates, nothing above U+10FFFF). */
static inline size_t json_utf8_seq(const unsigned char *p, const unsigned char *end)
{
    unsigned char u = p[0];
    size_t n;
    uint32_t v;
    if (u >= 0xC2 && u <= 0xDF) {
        n = 2;
        v = u & 0x1F;
    } else if (u >= 0xE0 && u <= 0xEF) {
        n = 3;
        v = u & 0x0F;
    } else if (u >= 0xF0 && u <= 0xF4) {
        n = 4;
        v = u & 0x07;
    } else {
        return 0;
    }
    if ((size_t)(end - p) < n)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80)
            return 0;
        v = (v << 6) | (p[i] & 0x3F);
    }
    if ((n == 3 && (v < 0x800 || (v >= 0xD800 && v <= 0xDFFF))) ||
        (n == 4 && (v < 0x10000 || v > 0x10FFFF)))
        return 0;
    return n;
}

/* Four hex digits at p (the caller checked they are in bounds) → *out; 0, or -1. */
static inline int json_hex4(const unsigned char *p, uint32_t *out)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (uint32_t)(c - 'A' + 10);
        else
            return -1;
    }
    *out = v;
    return 0;
}

/* Writes code point cp (<= U+10FFFF, not a surrogate) as UTF-8 at o; returns 1-4 bytes. */
static inline size_t json_put_utf8(char *o, uint32_t cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

#endif
