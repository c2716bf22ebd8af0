/* Validating JSON scanner: one pass, no tree, no allocation. See json_scan.h. */
#include "util/json_scan.h"

#include <limits.h>
#include <stdint.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
/* 32-byte steps where the CPU has AVX2, chosen at run time (the build targets baseline
 * x86-64). */
#if defined(__SSE2__) && defined(__x86_64__) && defined(__GNUC__)
#define WIDE 1
#include <immintrin.h>
#endif

#include "util/json_lex.h"

/* The smallest magnitude strtod() rounds to infinity (round to nearest, ties to even):
 * 2^1024 - 2^970, halfway between DBL_MAX and 2^1024, as a 309-digit integer. */
static const char g_inf_digits[] =
    "1797693134862315807937289714053034150799341327100378269361737789804449682927647509466490"
    "1797758720709633028641669288791094655554785194040263065748867150582068190890200070838367"
    "6273854845817711531764475730270069855571366959622842914819860834936475292719074168444365"
    "510704342711559699508093042880177904174497792";
#define INF_EXP10 309 /* g_inf_digits is 0.1797… × 10^309 */

typedef struct scan {
    const unsigned char *start;
    const char *const *names;
    size_t n;
    kvr_json_span *out;
    /* What request validation summarises (json_scan.h): */
    kvr_json_span *cur;   /* the wanted top-level member being read, or NULL */
    kvr_json_kind ekind;  /* kind of the current element of cur's array */
    size_t sub_count;     /* that element's own elements, when it is an array */
    size_t sub_nontoken;  /* ... of which not token ids */
    kvr_json_kind role;   /* its last "role" member's kind, when it is an object */
    int in_role;          /* the member being read in that object is "role" */
    uint64_t first[4];    /* bit c: some name starts with byte c (a key starting otherwise is
                             none of them, when unescaped) */
    kvr_json_span *rec;   /* the member whose elements are recorded, or NULL */
    kvr_json_elem *elems; /* where (kvr_json_scan_elems()) */
    size_t elems_cap;
    uint64_t is_array[KVR_JSON_MAX_DEPTH / 64]; /* per open container: 1 = array */
} scan;

static inline const unsigned char *ws(const unsigned char *p, const unsigned char *end)
{
    /* Compact JSON has none: one test for the usual case. */
    if (p < end && *p > ' ')
        return p;
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
        p++;
    return p;
}

#if !defined(__SSE2__)
/* Nonzero when one of the 8 bytes is '"', '\\' or, unless `valid`, < 0x20 or >= 0x80 (no
 * false negatives). */
static inline uint64_t special8(uint64_t v, int valid)
{
    const uint64_t ones = 0x0101010101010101ull, high = 0x8080808080808080ull;
    uint64_t q = v ^ (ones * '"'), b = v ^ (ones * '\\');
    q = (q - ones) & ~q;
    b = (b - ones) & ~b;
    if (valid)
        return (q | b) & high;
    uint64_t ctl = (v - ones * 0x20) & ~v;
    return (v | ctl | q | b) & high;
}
#endif

/* Skips the plain bytes of a string in bulk: none of '"', '\\' and, unless `valid` (text
 * already validated, where UTF-8 and control bytes need no check), < 0x20 or >= 0x80.
 * `valid` is a constant at every call, so each use compiles to its own loop. */
static inline const unsigned char *skip_bytes(const unsigned char *p, const unsigned char *end,
                                              int valid)
{
#if defined(__SSE2__)
    const __m128i quote = _mm_set1_epi8('"'), bslash = _mm_set1_epi8('\\'),
                  space = _mm_set1_epi8(0x20);
    while (end - p >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
        __m128i m = _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, bslash));
        if (!valid) /* signed: bytes >= 0x80 are negative, so "< 0x20" also catches them */
            m = _mm_or_si128(m, _mm_cmplt_epi8(v, space));
        int bits = _mm_movemask_epi8(m);
        if (bits)
            return p + __builtin_ctz((unsigned)bits);
        p += 16;
    }
#else
    while (end - p >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        if (special8(v, valid))
            break;
        p += 8;
    }
#endif
    while (p < end && *p != '"' && *p != '\\' && (valid || (*p >= 0x20 && *p < 0x80)))
        p++;
    return p;
}

/* Skips the plain bytes of a string being validated. */
static inline const unsigned char *skip_plain(const unsigned char *p, const unsigned char *end)
{
    return skip_bytes(p, end, 0);
}

/* The one-letter escapes of RFC 8259 §7 (everything but \u). */
static const unsigned char g_simple_escape[256] = {
    ['"'] = 1, ['\\'] = 1, ['/'] = 1, ['b'] = 1, ['f'] = 1, ['n'] = 1, ['r'] = 1, ['t'] = 1,
};

static inline int simple_escape(unsigned char e)
{
    return g_simple_escape[e];
}

#if defined(__SSE2__)
/* string()'s usual block, from its masks (bit i = byte i of a block of `width` 16 or 32
 * bytes: `q` quotes, `bs` backslashes, `simple` the one-letter escapes' letters; ASCII with
 * no control byte, checked by the caller): its backslashes alone (none next to another),
 * each followed by a one-letter escape. Then every backslash starts an escape, the bytes
 * after them are the escaped ones, and the first other quote ends the string. A backslash in
 * the last byte starts an escape of the next block: this one then ends before it. Returns -1
 * when the block needs string()'s care, 1 when the string ends (*adv = bytes up to and
 * including its closing quote), 0 when it goes on (*adv = bytes taken); sets *esc = 1 when
 * the string's part of the block holds an escape. */
