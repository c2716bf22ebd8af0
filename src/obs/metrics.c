/* Prometheus metrics registry and text exposition format 0.0.4
 * (https://prometheus.io/docs/instrumenting/exposition_formats/).
 *
 * Each family keeps its series twice: in a vector, for stable creation-order output, and in an
 * open-addressing hash table keyed by the label values, because the request path updates ~5
 * series per request and must neither scan nor allocate once a series exists. Removal (a worker
 * leaving) is rare, so it compacts the vector and rebuilds the table in place. */
#include "obs/metrics.h"

#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"

enum { T_COUNTER, T_GAUGE, T_HISTOGRAM };
static const char *const type_names[] = {"counter", "gauge", "histogram"};

typedef struct series {
    uint64_t hash;
    double value;      /* counter/gauge value; histogram sum */
    uint64_t count;    /* histogram observations */
    uint64_t *buckets; /* histogram: nb + 1 per-bucket (not cumulative) counts; last is +Inf */
    char **values;     /* nlabels label values; all in this series' single allocation */
} series;

struct kvr_metric {
    int type;
    char *name;
    char *help;
    size_t nlabels;
    char **labels;
    double *bounds;
    size_t nb;
    series **list; /* creation order */
    size_t n, cap;
    series **table; /* open addressing, linear probing; tcap is a power of two, load <= 1/2 */
    size_t tcap;
    /* Series last used from each call site, slotted by the addresses of the label values:
     * a call site passes the same strings (a worker's URL, a route's model) request after
     * request, so a hit costs one strcmp per label instead of hashing every byte. Checked by
     * content, so a reused stack buffer with other text only misses. */
    series *memo[8];
};

typedef struct hook {
    void (*cb)(void *ud);
    void *ud;
} hook;

struct kvr_metrics {
    kvr_metric **fams; /* registration order */
    size_t n, cap;
    hook *hooks;
    size_t nh, hcap;
};

/* Boot-time allocations (registry, families) abort on OOM, as the header promises; series
 * creation on the request path instead fails softly and drops the update. */
static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) {
        fputs("kvroute: out of memory in metrics registry\n", stderr);
        abort();
    }
    return p;
}

static char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = xcalloc(n, 1);
    memcpy(p, s, n);
    return p;
}

static void grow_or_abort(void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return;
    size_t n = *cap ? *cap * 2 : 8;
    while (n < need)
        n *= 2;
    void *p = realloc(*arr, n * elem);
    if (!p) {
        fputs("kvroute: out of memory in metrics registry\n", stderr);
        abort();
    }
    *arr = p;
    *cap = n;
}

/* ---- registry ------------------------------------------------------------------------------ */

kvr_metrics *kvr_metrics_new(void)
{
    return xcalloc(1, sizeof(kvr_metrics));
}

static void family_free(kvr_metric *m)
{
    for (size_t i = 0; i < m->n; i++)
        free(m->list[i]);
    free(m->list);
    free(m->table);
    for (size_t i = 0; i < m->nlabels; i++)
        free(m->labels[i]);
    free(m->labels);
    free(m->bounds);
    free(m->name);
    free(m->help);
    free(m);
}

void kvr_metrics_free(kvr_metrics *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->n; i++)
        family_free(r->fams[i]);
    free(r->fams);
    free(r->hooks);
    free(r);
}

kvr_metric *kvr_metrics_find(kvr_metrics *r, const char *name)
{
    if (!r || !name)
        return NULL;
    for (size_t i = 0; i < r->n; i++)
        if (strcmp(r->fams[i]->name, name) == 0)
            return r->fams[i];
    return NULL;
}

void kvr_metrics_on_render(kvr_metrics *r, void (*cb)(void *ud), void *ud)
{
    if (!r || !cb)
        return;
    grow_or_abort((void **)&r->hooks, &r->hcap, r->nh + 1, sizeof(hook));
    r->hooks[r->nh++] = (hook){cb, ud};
}

/* ---- series lookup ------------------------------------------------------------------------- */

static const char *val_at(const char *const *values, size_t i)
{
    return values && values[i] ? values[i] : "";
}

