/* Percentiles, gauges and tallies. */
#include "stats.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

double kvr_bench_percentile_sorted(const double *v, size_t n, double q)
{
    if (n == 0)
        return NAN;
    if (q < 0)
        q = 0;
    if (q > 100)
        q = 100;
    double rank = q / 100.0 * (double)(n - 1);
    size_t lo = (size_t)floor(rank);
    size_t hi = lo + 1 < n ? lo + 1 : lo;
    double frac = rank - (double)lo;
    return v[lo] + (v[hi] - v[lo]) * frac;
}

int kvr_bench_samples_add(kvr_bench_samples *s, double x)
{
    if (isnan(x))
        return 0;
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 256;
        double *nv = realloc(s->v, nc * sizeof(*nv));
        if (!nv)
            return -1;
        s->v = nv;
        s->cap = nc;
    }
    s->v[s->n++] = x;
    s->sorted = false;
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double kvr_bench_samples_pct(kvr_bench_samples *s, double q)
{
    if (!s->sorted && s->n) {
        qsort(s->v, s->n, sizeof(*s->v), cmp_double);
        s->sorted = true;
    }
    return kvr_bench_percentile_sorted(s->v, s->n, q);
}

double kvr_bench_samples_mean(const kvr_bench_samples *s)
{
    if (!s->n)
        return NAN;
    double sum = 0;
    for (size_t i = 0; i < s->n; i++)
        sum += s->v[i];
    return sum / (double)s->n;
}

void kvr_bench_samples_free(kvr_bench_samples *s)
{
    free(s->v);
    memset(s, 0, sizeof(*s));
}

void kvr_bench_gauge_add(kvr_bench_gauge *g, int64_t delta, uint64_t now_ns)
{
    if (g->last_ns && now_ns > g->last_ns) {
        g->area += (double)g->cur * (double)(now_ns - g->last_ns) / 1e9;
        if (g->cur > 0)
            g->busy += (double)(now_ns - g->last_ns) / 1e9;
    }
    if (!g->last_ns || now_ns > g->last_ns)
        g->last_ns = now_ns;
    g->cur += delta;
    if (g->cur > g->max)
        g->max = g->cur;
}

double kvr_bench_gauge_mean(const kvr_bench_gauge *g, uint64_t start_ns, uint64_t end_ns)
{
    if (end_ns <= start_ns)
        return 0;
    double area = g->area;
    if (g->last_ns && end_ns > g->last_ns)
        area += (double)g->cur * (double)(end_ns - g->last_ns) / 1e9;
    return area / ((double)(end_ns - start_ns) / 1e9);
}

double kvr_bench_gauge_busy_until(const kvr_bench_gauge *g, uint64_t now_ns)
{
    double b = g->busy;
    if (g->last_ns && g->cur > 0 && now_ns > g->last_ns)
        b += (double)(now_ns - g->last_ns) / 1e9;
    return b;
}

int kvr_bench_tally_index(kvr_bench_tally *t, const char *name)
{
    for (size_t i = 0; i < t->n; i++)
        if (strcmp(t->names[i], name) == 0)
            return (int)i;
    if (t->n == t->cap) {
        size_t nc = t->cap ? t->cap * 2 : 8;
        char **nn = realloc(t->names, nc * sizeof(*nn));
        if (!nn)
            return -1;
        t->names = nn;
        uint64_t *nct = realloc(t->counts, nc * sizeof(*nct));
        if (!nct)
            return -1;
        t->counts = nct;
        t->cap = nc;
    }
    char *copy = strdup(name);
    if (!copy)
        return -1;
    t->names[t->n] = copy;
    t->counts[t->n] = 0;
    return (int)t->n++;
}

int kvr_bench_tally_add(kvr_bench_tally *t, const char *name, uint64_t by)
{
    int i = kvr_bench_tally_index(t, name);
    if (i >= 0)
        t->counts[i] += by;
    return i;
}

uint64_t kvr_bench_tally_total(const kvr_bench_tally *t)
{
    uint64_t s = 0;
    for (size_t i = 0; i < t->n; i++)
        s += t->counts[i];
    return s;
}

void kvr_bench_tally_free(kvr_bench_tally *t)
{
    for (size_t i = 0; i < t->n; i++)
        free(t->names[i]);
    free(t->names);
    free(t->counts);
    memset(t, 0, sizeof(*t));
}

double kvr_bench_ratio(double num, double den)
{
    return den == 0 ? NAN : num / den;
}