static inline int lone_escapes(uint32_t q, uint32_t bs, uint32_t simple, unsigned width,
                               int *esc, unsigned *adv)
{
    if (bs & (bs << 1))
        return -1;
    uint32_t last = 1u << (width - 1), all = last | (last - 1);
    uint32_t lim = bs & last ? all >> 1 : all;
    uint32_t own = bs & lim, escd = own << 1; /* within lim: no bs next to the last byte */
    if (escd & ~simple)
        return -1; /* a \u escape (or an invalid one) */
    uint32_t stop = q & ~escd & lim;
    if (stop) {
        unsigned i = (unsigned)__builtin_ctz(stop);
        if (own & ((1u << i) - 1))
            *esc = 1;
        *adv = i + 1;
        return 1;
    }
    if (own)
        *esc = 1;
    *adv = lim == all ? width : width - 1;
    return 0;
}

/* The lanes of `v` holding one of the one-letter escapes' letters (g_simple_escape), as a
 * movemask. */
static inline unsigned simple_mask(__m128i v)
{
    __m128i m = _mm_or_si128(
        _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('"')),
                                  _mm_cmpeq_epi8(v, _mm_set1_epi8('\\'))),
                     _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('/')),
                                  _mm_cmpeq_epi8(v, _mm_set1_epi8('b')))),
        _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('f')),
                                  _mm_cmpeq_epi8(v, _mm_set1_epi8('n'))),
                     _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('r')),
                                  _mm_cmpeq_epi8(v, _mm_set1_epi8('t')))));
    return (unsigned)_mm_movemask_epi8(m);
}
#endif

#if WIDE
/* -1 until first asked; then 1 when the 32-byte path runs (AVX2 present and not turned off by
 * kvr_json_scan_wide()). */
static int g_wide = -1;

static int wide(void)
{
    if (g_wide < 0)
        g_wide = __builtin_cpu_supports("avx2") ? 1 : 0;
    return g_wide;
}

/* simple_mask() for 32 bytes, by nibbles: `lo_t` maps a byte's low nibble and `hi_t` its high
 * nibble to bit sets whose AND is non-zero exactly for the eight letters (hi 2: " /, 5: \\,
 * 6: b f n, 7: r t). Bytes >= 0x80 never match (their blocks are not taken anyway). */
__attribute__((target("avx2"))) static inline uint32_t simple_mask32(__m256i v, __m256i lo_t,
                                                                      __m256i hi_t)
{
    const __m256i nib = _mm256_set1_epi8(0x0f);
    __m256i lo = _mm256_shuffle_epi8(lo_t, _mm256_and_si256(v, nib));
    __m256i hi = _mm256_shuffle_epi8(hi_t, _mm256_and_si256(_mm256_srli_epi16(v, 4), nib));
    __m256i none = _mm256_cmpeq_epi8(_mm256_and_si256(lo, hi), _mm256_setzero_si256());
    return ~(uint32_t)_mm256_movemask_epi8(none);
}

/* string()'s usual block (see there) 32 bytes at a time from p, inside a string: returns
 * the byte after the closing quote with *ended = 1, or, *ended = 0, where a block that needs
 * string()'s care begins (or fewer than 32 bytes are left). */
__attribute__((target("avx2"))) static const unsigned char *
string_wide(const unsigned char *p, const unsigned char *end, int *esc, int *ended)
{
    const __m256i quote = _mm256_set1_epi8('"'), bslash = _mm256_set1_epi8('\\'),
                  space = _mm256_set1_epi8(0x20);
    /* simple_mask32()'s tables: bit 1 = high nibble 2, 2 = 5, 4 = 6, 8 = 7 */
    const __m256i lo_t = _mm256_setr_epi8(0, 0, 13, 0, 8, 0, 4, 0, 0, 0, 0, 0, 2, 0, 4, 1, /**/
                                          0, 0, 13, 0, 8, 0, 4, 0, 0, 0, 0, 0, 2, 0, 4, 1);
    const __m256i hi_t = _mm256_setr_epi8(0, 0, 1, 0, 0, 2, 4, 8, 0, 0, 0, 0, 0, 0, 0, 0, /**/
                                          0, 0, 1, 0, 0, 2, 4, 8, 0, 0, 0, 0, 0, 0, 0, 0);
    *ended = 0;
    while (end - p >= 32) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)p);
        uint32_t q = (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(v, quote));
        uint32_t bs = (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(v, bslash));
        /* signed: bytes >= 0x80 count as < 0x20 */
        if (_mm256_movemask_epi8(_mm256_cmpgt_epi8(space, v)))
            break;
        unsigned adv;
        int r = lone_escapes(q, bs, bs ? simple_mask32(v, lo_t, hi_t) : 0, 32, esc, &adv);
        if (r < 0)
            break;
        p += adv;
        if (r) {
            *ended = 1;
            return p;
        }
    }
    return p;
}
#endif

void kvr_json_scan_wide(int on)
{
#if WIDE
    g_wide = on && __builtin_cpu_supports("avx2") ? 1 : 0;
#else
    (void)on;
#endif
}

/* A string at p (its opening quote): returns the byte after its closing quote, or NULL when it
 * is not a valid string (RFC 8259 §7, §8.1, jansson's rules). *esc = 1 when it has escapes. */