/* FNV-1a over the values, each followed by a 0xff byte (never valid UTF-8) so that ("ab","c")
 * and ("a","bc") hash apart; equality is still checked value by value. */
static uint64_t hash_values(size_t n, const char *const *values)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) {
        for (const unsigned char *p = (const unsigned char *)val_at(values, i); *p; p++) {
            h ^= *p;
            h *= 0x100000001b3ULL;
        }
        h ^= 0xff;
        h *= 0x100000001b3ULL;
    }
    return h ^ (h >> 29);
}

static bool series_matches(const kvr_metric *m, const series *s, uint64_t h,
                           const char *const *values)
{
    if (s->hash != h)
        return false;
    for (size_t i = 0; i < m->nlabels; i++)
        if (strcmp(s->values[i], val_at(values, i)) != 0)
            return false;
    return true;
}

static void table_insert(series **table, size_t tcap, series *s)
{
    size_t mask = tcap - 1;
    size_t i = (size_t)s->hash & mask;
    while (table[i])
        i = (i + 1) & mask;
    table[i] = s;
}

static series *series_new(const kvr_metric *m, uint64_t h, const char *const *values)
{
    size_t nbk = m->type == T_HISTOGRAM ? m->nb + 1 : 0;
    size_t strbytes = 0;
    for (size_t i = 0; i < m->nlabels; i++)
        strbytes += strlen(val_at(values, i)) + 1;
    size_t size = sizeof(series) + m->nlabels * sizeof(char *) + nbk * sizeof(uint64_t) + strbytes;
    series *s = calloc(1, size);
    if (!s)
        return NULL;
    s->hash = h;
    s->values = (char **)(s + 1);
    s->buckets = nbk ? (uint64_t *)(s->values + m->nlabels) : NULL;
    char *p = (char *)(s->values + m->nlabels) + nbk * sizeof(uint64_t);
    for (size_t i = 0; i < m->nlabels; i++) {
        const char *v = val_at(values, i);
        size_t n = strlen(v) + 1;
        memcpy(p, v, n);
        s->values[i] = p;
        p += n;
    }
    return s;
}

static size_t memo_slot(size_t n, const char *const *values)
{
    uint64_t h = 0;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint64_t)(uintptr_t)val_at(values, i)) * 0x9e3779b97f4a7c15ULL;
    return (size_t)(h >> 61);
}

static bool memo_matches(const kvr_metric *m, const series *s, const char *const *values)
{
    for (size_t i = 0; i < m->nlabels; i++)
        if (strcmp(s->values[i], val_at(values, i)) != 0)
            return false;
    return true;
}

static series *lookup_table(kvr_metric *m, const char *const *values, bool create);

/* Finds the series for `values`; with `create`, makes it when absent (NULL only on OOM). */
static series *lookup(kvr_metric *m, const char *const *values, bool create)
{
    size_t slot = memo_slot(m->nlabels, values);
    series *s = m->memo[slot];
    if (s && memo_matches(m, s, values))
        return s;
    s = lookup_table(m, values, create);
    if (s)
        m->memo[slot] = s;
    return s;
}

static series *lookup_table(kvr_metric *m, const char *const *values, bool create)
{
    uint64_t h = hash_values(m->nlabels, values);
    size_t mask = m->tcap - 1;
    for (size_t i = (size_t)h & mask; m->table[i]; i = (i + 1) & mask)
        if (series_matches(m, m->table[i], h, values))
            return m->table[i];
    if (!create)
        return NULL;

    if (m->n + 1 > m->cap) {
        size_t ncap = m->cap ? m->cap * 2 : 8;
        series **nl = realloc(m->list, ncap * sizeof(*nl));
        if (!nl)
            return NULL;
        m->list = nl;
        m->cap = ncap;
    }
    if ((m->n + 1) * 2 > m->tcap) {
        size_t ncap = m->tcap * 2;
        series **nt = calloc(ncap, sizeof(*nt));
        if (!nt)
            return NULL;
        for (size_t i = 0; i < m->n; i++)
            table_insert(nt, ncap, m->list[i]);
        free(m->table);
        m->table = nt;
        m->tcap = ncap;
    }
    series *s = series_new(m, h, values);
    if (!s) {
        KVR_WARN("msg=\"metrics: out of memory creating a series\" metric=%s", m->name);
        return NULL;
    }
    m->list[m->n++] = s;
    table_insert(m->table, m->tcap, s);
    return s;
}

