/* Prometheus text format 0.0.4 parser, used to scrape vLLM's /metrics. It follows the grammar
 * of Prometheus' own expfmt text parser (blanks are spaces and tabs; label values escape only
 * \\, \" and \n; an optional integer timestamp follows the value) but is per-line tolerant:
 * a malformed line is skipped and parsing carries on, so one bad line from a worker never costs
 * the rest of its scrape. */
#include "obs/metrics.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef struct scratch {
    char *buf; /* NUL-terminated copies of the line's tokens */
    size_t cap;
    const char **names;
    const char **vals;
    size_t lcap;
} scratch;

/* Sizes scratch for a line of `n` bytes: every token is a sub-span of the line plus a NUL, and
 * each label takes at least 4 bytes (`a=""`). Returns -1 on OOM (the line is then skipped). */
static int scratch_fit(scratch *s, size_t n)
{
    size_t need = 2 * n + 8;
    if (need > s->cap) {
        char *b = realloc(s->buf, need);
        if (!b)
            return -1;
        s->buf = b;
        s->cap = need;
    }
    size_t labels = n / 4 + 1;
    if (labels > s->lcap) {
        const char **a = realloc(s->names, labels * sizeof(*a));
        if (!a)
            return -1;
        s->names = a;
        const char **v = realloc(s->vals, labels * sizeof(*v));
        if (!v)
            return -1;
        s->vals = v;
        s->lcap = labels;
    }
    return 0;
}

static bool is_blank(char c)
{
    return c == ' ' || c == '\t';
}

static bool name_start(char c, bool colon)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':');
}

static bool name_char(char c, bool colon)
{
    return name_start(c, colon) || (c >= '0' && c <= '9');
}

static const char *skip_blank(const char *p, const char *e)
{
    while (p < e && is_blank(*p))
        p++;
    return p;
}

/* Copies [p, q) into the scratch at *w as a NUL-terminated string; returns its start. */
static const char *put(char **w, const char *p, const char *q)
{
    char *start = *w;
    memcpy(start, p, (size_t)(q - p));
    start[q - p] = '\0';
    *w = start + (q - p) + 1;
    return start;
}

/* Parses one line [p, e) (no newline). Returns true and fills `out` for a sample line. */
static bool parse_line(scratch *s, const char *p, const char *e, kvr_prom_sample *out)
{
    p = skip_blank(p, e);
    if (p == e || *p == '#')
        return false;
    if (scratch_fit(s, (size_t)(e - p)) < 0)
        return false;
    char *w = s->buf;

    const char *q = p;
    if (!name_start(*q, true))
        return false;
    while (q < e && name_char(*q, true))
        q++;
    out->name = put(&w, p, q);
    out->nlabels = 0;
    p = skip_blank(q, e);

    if (p < e && *p == '{') {
        p++;
        for (;;) {
            p = skip_blank(p, e);
            if (p == e)
                return false;
            if (*p == '}') {
                p++;
                break;
            }
            if (out->nlabels == s->lcap) /* cannot happen given scratch_fit; belt and braces */
                return false;
            q = p;
            if (!name_start(*q, false))
                return false;
            while (q < e && name_char(*q, false))
                q++;
            const char *lname = put(&w, p, q);
            p = skip_blank(q, e);
            if (p == e || *p != '=')
                return false;
            p = skip_blank(p + 1, e);
            if (p == e || *p != '"')
                return false;
            p++;
            char *val = w;
            bool closed = false;
            while (p < e) {
                char c = *p++;
                if (c == '"') {
                    closed = true;
                    break;
                }
                if (c == '\\') {
                    if (p == e)
                        return false;
                    c = *p++;
                    if (c == 'n')
                        c = '\n';
                    else if (c != '\\' && c != '"')
                        return false;
                }
                *w++ = c;
            }
            if (!closed)
                return false;
            *w++ = '\0';
            s->names[out->nlabels] = lname;
            s->vals[out->nlabels] = val;
            out->nlabels++;
            p = skip_blank(p, e);
            if (p < e && *p == ',')
                p++;
            else if (p < e && *p == '}')
                continue; /* the loop's top consumes it */
            else
                return false;
        }
        p = skip_blank(p, e);
    }

    /* Value: Go's ParseFloat spellings (decimal, hex, NaN, ±Inf); strtod reads the same set. */
    q = p;
    while (q < e && !is_blank(*q))
        q++;
    if (q == p)
        return false;
    const char *num = put(&w, p, q);
    char *end;
    errno = 0;
    out->value = strtod(num, &end);
    if (end != num + (q - p))
        return false;

    /* Optional timestamp (ms since the epoch): an integer, ignored — the scrape time is ours. */
    p = skip_blank(q, e);
    if (p < e) {
        q = p;
        while (q < e && !is_blank(*q))
            q++;
        const char *ts = put(&w, p, q);
        errno = 0;
        strtoll(ts, &end, 10);
        if (end == ts || end != ts + (q - p) || errno)
            return false;
        if (skip_blank(q, e) != e)
            return false;
    }
    out->label_names = s->names;
    out->label_values = s->vals;
    return true;
}

size_t kvr_prom_parse(const char *text, size_t len,
                      void (*cb)(void *ud, const kvr_prom_sample *s), void *ud)
{
    if (!text)
        return 0;
    scratch s = {0};
    size_t count = 0;
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *e = nl ? nl : end;
        const char *le = e;
        if (le > p && le[-1] == '\r')
            le--;
        kvr_prom_sample smp;
        if (parse_line(&s, p, le, &smp)) {
            count++;
            if (cb)
                cb(ud, &smp);
        }
        p = nl ? nl + 1 : end;
    }
    free(s.buf);
    free(s.names);
    free(s.vals);
    return count;
}