static const unsigned char *string(const unsigned char *p, const unsigned char *end, int *esc)
{
    p++;
    for (;;) {
#if defined(__SSE2__)
        /* 16 bytes at a time; the special bytes of a block are handled from its mask without
         * reloading it: agent conversations hold an escape every ~13 bytes (\n, \" in tool
         * arguments), and leaving the vector loop at each one cost more than the bytes
         * between. A \u escape or anything invalid is left to the scalar step below. */
        const __m128i quote = _mm_set1_epi8('"'), bslash = _mm_set1_epi8('\\'),
                      space = _mm_set1_epi8(0x20);
        int slow = 0;
#if WIDE
        /* 16-byte blocks before the next try of the 32-byte path: the first block of a string
         * (most keys and short values end in it, with no call), and two after a block the
         * wide path could not take. */
        int cool = 1;
#endif
        while (!slow && end - p >= 16) {
#if WIDE
            if (!cool && end - p >= 32 && wide()) {
                int ended;
                const unsigned char *r = string_wide(p, end, esc, &ended);
                if (ended)
                    return r;
                cool = r == p ? 2 : 0;
                p = r;
                if (end - p < 16)
                    break;
            } else if (cool) {
                cool--;
            }
#endif
            __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
            __m128i mq = _mm_cmpeq_epi8(v, quote), mb = _mm_cmpeq_epi8(v, bslash),
                    mc = _mm_cmplt_epi8(v, space); /* signed: bytes >= 0x80 count as < 0x20 */
            unsigned q = (unsigned)_mm_movemask_epi8(mq), bs = (unsigned)_mm_movemask_epi8(mb);
            /* The usual block (lone_escapes()) without a branch per escape. */
            if (!_mm_movemask_epi8(mc)) {
                unsigned adv;
                int r = lone_escapes(q, bs, bs ? simple_mask(v) : 0, 16, esc, &adv);
                if (r > 0)
                    return p + adv;
                if (r == 0) {
                    p += adv;
                    continue;
                }
            }
            unsigned bits = (unsigned)_mm_movemask_epi8(_mm_or_si128(_mm_or_si128(mq, mb), mc));
            const unsigned char *next = p + 16;
            while (bits) {
                unsigned i = (unsigned)__builtin_ctz(bits);
                const unsigned char *q = p + i;
                unsigned k; /* bytes the special occupies */
                if (*q == '"')
                    return q + 1;
                if (*q == '\\' && end - q >= 2 && simple_escape(q[1])) {
                    *esc = 1;
                    k = 2;
                } else if (*q < 0x80 || (k = (unsigned)json_utf8_seq(q, end)) == 0) {
                    next = q;
                    slow = 1;
                    break;
                }
                if (i + k >= 16) {
                    next = q + k;
                    break;
                }
                bits &= ~((1u << (i + k)) - 1);
            }
            p = next;
        }
        if (!slow)
#endif
            p = skip_plain(p, end);
        if (p >= end)
            return NULL;
        unsigned char c = *p;
        if (c == '"')
            return p + 1;
        if (c >= 0x80) {
            size_t k = json_utf8_seq(p, end);
            if (!k)
                return NULL;
            p += k;
            continue;
        }
        if (c != '\\' || end - p < 2)
            return NULL; /* a control byte, or an escape cut by the end */
        *esc = 1;
        unsigned char e = p[1];
        p += 2;
        if (simple_escape(e))
            continue;
        uint32_t cp, lo;
        if (e != 'u' || end - p < 4 || json_hex4(p, &cp) < 0)
            return NULL;
        p += 4;
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (end - p < 6 || p[0] != '\\' || p[1] != 'u' || json_hex4(p + 2, &lo) < 0 ||
                lo < 0xDC00 || lo > 0xDFFF)
                return NULL;
            p += 6;
        } else if ((cp >= 0xDC00 && cp <= 0xDFFF) || cp == 0) {
            return NULL;
        }
    }
}

/* string(), with the usual short string (a member name, a role: plain bytes and its closing
 * quote within the 16 bytes after the opening one) read inline without the call. */
static inline const unsigned char *short_string(const unsigned char *p,
                                                const unsigned char *end, int *esc)
{
#if defined(__SSE2__)
    if (end - p >= 17) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(p + 1));
        __m128i m = _mm_or_si128(
            _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('"')),
                         _mm_cmpeq_epi8(v, _mm_set1_epi8('\\'))),
            _mm_cmplt_epi8(v, _mm_set1_epi8(0x20))); /* signed: bytes >= 0x80 too */
        unsigned bits = (unsigned)_mm_movemask_epi8(m);
        if (bits) {
            unsigned i = (unsigned)__builtin_ctz(bits);
            if (p[1 + i] == '"')
                return p + 2 + i;
        }
    }
#endif
    return string(p, end, esc);
}

/* What each one-letter escape stands for (0: \u, or not an escape). */
static const unsigned char g_unescaped[256] = {
    ['"'] = '"', ['\\'] = '\\', ['/'] = '/', ['b'] = '\b', ['f'] = '\f', ['n'] = '\n',
    ['r'] = '\r', ['t'] = '\t',
};

/* The escape at q (a backslash, in a valid string) into tmp (1-4 bytes, *k of them);
 * returns the byte after it. */
static const unsigned char *unescape(const unsigned char *q, char tmp[4], size_t *k)
{
    uint32_t cp = 0, lo = 0xDC00;
    *k = 1;
    switch (q[1]) {
    case 'b': tmp[0] = '\b'; break;
    case 'f': tmp[0] = '\f'; break;
    case 'n': tmp[0] = '\n'; break;
    case 'r': tmp[0] = '\r'; break;
    case 't': tmp[0] = '\t'; break;
    case 'u':
        json_hex4(q + 2, &cp);
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            json_hex4(q + 8, &lo);
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            q += 6;
        }
        q += 4;
        *k = json_put_utf8(tmp, cp);
        break;
    default: tmp[0] = (char)q[1]; break; /* '"', '\\', '/' */
    }
    return q + 2;
}

