/* Recent samples and their quantiles (nearest rank). */
#include "obs/samples.h"

#include <math.h>
#include <stdlib.h>

struct kvr_samples {
    size_t cap, n, next; /* next: where the next sample goes */
    double *v;
    uint64_t *t;
};

kvr_samples *kvr_samples_new(size_t cap)
{
    kvr_samples *s = calloc(1, sizeof(*s));
    if (!s || cap == 0)
        return free(s), NULL;
    s->cap = cap;
    s->v = malloc(cap * sizeof(*s->v));
    s->t = malloc(cap * sizeof(*s->t));
    if (!s->v || !s->t) {
        kvr_samples_free(s);
        return NULL;
    }
    return s;
}

void kvr_samples_free(kvr_samples *s)
{
    if (!s)
        return;
    free(s->v);
    free(s->t);
    free(s);
}

void kvr_samples_add(kvr_samples *s, double v, uint64_t now_ms)
{
    if (!s || isnan(v))
        return;
    s->v[s->next] = v;
    s->t[s->next] = now_ms;
    s->next = (s->next + 1) % s->cap;
    if (s->n < s->cap)
        s->n++;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

long kvr_samples_quantiles(const kvr_samples *s, uint64_t since_ms, const double *q,
                           double *out, size_t n)
{
    if (!s || s->n == 0)
        return 0;
    double *tmp = malloc(s->n * sizeof(*tmp));
    if (!tmp)
        return -1;
    size_t k = 0;
    for (size_t i = 0; i < s->n; i++)
        if (s->t[i] >= since_ms)
            tmp[k++] = s->v[i];
    if (k) {
        qsort(tmp, k, sizeof(*tmp), cmp_double);
        for (size_t i = 0; i < n; i++) {
            double qi = q[i] < 0 ? 0 : q[i] > 1 ? 1 : q[i];
            size_t rank = (size_t)ceil(qi * (double)k); /* nearest rank, 1-based */
            out[i] = tmp[rank ? rank - 1 : 0];
        }
    }
    free(tmp);
    return (long)k;
}