/* ---- registration -------------------------------------------------------------------------- */

static bool valid_metric_name(const char *s)
{
    if (!s || !*s)
        return false;
    for (const char *p = s; *p; p++) {
        char c = *p;
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
                  (p != s && c >= '0' && c <= '9');
        if (!ok)
            return false;
    }
    return true;
}

static bool valid_label_name(const char *s)
{
    if (!s || !*s || (s[0] == '_' && s[1] == '_')) /* __* is reserved for Prometheus itself */
        return false;
    for (const char *p = s; *p; p++) {
        char c = *p;
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                  (p != s && c >= '0' && c <= '9');
        if (!ok)
            return false;
    }
    return true;
}

static bool same_shape(const kvr_metric *m, int type, size_t nlabels, const char *const *labels,
                       const double *bounds, size_t nb)
{
    if (m->type != type || m->nlabels != nlabels || m->nb != nb)
        return false;
    for (size_t i = 0; i < nlabels; i++)
        if (strcmp(m->labels[i], labels[i]) != 0)
            return false;
    for (size_t i = 0; i < nb; i++)
        if (m->bounds[i] != bounds[i])
            return false;
    return true;
}

static kvr_metric *do_register(kvr_metrics *r, int type, const char *name, const char *help,
                               size_t nlabels, const char *const *labels, const double *bounds,
                               size_t nb)
{
    if (!r)
        return NULL;
    if (!valid_metric_name(name)) {
        KVR_ERROR("msg=\"metrics: invalid metric name\" name=\"%s\"", name ? name : "(null)");
        return NULL;
    }
    if (nlabels && !labels) {
        KVR_ERROR("msg=\"metrics: label names missing\" metric=%s", name);
        return NULL;
    }
    for (size_t i = 0; i < nlabels; i++) {
        bool dup = false;
        for (size_t j = 0; j < i; j++)
            dup = dup || strcmp(labels[i], labels[j]) == 0;
        if (!valid_label_name(labels[i]) || dup ||
            (type == T_HISTOGRAM && strcmp(labels[i], "le") == 0)) {
            KVR_ERROR("msg=\"metrics: invalid label name\" metric=%s label=\"%s\"", name,
                      labels[i] ? labels[i] : "(null)");
            return NULL;
        }
    }
    if (type == T_HISTOGRAM) {
        if (nb && !bounds)
            return NULL;
        if (nb && isinf(bounds[nb - 1]) && bounds[nb - 1] > 0)
            nb--; /* +Inf is always implicit (Go client behaviour) */
        for (size_t i = 0; i < nb; i++) {
            if (isnan(bounds[i]) || (i && !(bounds[i] > bounds[i - 1]))) {
                KVR_ERROR("msg=\"metrics: histogram bounds not strictly ascending\" metric=%s",
                          name);
                return NULL;
            }
        }
    } else {
        nb = 0;
    }

    kvr_metric *old = kvr_metrics_find(r, name);
    if (old) {
        if (same_shape(old, type, nlabels, labels, bounds, nb))
            return old;
        KVR_ERROR("msg=\"metrics: metric re-registered with a different type, labels or bounds\" "
                  "metric=%s",
                  name);
        return NULL;
    }

    kvr_metric *m = xcalloc(1, sizeof(*m));
    m->type = type;
    m->name = xstrdup(name);
    m->help = xstrdup(help ? help : "");
    m->nlabels = nlabels;
    m->labels = xcalloc(nlabels, sizeof(char *));
    for (size_t i = 0; i < nlabels; i++)
        m->labels[i] = xstrdup(labels[i]);
    m->nb = nb;
    m->bounds = xcalloc(nb, sizeof(double));
    if (nb)
        memcpy(m->bounds, bounds, nb * sizeof(double));
    m->tcap = 8;
    m->table = xcalloc(m->tcap, sizeof(series *));
    grow_or_abort((void **)&r->fams, &r->cap, r->n + 1, sizeof(kvr_metric *));
    r->fams[r->n++] = m;
    /* An unlabelled family always has its one series, so a scrape shows 0 rather than nothing
     * (what the Go and Python clients do). */
    if (nlabels == 0 && !lookup(m, NULL, true)) {
        fputs("kvroute: out of memory in metrics registry\n", stderr);
        abort();
    }
    return m;
}