/* Decodes the valid string body [p, end) (between the quotes) into out (at most cap bytes);
 * returns the decoded length. */
static size_t decode(const unsigned char *p, const unsigned char *end, char *out, size_t cap)
{
    size_t n = 0;
    while (p < end) {
#if defined(__SSE2__)
        /* Copy and look for the next backslash in one pass, 16 bytes at a time (bytes stored
         * past it are overwritten by what follows): prose is full of \n and \" escapes, and a
         * memcpy call per run between them cost more than the copy. */
        const __m128i bslash = _mm_set1_epi8('\\');
        while (end - p >= 16 && n < cap && cap - n >= 16) {
            __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
            _mm_storeu_si128((__m128i *)(void *)(out + n), v);
            int bits = _mm_movemask_epi8(_mm_cmpeq_epi8(v, bslash));
            if (bits) {
                unsigned i = (unsigned)__builtin_ctz((unsigned)bits);
                p += i;
                n += i;
                goto escape;
            }
            p += 16;
            n += 16;
        }
#endif
        {
            /* the next backslash: a quote in a valid string body is escaped, so the skip stops
             * only at backslashes */
            const unsigned char *q = skip_bytes(p, end, 1);
            size_t run = (size_t)(q - p);
            if (n < cap)
                memcpy(out + n, p, run < cap - n ? run : cap - n);
            n += run;
            p = q;
            if (p >= end)
                break;
        }
#if defined(__SSE2__)
    escape:;
#endif
        unsigned char one = g_unescaped[p[1]];
        if (one) { /* the one-letter escapes, most of them in prose */
            if (n < cap)
                out[n] = (char)one;
            n++;
            p += 2;
            continue;
        }
        char tmp[4];
        size_t k;
        p = unescape(p, tmp, &k);
        for (size_t i = 0; i < k; i++, n++)
            if (n < cap)
                out[n] = tmp[i];
    }
    return n;
}

/* 1 when the significant digits (int part then fraction, leading zeros skipped) read as a
 * decimal fraction 0.D are at least 0.g_inf_digits. */
static int digits_reach_inf(const unsigned char *d, const unsigned char *end)
{
    size_t t = 0, tn = sizeof(g_inf_digits) - 1;
    int lead = 1;
    for (; d < end; d++) {
        if (*d == '.')
            continue;
        if (lead && *d == '0')
            continue;
        lead = 0;
        if (t == tn)
            return 1; /* equal so far and longer */
        if (*d != (unsigned char)g_inf_digits[t])
            return *d > (unsigned char)g_inf_digits[t];
        t++;
    }
    while (t < tn)
        if (g_inf_digits[t++] != '0')
            return 0;
    return 1;
}

/* A number at p (RFC 8259 §6): returns the byte after it, or NULL when it is malformed, an
 * integer outside json_int_t, or a real strtod() would overflow. Sets *kind and *ival. */
static const unsigned char *number(const unsigned char *p, const unsigned char *end,
                                   kvr_json_kind *kind, long long *ival)
{
    int neg = 0, real = 0;
    if (*p == '-') {
        neg = 1;
        p++;
    }
    if (p >= end || *p < '0' || *p > '9')
        return NULL;
    const unsigned char *ib = p;
    if (*p == '0') {
        p++;
        if (p < end && *p >= '0' && *p <= '9')
            return NULL; /* no leading zeros */
    } else {
        while (p < end && *p >= '0' && *p <= '9')
            p++;
    }
    const unsigned char *ie = p, *me = p; /* end of int part, of the mantissa */
    if (p < end && *p == '.') {
        real = 1;
        p++;
        if (p >= end || *p < '0' || *p > '9')
            return NULL;
        while (p < end && *p >= '0' && *p <= '9')
            p++;
        me = p;
    }
    long long ex = 0;
    if (p < end && (*p == 'e' || *p == 'E')) {
        real = 1;
        p++;
        int eneg = 0;
        if (p < end && (*p == '+' || *p == '-'))
            eneg = *p++ == '-';
        if (p >= end || *p < '0' || *p > '9')
            return NULL;
        while (p < end && *p >= '0' && *p <= '9') {
            if (ex < 1000000000)
                ex = ex * 10 + (*p - '0');
            p++;
        }
        if (eneg)
            ex = -ex;
    }
    if (!real && ie - ib <= 18) { /* 18 digits never overflow: no check per digit */
        long long v = 0;
        for (const unsigned char *d = ib; d < ie; d++)
            v = v * 10 + (*d - '0');
        *kind = KVR_JSON_INTEGER;
        *ival = neg ? -v : v;
        return p;
    }
    if (!real) {
        long long v = 0; /* accumulated as a negative number so LLONG_MIN fits */
        for (const unsigned char *d = ib; d < ie; d++) {
            int digit = *d - '0';
            if (v < (LLONG_MIN + digit) / 10)
                return NULL;
            v = v * 10 - digit;
        }
        if (!neg) {
            if (v == LLONG_MIN)
                return NULL;
            v = -v;
        }
        *kind = KVR_JSON_INTEGER;
        *ival = v;
        return p;
    }
    /* value = 0.D × 10^e10 with D's first digit non-zero */
    long long e10;
    if (*ib != '0') {
        size_t nint = (size_t)(ie - ib);
        e10 = (nint > 1000000000 ? 1000000000 : (long long)nint) + ex;
    } else {
        const unsigned char *d = ie < me ? ie + 1 : me; /* the fraction's digits */
        while (d < me && *d == '0')
            d++;
        if (d == me) { /* zero */
            *kind = KVR_JSON_REAL;
            *ival = 0;
            return p;
        }
        size_t z = (size_t)(d - (ie + 1));
        e10 = ex - (z > 1000000000 ? 1000000000 : (long long)z);
    }
    if (e10 > INF_EXP10 || (e10 == INF_EXP10 && digits_reach_inf(ib, me)))
        return NULL;
    *kind = KVR_JSON_REAL;
    *ival = 0;
    return p;
}

