/* Strict JSON → jansson values; strings scanned 8 bytes at a time. See jsonread.h. */
#include "util/json_read.h"
#include "util/json_lex.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 2048 /* jansson's JSON_PARSER_MAX_DEPTH; counts every value, as jansson */

typedef struct rd {
    const unsigned char *p, *end, *start;
    int depth;
    const char *err;
    char *tmp; /* decoded strings with escapes; numbers for strtod */
    size_t tmpcap;
} rd;

static json_t *value(rd *r);

static int fail(rd *r, const char *msg)
{
    if (!r->err)
        r->err = msg;
    return -1;
}

static void ws(rd *r)
{
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\n' || *r->p == '\r' || *r->p == '\t'))
        r->p++;
}

static int reserve(rd *r, size_t n)
{
    if (n <= r->tmpcap)
        return 0;
    size_t c = r->tmpcap ? r->tmpcap : 256;
    while (c < n)
        c *= 2;
    char *t = realloc(r->tmp, c);
    if (!t)
        return fail(r, "out of memory");
    r->tmp = t;
    r->tmpcap = c;
    return 0;
}

/* Nonzero when one of the 8 bytes is '"', '\\', < 0x20 or >= 0x80 (no false negatives). */
static inline uint64_t special8(uint64_t v)
{
    const uint64_t ones = 0x0101010101010101ull, high = 0x8080808080808080ull;
    uint64_t q = v ^ (ones * '"'), b = v ^ (ones * '\\');
    uint64_t ctl = (v - ones * 0x20) & ~v;
    q = (q - ones) & ~q;
    b = (b - ones) & ~b;
    return (v | ctl | q | b) & high;
}

/* Reads a string (r->p at the opening quote). Sets *s and *n to its decoded bytes, which point
 * into the input when it has no escapes, else into r->tmp (valid until the next string). */
static int string(rd *r, const char **s, size_t *n)
{
    const unsigned char *p = ++r->p, *end = r->end;
    const unsigned char *begin = p;
    char *o = NULL; /* output cursor once an escape was seen */
    for (;;) {
        while (end - p >= 8) {
            uint64_t v;
            memcpy(&v, p, 8);
            if (special8(v))
                break;
            if (o) {
                memcpy(o, p, 8);
                o += 8;
            }
            p += 8;
        }
        if (p >= end)
            break;
        unsigned char c = *p;
        if (c == '"') {
            if (o) {
                *n = (size_t)(o - r->tmp);
                *s = r->tmp;
            } else {
                *n = (size_t)(p - begin);
                *s = (const char *)begin;
            }
            r->p = p + 1;
            return 0;
        }
        if (c < 0x20) {
            r->p = p;
            return fail(r, "control character in string");
        }
        if (c < 0x80 && c != '\\') {
            if (o)
                *o++ = (char)c;
            p++;
            continue;
        }
        if (c >= 0x80) {
            size_t k = json_utf8_seq(p, end);
            if (!k) {
                r->p = p;
                return fail(r, "invalid UTF-8 in string");
            }
            if (o) {
                memcpy(o, p, k);
                o += k;
            }
            p += k;
            continue;
        }
        /* an escape: from here on, decode into tmp (never longer than the input) */
        if (!o) {
            if (reserve(r, (size_t)(end - begin) + 4) < 0)
                return -1;
            memcpy(r->tmp, begin, (size_t)(p - begin));
            o = r->tmp + (p - begin);
        }
        if (end - p < 2) {
            r->p = p;
            return fail(r, "unterminated string");
        }
        unsigned char e = p[1];
        p += 2;
        switch (e) {
        case '"': *o++ = '"'; continue;
        case '\\': *o++ = '\\'; continue;
        case '/': *o++ = '/'; continue;
        case 'b': *o++ = '\b'; continue;
        case 'f': *o++ = '\f'; continue;
        case 'n': *o++ = '\n'; continue;
        case 'r': *o++ = '\r'; continue;
        case 't': *o++ = '\t'; continue;
        case 'u': break;
        default:
            r->p = p - 2;
            return fail(r, "invalid escape");
        }
        uint32_t cp, lo;
        if (end - p < 4 || json_hex4(p, &cp) < 0) {
            r->p = p - 2;
            return fail(r, "invalid \\u escape");
        }
        p += 4;
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (end - p < 6 || p[0] != '\\' || p[1] != 'u' || json_hex4(p + 2, &lo) < 0 ||
                lo < 0xDC00 || lo > 0xDFFF) {
                r->p = p - 6;
                return fail(r, "invalid Unicode surrogate");
            }
            p += 6;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            r->p = p - 6;
            return fail(r, "invalid Unicode surrogate");
        } else if (cp == 0) {
            r->p = p - 6;
            return fail(r, "\\u0000 is not allowed");
        }
        o += json_put_utf8(o, cp);
    }
    r->p = end;
    return fail(r, "unterminated string");
}