kvr_metric *kvr_metrics_counter(kvr_metrics *r, const char *name, const char *help,
                                size_t nlabels, const char *const *labels)
{
    return do_register(r, T_COUNTER, name, help, nlabels, labels, NULL, 0);
}

kvr_metric *kvr_metrics_gauge(kvr_metrics *r, const char *name, const char *help,
                              size_t nlabels, const char *const *labels)
{
    return do_register(r, T_GAUGE, name, help, nlabels, labels, NULL, 0);
}

kvr_metric *kvr_metrics_histogram(kvr_metrics *r, const char *name, const char *help,
                                  size_t nlabels, const char *const *labels,
                                  const double *bounds, size_t nb)
{
    return do_register(r, T_HISTOGRAM, name, help, nlabels, labels, bounds, nb);
}

/* ---- updates ------------------------------------------------------------------------------- */

void kvr_metric_inc(kvr_metric *m, const char *const *values, double v)
{
    if (!m || m->type == T_HISTOGRAM)
        return;
    if (m->type == T_COUNTER && !(v >= 0))
        return;
    series *s = lookup(m, values, true);
    if (s)
        s->value += v;
}

void kvr_metric_set(kvr_metric *m, const char *const *values, double v)
{
    if (!m || m->type == T_HISTOGRAM)
        return;
    series *s = lookup(m, values, true);
    if (s)
        s->value = v;
}

void kvr_metric_observe(kvr_metric *m, const char *const *values, double v)
{
    if (!m || m->type != T_HISTOGRAM)
        return;
    series *s = lookup(m, values, true);
    if (!s)
        return;
    /* First bucket with v <= bound (le is inclusive); NaN lands in +Inf, as in the Go client. */
    size_t lo = 0, hi = m->nb;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (v <= m->bounds[mid])
            hi = mid;
        else
            lo = mid + 1;
    }
    if (isnan(v))
        lo = m->nb;
    s->buckets[lo]++;
    s->count++;
    s->value += v;
}

double kvr_metric_get(kvr_metric *m, const char *const *values)
{
    if (!m)
        return 0;
    series *s = lookup(m, values, false);
    if (!s)
        return 0;
    return m->type == T_HISTOGRAM ? (double)s->count : s->value;
}

void kvr_metric_remove_matching(kvr_metric *m, const char *label, const char *value)
{
    if (!m || !label)
        return;
    size_t li = m->nlabels;
    for (size_t i = 0; i < m->nlabels; i++)
        if (strcmp(m->labels[i], label) == 0)
            li = i;
    if (li == m->nlabels)
        return;
    const char *want = value ? value : "";
    size_t kept = 0;
    for (size_t i = 0; i < m->n; i++) {
        if (strcmp(m->list[i]->values[li], want) == 0)
            free(m->list[i]);
        else
            m->list[kept++] = m->list[i];
    }
    if (kept == m->n)
        return;
    m->n = kept;
    memset(m->memo, 0, sizeof(m->memo));
    memset(m->table, 0, m->tcap * sizeof(series *));
    for (size_t i = 0; i < m->n; i++)
        table_insert(m->table, m->tcap, m->list[i]);
}

/* ---- rendering ----------------------------------------------------------------------------- */

/* Shortest decimal that strtod reads back to exactly `v`, with Go's spellings for the specials
 * (NaN, +Inf, -Inf), which Prometheus expects. */