/* Decoded key [p, end) (between the quotes, escaped or not) equals name. */
static int key_is(const unsigned char *p, const unsigned char *end, int esc, const char *name)
{
    if (!esc) {
        size_t n = (size_t)(end - p);
        return strncmp(name, (const char *)p, n) == 0 && name[n] == '\0';
    }
    char k[KVR_JSON_SCAN_NAME_MAX + 1];
    size_t n = decode(p, end, k, sizeof(k));
    return n <= KVR_JSON_SCAN_NAME_MAX && strncmp(name, k, n) == 0 && name[n] == '\0';
}

static void on_key(scan *s, size_t depth, const unsigned char *ks, const unsigned char *ke,
                   int esc)
{
    if (depth == 1) {
        s->cur = NULL;
        unsigned char c0 = ke > ks ? *ks : 0;
        if (!esc && !((s->first[c0 >> 6] >> (c0 & 63)) & 1))
            return;
        for (size_t i = 0; i < s->n; i++)
            if ((esc || (unsigned char)s->names[i][0] == c0) &&
                key_is(ks, ke, esc, s->names[i])) {
                s->cur = &s->out[i];
                break;
            }
    } else if (depth == 3 && s->cur && s->cur->kind == KVR_JSON_ARRAY &&
               s->ekind == KVR_JSON_OBJECT) {
        s->in_role = ke - ks == 4 && !esc ? memcmp(ks, "role", 4) == 0
                                          : key_is(ks, ke, esc, "role");
    }
}

/* A value of `kind` starts at p, inside `depth` open containers. */
static void on_begin(scan *s, size_t depth, kvr_json_kind kind, const unsigned char *p)
{
    if (!s->cur)
        return;
    if (depth == 1) {
        memset(s->cur, 0, sizeof(*s->cur));
        s->cur->off = (size_t)(p - s->start);
        s->cur->kind = kind;
        s->cur->first_norole = SIZE_MAX;
    } else if (depth == 2 && s->cur->kind == KVR_JSON_ARRAY) {
        if (s->cur == s->rec && s->cur->count < s->elems_cap) {
            kvr_json_elem *e = &s->elems[s->cur->count];
            e->off = (size_t)(p - s->start);
            e->kind = kind;
            e->keyed = 0;
        }
        s->ekind = kind;
        s->sub_count = s->sub_nontoken = 0;
        s->role = KVR_JSON_ABSENT;
        s->in_role = 0;
    }
}

/* A value of `kind` (an integer's value `ival`) ended just before p, inside `depth` open
 * containers. */
static void on_end(scan *s, size_t depth, kvr_json_kind kind, const unsigned char *p, int esc,
                   long long ival)
{
    kvr_json_span *c = s->cur;
    if (!c || depth == 0 || depth > 3)
        return;
    int token = kind == KVR_JSON_INTEGER && ival >= 0;
    if (depth == 1) {
        c->len = (size_t)(p - s->start) - c->off;
        c->escaped = kind == KVR_JSON_STRING && esc;
        c->ival = kind == KVR_JSON_INTEGER ? ival : 0;
        if (c->first_norole == SIZE_MAX)
            c->first_norole = c->count;
        if (kind != KVR_JSON_ARRAY) /* the summary counts belong to arrays only */
            c->first_norole = 0;
        return;
    }
    if (c->kind != KVR_JSON_ARRAY)
        return;
    if (depth == 3) {
        if (s->ekind == KVR_JSON_ARRAY) {
            s->sub_count++;
            s->sub_nontoken += !token;
        } else if (s->ekind == KVR_JSON_OBJECT && s->in_role) {
            s->role = kind;
        }
        return;
    }
    size_t idx = c->count++;
    if (c == s->rec && idx < s->elems_cap) {
        s->elems[idx].len = (size_t)(p - s->start) - s->elems[idx].off;
        s->elems[idx].role = kind == KVR_JSON_OBJECT ? s->role : KVR_JSON_ABSENT;
    }
    c->nonstring += kind != KVR_JSON_STRING;
    c->nontoken += !token;
    c->nontokarr += !(kind == KVR_JSON_ARRAY && s->sub_count && !s->sub_nontoken);
    if (!(kind == KVR_JSON_OBJECT && s->role == KVR_JSON_STRING) && c->first_norole == SIZE_MAX)
        c->first_norole = idx;
}

static inline void set_array(scan *s, size_t depth, int arr)
{
    uint64_t bit = 1ull << (depth & 63);
    if (arr)
        s->is_array[depth >> 6] |= bit;
    else
        s->is_array[depth >> 6] &= ~bit;
}

static inline int is_array(const scan *s, size_t depth)
{
    return (int)((s->is_array[depth >> 6] >> (depth & 63)) & 1);
}