static json_t *number(rd *r)
{
    const unsigned char *s = r->p, *p = s, *end = r->end;
    int neg = 0, real = 0;
    if (p < end && *p == '-') {
        neg = 1;
        p++;
    }
    if (p >= end || *p < '0' || *p > '9')
        goto bad;
    if (*p == '0') {
        p++;
        if (p < end && *p >= '0' && *p <= '9')
            goto bad; /* no leading zeros */
    } else {
        while (p < end && *p >= '0' && *p <= '9')
            p++;
    }
    if (p < end && *p == '.') {
        real = 1;
        p++;
        if (p >= end || *p < '0' || *p > '9')
            goto bad;
        while (p < end && *p >= '0' && *p <= '9')
            p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        real = 1;
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            p++;
        if (p >= end || *p < '0' || *p > '9')
            goto bad;
        while (p < end && *p >= '0' && *p <= '9')
            p++;
    }
    r->p = p;
    if (!real) {
        /* accumulate as a negative number so LLONG_MIN fits */
        json_int_t v = 0;
        for (const unsigned char *d = s + neg; d < p; d++) {
            int digit = *d - '0';
            if (v < (LLONG_MIN + digit) / 10) {
                r->p = s;
                fail(r, neg ? "too big negative integer" : "too big integer");
                return NULL;
            }
            v = v * 10 - digit;
        }
        if (!neg) {
            if (v == LLONG_MIN) {
                r->p = s;
                fail(r, "too big integer");
                return NULL;
            }
            v = -v;
        }
        return json_integer(v);
    }
    size_t n = (size_t)(p - s);
    if (reserve(r, n + 1) < 0)
        return NULL;
    memcpy(r->tmp, s, n);
    r->tmp[n] = '\0';
    errno = 0;
    double d = strtod(r->tmp, NULL);
    if (errno == ERANGE && isinf(d)) {
        r->p = s;
        fail(r, "real number overflow");
        return NULL;
    }
    return json_real(d);
bad:
    r->p = s;
    fail(r, "invalid number");
    return NULL;
}

static int literal(rd *r, const char *word, size_t n)
{
    if ((size_t)(r->end - r->p) < n || memcmp(r->p, word, n) != 0)
        return fail(r, "invalid token");
    r->p += n;
    return 0;
}

static json_t *object(rd *r)
{
    json_t *o = json_object();
    if (!o) {
        fail(r, "out of memory");
        return NULL;
    }
    r->p++;
    ws(r);
    if (r->p < r->end && *r->p == '}') {
        r->p++;
        return o;
    }
    for (;;) {
        if (r->p >= r->end || *r->p != '"') {
            fail(r, "string or '}' expected");
            goto err;
        }
        const char *k;
        size_t kn;
        if (string(r, &k, &kn) < 0)
            goto err;
        /* the key may live in tmp, which the value can reuse: copy small keys to the stack */
        char kbuf[128], *key = kbuf;
        if (kn >= sizeof(kbuf)) {
            key = malloc(kn + 1);
            if (!key) {
                fail(r, "out of memory");
                goto err;
            }
        }
        memcpy(key, k, kn);
        key[kn] = '\0';
        ws(r);
        json_t *v = NULL;
        if (r->p >= r->end || *r->p != ':')
            fail(r, "':' expected");
        else {
            r->p++;
            ws(r);
            v = value(r);
        }
        int rc = v ? json_object_setn_new_nocheck(o, key, kn, v) : -1;
        if (key != kbuf)
            free(key);
        if (rc < 0) {
            fail(r, "out of memory");
            goto err;
        }
        ws(r);
        if (r->p < r->end && *r->p == ',') {
            r->p++;
            ws(r);
            continue;
        }
        if (r->p < r->end && *r->p == '}') {
            r->p++;
            return o;
        }
        fail(r, "',' or '}' expected");
        goto err;
    }
err:
    json_decref(o);
    return NULL;
}

static json_t *array(rd *r)
{
    json_t *a = json_array();
    if (!a) {
        fail(r, "out of memory");
        return NULL;
    }
    r->p++;
    ws(r);
    if (r->p < r->end && *r->p == ']') {
        r->p++;
        return a;
    }
    for (;;) {
        json_t *v = value(r);
        if (!v || json_array_append_new(a, v) < 0) {
            fail(r, "out of memory");
            json_decref(a);
            return NULL;
        }
        ws(r);
        if (r->p < r->end && *r->p == ',') {
            r->p++;
            ws(r);
            continue;
        }
        if (r->p < r->end && *r->p == ']') {
            r->p++;
            return a;
        }
        fail(r, "',' or ']' expected");
        json_decref(a);
        return NULL;
    }
}

static json_t *value(rd *r)
{
    if (++r->depth > MAX_DEPTH) {
        fail(r, "maximum parsing depth reached");
        return NULL;
    }
    json_t *v = NULL;
    if (r->p >= r->end) {
        fail(r, "unexpected end of input");
    } else {
        switch (*r->p) {
        case '{':
            v = object(r);
            break;
        case '[':
            v = array(r);
            break;
        case '"': {
            const char *s;
            size_t n;
            if (string(r, &s, &n) == 0 && !(v = json_stringn_nocheck(s, n)))
                fail(r, "out of memory");
            break;
        }
        case 't':
            if (literal(r, "true", 4) == 0)
                v = json_true();
            break;
        case 'f':
            if (literal(r, "false", 5) == 0)
                v = json_false();
            break;
        case 'n':
            if (literal(r, "null", 4) == 0)
                v = json_null();
            break;
        default:
            if (*r->p == '-' || (*r->p >= '0' && *r->p <= '9'))
                v = number(r);
            else
                fail(r, "invalid token");
        }
    }
    r->depth--;
    return v;
}