static void fmt_double(char out[40], double v)
{
    if (isnan(v)) {
        strcpy(out, "NaN");
        return;
    }
    if (isinf(v)) {
        strcpy(out, v > 0 ? "+Inf" : "-Inf");
        return;
    }
    if (v == 0) {
        strcpy(out, "0");
        return;
    }
    /* %.15g already prints integers below 1e15 plainly (`3`, not `3.0` or `3e+00`). */
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(out, 40, "%.*g", prec, v);
        if (prec == 17 || strtod(out, NULL) == v)
            return;
    }
}

/* Label values escape \, " and newline; HELP text escapes only \ and newline (format 0.0.4). */
static int put_escaped(kvr_buf *out, const char *s, bool quote)
{
    int err = 0;
    const char *run = s;
    for (const char *p = s;; p++) {
        const char *rep = NULL;
        if (*p == '\\')
            rep = "\\\\";
        else if (*p == '\n')
            rep = "\\n";
        else if (quote && *p == '"')
            rep = "\\\"";
        else if (*p)
            continue;
        err |= kvr_buf_append(out, run, (size_t)(p - run));
        if (!*p)
            break;
        err |= kvr_buf_puts(out, rep);
        run = p + 1;
    }
    return err;
}

static int put_labels(kvr_buf *out, const kvr_metric *m, const series *s, const char *le)
{
    if (m->nlabels == 0 && !le)
        return 0;
    int err = kvr_buf_puts(out, "{");
    for (size_t i = 0; i < m->nlabels; i++) {
        err |= kvr_buf_printf(out, "%s%s=\"", i ? "," : "", m->labels[i]);
        err |= put_escaped(out, s->values[i], true);
        err |= kvr_buf_puts(out, "\"");
    }
    if (le)
        err |= kvr_buf_printf(out, "%sle=\"%s\"", m->nlabels ? "," : "", le);
    err |= kvr_buf_puts(out, "}");
    return err;
}

static int render_family(kvr_buf *out, const kvr_metric *m)
{
    int err = kvr_buf_printf(out, "# HELP %s ", m->name);
    err |= put_escaped(out, m->help, false);
    err |= kvr_buf_printf(out, "\n# TYPE %s %s\n", m->name, type_names[m->type]);
    char num[40];
    for (size_t i = 0; i < m->n && !err; i++) {
        const series *s = m->list[i];
        if (m->type != T_HISTOGRAM) {
            err |= kvr_buf_puts(out, m->name);
            err |= put_labels(out, m, s, NULL);
            fmt_double(num, s->value);
            err |= kvr_buf_printf(out, " %s\n", num);
            continue;
        }
        uint64_t cum = 0;
        for (size_t b = 0; b <= m->nb; b++) {
            cum += s->buckets[b];
            if (b < m->nb)
                fmt_double(num, m->bounds[b]);
            else
                strcpy(num, "+Inf");
            err |= kvr_buf_printf(out, "%s_bucket", m->name);
            err |= put_labels(out, m, s, num);
            err |= kvr_buf_printf(out, " %" PRIu64 "\n", cum);
        }
        err |= kvr_buf_printf(out, "%s_sum", m->name);
        err |= put_labels(out, m, s, NULL);
        fmt_double(num, s->value);
        err |= kvr_buf_printf(out, " %s\n", num);
        err |= kvr_buf_printf(out, "%s_count", m->name);
        err |= put_labels(out, m, s, NULL);
        err |= kvr_buf_printf(out, " %" PRIu64 "\n", s->count);
    }
    return err;
}

int kvr_metrics_render(kvr_metrics *r, kvr_buf *out)
{
    if (!r || !out)
        return -1;
    for (size_t i = 0; i < r->nh; i++)
        r->hooks[i].cb(r->hooks[i].ud);
    size_t start = out->len;
    int err = 0;
    for (size_t i = 0; i < r->n && !err; i++)
        err |= render_family(out, r->fams[i]);
    if (err) {
        /* Leave the caller's buffer as it was rather than half a scrape. */
        out->len = start;
        if (out->data)
            out->data[start] = '\0';
        return -1;
    }
    return 0;
}