int kvr_json_scan(const char *buf, size_t len, const char *const *names, size_t n,
                  kvr_json_span *out)
{
    return kvr_json_scan_elems(buf, len, names, n, out, 0, NULL, 0);
}

static const unsigned char *skip_valid(const unsigned char *p, const unsigned char *end);

int kvr_json_scan_elems(const char *buf, size_t len, const char *const *names, size_t n,
                        kvr_json_span *out, size_t which, kvr_json_elem *elems, size_t cap)
{
    return kvr_json_scan_known(buf, len, names, n, out, which, elems, cap, NULL);
}

int kvr_json_scan_known(const char *buf, size_t len, const char *const *names, size_t n,
                        kvr_json_span *out, size_t which, kvr_json_elem *elems, size_t cap,
                        const kvr_json_known *known)
{
    scan s;
    s.rec = elems && cap && which < n ? &out[which] : NULL;
    s.elems = elems;
    s.elems_cap = cap;
    s.start = (const unsigned char *)buf;
    s.names = names;
    s.n = n;
    s.out = out;
    s.cur = NULL;
    s.ekind = KVR_JSON_ABSENT;
    s.sub_count = s.sub_nontoken = 0;
    s.role = KVR_JSON_ABSENT;
    s.in_role = 0;
    memset(s.first, 0, sizeof(s.first));
    for (size_t i = 0; i < n; i++) {
        memset(&out[i], 0, sizeof(out[i]));
        unsigned char c0 = (unsigned char)names[i][0];
        s.first[c0 >> 6] |= 1ull << (c0 & 63);
    }
    const unsigned char *p = s.start, *end = s.start + len;
    p = ws(p, end);
    if (p >= end || (*p != '{' && *p != '['))
        return -1;
    int top = *p == '{' ? KVR_JSON_OBJECT : KVR_JSON_ARRAY;
    size_t depth = 0; /* open containers */
    kvr_json_kind kind;
    long long ival;
    int esc;

value:
    if (depth >= KVR_JSON_MAX_DEPTH || p >= end)
        return -1; /* the value would be deeper than KVR_JSON_MAX_DEPTH, or is missing */
    ival = 0;
    esc = 0;
    switch (*p) {
    case '{':
    case '[': {
        int arr = *p == '[';
        on_begin(&s, depth, arr ? KVR_JSON_ARRAY : KVR_JSON_OBJECT, p);
        if (known && !arr && depth == 2 && s.cur == s.rec && s.rec->kind == KVR_JSON_ARRAY &&
            s.rec->count < s.elems_cap) {
            /* Bytes accepted before as such an element are that element again: a complete
             * valid object, whose end its own bytes decide. Their length is guessed first
             * (no walk over the strings); else located where the element ends if it is
             * valid (skip_valid reads within [p, end) on any bytes). */
            kvr_json_elem *el = &s.elems[s.rec->count];
            size_t g = known->guess ? known->guess(known->ctx, (const char *)p,
                                                   (size_t)(end - p)) : 0;
            if (g >= known->min && g <= (size_t)(end - p) &&
                known->find(known->ctx, (const char *)p, g, el)) {
                s.role = el->role;
                p += g;
                kind = KVR_JSON_OBJECT;
                goto value_end;
            }
            el->keyed = 0; /* a wrong guess's key is no key of this element */
            const unsigned char *e = skip_valid(p, end);
            if ((size_t)(e - p) >= known->min &&
                known->find(known->ctx, (const char *)p, (size_t)(e - p), el)) {
                s.role = el->role;
                p = e;
                kind = KVR_JSON_OBJECT;
                goto value_end;
            }
        }
        set_array(&s, depth, arr);
        depth++;
        p = ws(p + 1, end);
        if (p < end && *p == (arr ? ']' : '}')) {
            p++;
            depth--;
            kind = arr ? KVR_JSON_ARRAY : KVR_JSON_OBJECT;
            goto value_end;
        }
        if (arr)
            goto value;
        goto key;
    }
    case '"':
        on_begin(&s, depth, KVR_JSON_STRING, p);
        kind = KVR_JSON_STRING;
        if (!(p = short_string(p, end, &esc)))
            return -1;
        goto value_end;
    case 't':
        kind = KVR_JSON_TRUE;
        if (end - p < 4 || memcmp(p, "true", 4) != 0)
            return -1;
        on_begin(&s, depth, kind, p);
        p += 4;
        goto value_end;
    case 'f':
        kind = KVR_JSON_FALSE;
        if (end - p < 5 || memcmp(p, "false", 5) != 0)
            return -1;
        on_begin(&s, depth, kind, p);
        p += 5;
        goto value_end;
    case 'n':
        kind = KVR_JSON_NULL;
        if (end - p < 4 || memcmp(p, "null", 4) != 0)
            return -1;
        on_begin(&s, depth, kind, p);
        p += 4;
        goto value_end;
    default: {
        if (*p != '-' && (*p < '0' || *p > '9'))
            return -1;
        const unsigned char *b = p;
        if (!(p = number(p, end, &kind, &ival)))
            return -1;
        on_begin(&s, depth, kind, b);
        goto value_end;
    }
    }

value_end:
    on_end(&s, depth, kind, p, esc, ival);
    if (depth == 0)
        return ws(p, end) == end ? top : -1;
    p = ws(p, end);
    if (p >= end)
        return -1;
    if (is_array(&s, depth - 1)) {
        if (*p == ',') {
            p = ws(p + 1, end);
            goto value;
        }
        if (*p != ']')
            return -1;
        kind = KVR_JSON_ARRAY;
    } else {
        if (*p == ',') {
            p = ws(p + 1, end);
            goto key;
        }
        if (*p != '}')
            return -1;
        kind = KVR_JSON_OBJECT;
    }
    p++;
    depth--;
    esc = 0;
    ival = 0;
    goto value_end;

key:
    if (p >= end || *p != '"')
        return -1;
    {
        const unsigned char *ks = p;
        esc = 0;
        if (!(p = short_string(p, end, &esc)))
            return -1;
        on_key(&s, depth, ks + 1, p - 1, esc);
    }
    p = ws(p, end);
    if (p >= end || *p != ':')
        return -1;
    p = ws(p + 1, end);
    goto value;
}