json_t *kvr_json_read(const char *buf, size_t len, json_error_t *err)
{
    rd r = {.p = (const unsigned char *)buf, .end = (const unsigned char *)buf + len,
            .start = (const unsigned char *)buf};
    json_t *v = NULL;
    ws(&r);
    if (r.p >= r.end || (*r.p != '{' && *r.p != '['))
        fail(&r, "'[' or '{' expected");
    else if ((v = value(&r)) != NULL) {
        ws(&r);
        if (r.p != r.end) {
            fail(&r, "end of file expected");
            json_decref(v);
            v = NULL;
        }
    }
    free(r.tmp);
    if (!v && err) {
        memset(err, 0, sizeof(*err));
        size_t pos = (size_t)(r.p - r.start);
        int line = 1, col = 1;
        for (const unsigned char *q = r.start; q < r.p; q++) {
            if (*q == '\n') {
                line++;
                col = 1;
            } else {
                col++;
            }
        }
        err->line = line;
        err->column = col;
        err->position = (int)(pos > INT_MAX ? INT_MAX : pos);
        snprintf(err->text, sizeof(err->text), "%s", r.err ? r.err : "invalid JSON");
        snprintf(err->source, sizeof(err->source), "<buffer>");
    }
    return v;
}

/* Skips one JSON value of a valid document starting at i (whitespace already skipped);
 * returns the index just past it. */
static size_t skip_value(const char *b, size_t len, size_t i)
{
    if (b[i] == '"') {
        for (i++; i < len && b[i] != '"'; i++)
            if (b[i] == '\\')
                i++;
        return i + 1;
    }
    if (b[i] == '{' || b[i] == '[') {
        int depth = 0;
        for (; i < len; i++) {
            char c = b[i];
            if (c == '"') {
                i = skip_value(b, len, i) - 1;
            } else if (c == '{' || c == '[') {
                depth++;
            } else if (c == '}' || c == ']') {
                if (--depth == 0)
                    return i + 1;
            }
        }
        return len;
    }
    while (i < len && b[i] != ',' && b[i] != '}' && b[i] != ']' && b[i] != ' ' &&
           b[i] != '\t' && b[i] != '\n' && b[i] != '\r')
        i++;
    return i;
}

static size_t skip_ws(const char *b, size_t len, size_t i)
{
    while (i < len && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r'))
        i++;
    return i;
}

/* A key as written (escapes included) against a plain ASCII key: "mod\u0065l" is "model",
 * as every JSON parser, the worker's included, reads it. */
static int key_equals(const char *k, size_t n, const char *key, size_t klen)
{
    size_t j = 0;
    for (size_t i = 0; i < n; i++, j++) {
        int c = (unsigned char)k[i];
        if (c == '\\' && i + 1 < n) {
            char e = k[++i];
            uint32_t cp;
            if (e == 'u' && i + 4 < n && json_hex4((const unsigned char *)k + i + 1, &cp) == 0) {
                c = (int)cp;
                i += 4;
            } else {
                c = e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e == 'b' ? '\b'
                    : e == 'f' ? '\f' : e;
            }
        }
        if (j >= klen || c != (unsigned char)key[j])
            return 0;
    }
    return j == klen;
}

int kvr_json_member_next(const char *buf, size_t len, size_t *pos, kvr_json_member *m)
{
    size_t i = *pos;
    if (i == 0) { /* the object's opening brace */
        i = skip_ws(buf, len, 0);
        if (i >= len || buf[i] != '{')
            return -1;
        i++;
    } else {
        i = skip_ws(buf, len, i);
        if (i >= len || buf[i] != ',')
            return 0;
        i++;
    }
    i = skip_ws(buf, len, i);
    if (i >= len || buf[i] != '"')
        return 0;
    m->start = i;
    m->key = i + 1;
    size_t ke = skip_value(buf, len, i) - 1;
    m->key_len = ke - m->key;
    i = skip_ws(buf, len, ke + 1);
    if (i >= len || buf[i] != ':')
        return -1;
    i = skip_ws(buf, len, i + 1);
    m->value = i;
    m->end = skip_value(buf, len, i);
    m->value_len = m->end - i;
    *pos = m->end;
    return 1;
}

int kvr_json_member_is(const char *buf, const kvr_json_member *m, const char *key)
{
    return key_equals(buf + m->key, m->key_len, key, strlen(key));
}

long kvr_json_member_span(const char *buf, size_t len, const char *key, size_t *vlen)
{
    size_t pos = 0;
    long found = -1;
    kvr_json_member m;
    while (kvr_json_member_next(buf, len, &pos, &m) == 1)
        if (kvr_json_member_is(buf, &m, key)) {
            found = (long)m.value;
            *vlen = m.value_len;
        }
    return found;
}