int kvr_json_span_member(const char *buf, const kvr_json_span *obj, const char *name,
                         kvr_json_span *out)
{
    memset(out, 0, sizeof(*out));
    if (obj->kind != KVR_JSON_OBJECT || strlen(name) > KVR_JSON_SCAN_NAME_MAX ||
        kvr_json_scan(buf + obj->off, obj->len, &name, 1, out) != KVR_JSON_OBJECT ||
        out->kind == KVR_JSON_ABSENT) {
        memset(out, 0, sizeof(*out));
        return 0;
    }
    out->off += obj->off;
    return 1;
}

/* The end of the string at p (its opening quote) in text already validated, skipped in
 * bulk; *esc = 1 when it holds an escape. Never reads at or past `end`. */
static const unsigned char *skip_string_valid(const unsigned char *p, const unsigned char *end,
                                              int *esc)
{
    p++;
#if defined(__SSE2__)
    /* 16 bytes a step, escapes included: a block whose backslashes stand alone (none next to
     * another, none last) escapes exactly the bytes after them, so its first unescaped quote
     * ends the string; other blocks go escape by escape below. */
    const __m128i quote = _mm_set1_epi8('"'), bslash = _mm_set1_epi8('\\');
    while (end - p >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
        unsigned q = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(v, quote));
        unsigned bs = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(v, bslash));
        if (bs) {
            if ((bs & (bs << 1)) || (bs & 0x8000)) {
                p += __builtin_ctz(q | bs);
                if (*p == '"')
                    return p + 1;
                *esc = 1;
                p += 2;
                continue;
            }
            q &= ~(bs << 1);
        }
        if (q) {
            unsigned i = (unsigned)__builtin_ctz(q);
            if (bs & ((1u << i) - 1)) /* a backslash past the string's end is not its own */
                *esc = 1;
            return p + i + 1;
        }
        if (bs)
            *esc = 1;
        p += 16;
    }
#endif
    for (;;) {
        p = skip_bytes(p, end, 1);
        if (p >= end)
            return end;
        if (*p == '"')
            return p + 1;
        *esc = 1;
        p += 2; /* an escape never ends the string */
    }
}

/* The end of the value at p in text already validated: strings skipped in bulk, containers
 * by depth. */
static const unsigned char *skip_valid(const unsigned char *p, const unsigned char *end)
{
    size_t depth = 0;
    int esc;
    do {
        unsigned char c = *p;
        if (c == '"') {
            p = skip_string_valid(p, end, &esc);
        } else if (c == '{' || c == '[') {
            depth++;
            p++;
        } else if (c == '}' || c == ']') {
            depth--;
            p++;
        } else if (c == ',' || c == ':' || c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            p++;
        } else { /* a number or a literal */
            while (p < end && *p != ',' && *p != '}' && *p != ']' && *p != ' ' && *p != '\t' &&
                   *p != '\n' && *p != '\r' && *p != ':')
                p++;
        }
    } while (depth && p < end);
    return p;
}

/* The value at p (validated text, p < end) into *out: kind, offsets from b, an integer's
 * value, a string's `escaped`. Returns the byte after it. */
static const unsigned char *describe(const unsigned char *b, const unsigned char *p,
                                     const unsigned char *end, kvr_json_span *out)
{
    const unsigned char *e;
    int esc = 0;
    memset(out, 0, sizeof(*out));
    switch (*p) {
    case '{': out->kind = KVR_JSON_OBJECT; e = skip_valid(p, end); break;
    case '[': out->kind = KVR_JSON_ARRAY; e = skip_valid(p, end); break;
    case '"':
        out->kind = KVR_JSON_STRING;
        e = skip_string_valid(p, end, &esc);
        out->escaped = esc;
        break;
    case 't': out->kind = KVR_JSON_TRUE; e = skip_valid(p, end); break;
    case 'f': out->kind = KVR_JSON_FALSE; e = skip_valid(p, end); break;
    case 'n': out->kind = KVR_JSON_NULL; e = skip_valid(p, end); break;
    default: {
        long long ival = 0;
        kvr_json_kind k = KVR_JSON_REAL;
        e = skip_valid(p, end);
        number(p, e, &k, &ival);
        out->kind = k;
        out->ival = ival;
    }
    }
    out->off = (size_t)(p - b);
    out->len = (size_t)(e - p);
    return e;
}

int kvr_json_iter_init(kvr_json_iter *it, const char *buf, const kvr_json_span *v)
{
    memset(it, 0, sizeof(*it));
    it->buf = buf;
    if ((v->kind != KVR_JSON_ARRAY && v->kind != KVR_JSON_OBJECT) || v->len < 2)
        return 0;
    it->object = v->kind == KVR_JSON_OBJECT;
    it->pos = v->off + 1;
    it->end = v->off + v->len - 1; /* the closing bracket */
    return 1;
}

/* The iterator is at its container's closing bracket (at p, or at its bound): done. A lazy
 * iterator (kvr_json_iter_descend()) moves its parent past the container. */
static int iter_done(kvr_json_iter *it, const unsigned char *p)
{
    const unsigned char *b = (const unsigned char *)it->buf;
    it->pos = (size_t)(p - b);
    it->end = it->pos;
    if (it->parent) {
        it->parent->pos = it->pos + 1;
        it->parent = NULL;
    }
    return 0;
}

int kvr_json_iter_next(kvr_json_iter *it, kvr_json_span *name, kvr_json_span *val)
{
    if (it->pos >= it->end)
        return 0; /* ended, or a zeroed iterator (no buffer) */
    const unsigned char *b = (const unsigned char *)it->buf, *end = b + it->end;
    const unsigned char *p = ws(b + it->pos, end);
    if (p < end && *p == ',')
        p = ws(p + 1, end);
    /* In valid text a value is followed by ',' or its container's bracket: the bracket ends
     * the walk even when `end` is only a bound (a lazy iterator's). */
    if (p >= end || *p == '}' || *p == ']')
        return iter_done(it, p < end ? p : end);
    kvr_json_span tmp; /* described in place: a span is ~80 bytes, not worth a copy */
    if (it->object) {
        p = ws(describe(b, p, end, name ? name : &tmp), end);
        if (p < end) /* the ':' */
            p = ws(p + 1, end);
        if (p >= end) /* not an object member: cannot happen in validated text */
            return iter_done(it, end);
    }
    p = describe(b, p, end, val ? val : &tmp);
    it->pos = (size_t)(p - b);
    return 1;
}

int kvr_json_span_is(const char *buf, const kvr_json_span *s, const char *str)
{
    if (s->kind != KVR_JSON_STRING || s->len < 2)
        return 0;
    const unsigned char *p = (const unsigned char *)buf + s->off + 1, *e = p + s->len - 2;
    if (!s->escaped) {
        size_t n = s->len - 2;
        if (!n || (unsigned char)str[0] != *p) /* most names differ at once: no call */
            return !n && str[0] == '\0';
        return strncmp(str, (const char *)p, n) == 0 && str[n] == '\0';
    }
    size_t n = strlen(str);
    if (n > KVR_JSON_SCAN_NAME_MAX)
        return 0;
    return key_is(p, e, 1, str);
}

int kvr_json_iter_descend(kvr_json_iter *it, kvr_json_span *val, kvr_json_iter *inner)
{
    memset(inner, 0, sizeof(*inner));
    inner->buf = it->buf;
    if (it->pos >= it->end)
        return 0;
    const unsigned char *b = (const unsigned char *)it->buf, *end = b + it->end;
    const unsigned char *p = ws(b + it->pos, end);
    if (p < end && *p == ',')
        p = ws(p + 1, end);
    if (p >= end || *p != '{' || it->object)
        return kvr_json_iter_next(it, NULL, val);
    memset(val, 0, sizeof(*val));
    val->kind = KVR_JSON_OBJECT;
    val->off = (size_t)(p - b);
    it->pos = val->off; /* until `inner` ends */
    inner->object = 1;
    inner->pos = val->off + 1;
    inner->end = it->end; /* a bound: the object's '}' ends the walk */
    inner->parent = it;
    return 1;
}

size_t kvr_json_iter_members(kvr_json_iter *it, const char *const *names, size_t n,
                             kvr_json_span *out)
{
    size_t found = 0;
    for (size_t i = 0; i < n; i++)
        memset(&out[i], 0, sizeof(out[i]));
    kvr_json_span k, v;
    while (kvr_json_iter_next(it, &k, &v))
        for (size_t i = 0; it->object && i < n; i++)
            if (kvr_json_span_is(it->buf, &k, names[i])) {
                found += out[i].kind == KVR_JSON_ABSENT;
                out[i] = v;
                break;
            }
    return found;
}

size_t kvr_json_span_members(const char *buf, const kvr_json_span *obj,
                             const char *const *names, size_t n, kvr_json_span *out)
{
    kvr_json_iter it;
    if (obj->kind != KVR_JSON_OBJECT || !kvr_json_iter_init(&it, buf, obj)) {
        memset(out, 0, n * sizeof(*out));
        return 0;
    }
    return kvr_json_iter_members(&it, names, n, out);
}

int kvr_json_span_first(const char *buf, const kvr_json_span *arr, kvr_json_span *out)
{
    kvr_json_iter it;
    memset(out, 0, sizeof(*out));
    if (arr->kind != KVR_JSON_ARRAY || !kvr_json_iter_init(&it, buf, arr))
        return 0;
    return kvr_json_iter_next(&it, NULL, out);
}

size_t kvr_json_span_string(const char *buf, const kvr_json_span *s, char *out, size_t cap)
{
    if (s->kind != KVR_JSON_STRING || s->len < 2)
        return 0;
    const unsigned char *p = (const unsigned char *)buf + s->off + 1, *e = p + s->len - 2;
    if (!s->escaped) {
        size_t n = s->len - 2;
        memcpy(out, p, n < cap ? n : cap);
        return n;
    }
    return decode(p, e, out, cap);
}

int kvr_json_utf8_valid(const char *p, size_t len)
{
    const unsigned char *q = (const unsigned char *)p, *end = q + len;
    while (q < end) {
        if (*q < 0x80) {
            q++;
            continue;
        }
        size_t k = json_utf8_seq(q, end);
        if (!k)
            return 0;
        q += k;
    }
    return 1;
}
