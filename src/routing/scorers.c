/* The pipeline policy's scorers (see scorers.h). */
#include "routing/scorers.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const names[KVR_NSCORERS] = {"prefix",   "session", "load",   "queue",
                                                "kv_usage", "weight",  "lmcache"};

const char *kvr_scorer_name(int s)
{
    return s >= 0 && s < KVR_NSCORERS ? names[s] : "?";
}

int kvr_scorer_find(const char *name, size_t len)
{
    for (int s = 0; s < KVR_NSCORERS; s++)
        if (strlen(names[s]) == len && memcmp(names[s], name, len) == 0)
            return s;
    return -1;
}

void kvr_scorers_default(double *w)
{
    memset(w, 0, KVR_NSCORERS * sizeof(*w));
    w[KVR_SCORER_PREFIX] = 3;
    w[KVR_SCORER_SESSION] = 4;
    w[KVR_SCORER_LOAD] = 2;
    w[KVR_SCORER_KV_USAGE] = 1;
    w[KVR_SCORER_WEIGHT] = 1;
}

int kvr_scorers_parse(const char *list, double *weights, int replace, char *err, size_t cap)
{
    double w[KVR_NSCORERS];
    if (replace)
        memset(w, 0, sizeof(w));
    else
        memcpy(w, weights, sizeof(w));
    const char *p = list;
    while (*p) {
        size_t len = strcspn(p, ",");
        const char *eq = memchr(p, '=', len);
        int s = eq ? kvr_scorer_find(p, (size_t)(eq - p)) : -1;
        if (s < 0) {
            snprintf(err, cap, "'%.*s': expected NAME=WEIGHT with NAME one of prefix, session, "
                     "load, queue, kv_usage, weight, lmcache", (int)len, p);
            return -1;
        }
        char num[64], *end = NULL;
        size_t nl = len - (size_t)(eq + 1 - p);
        if (nl == 0 || nl >= sizeof(num)) {
            snprintf(err, cap, "%s: bad weight '%.*s'", names[s], (int)nl, eq + 1);
            return -1;
        }
        memcpy(num, eq + 1, nl);
        num[nl] = '\0';
        errno = 0;
        double v = strtod(num, &end);
        if (*end || errno || !isfinite(v) || v < 0 || v > 1e6) {
            snprintf(err, cap, "%s: bad weight '%s' (expected a number 0..1e6)", names[s], num);
            return -1;
        }
        w[s] = v;
        p += len;
        if (*p == ',' && !*++p) {
            snprintf(err, cap, "trailing ','");
            return -1;
        }
    }
    memcpy(weights, w, sizeof(w));
    return 0;
}

void kvr_scorers_format(const double *w, char *out, size_t cap)
{
    size_t at = 0;
    out[0] = '\0';
    for (int s = 0; s < KVR_NSCORERS && at < cap; s++)
        if (w[s] != 0) {
            int n = snprintf(out + at, cap - at, "%s%s=%g", at ? "," : "", names[s], w[s]);
            at += n > 0 ? (size_t)n : 0;
        }
    if (!out[0])
        snprintf(out, cap, "none");
}

static double clamp01(double x)
{
    return x < 0 ? 0 : x > 1 ? 1 : x;
}

/* Whether worker `w`'s value of scorer `s` is unknown (then neutral), for the scraped and polled
 * scorers. */
static int unknown(const kvr_worker *w, int s, uint64_t now_ms)
{
    switch (s) {
    case KVR_SCORER_QUEUE: return w->queue < 0;
    case KVR_SCORER_KV_USAGE: return w->kv_usage < 0;
    default: return kvr_worker_lmcache(w, now_ms) == KVR_LMCACHE_NEUTRAL;
    }
}

/* Gives the workers without a known value of scorer `s` the mean of those with one (an answer
 * "unavailable" is not one), or `none` when no worker has one: an unknown is neither a
 * favourite nor excluded. */
static void neutral(kvr_worker *const *el, size_t n, int s, uint64_t now_ms,
                    double (*v)[KVR_NSCORERS], double none)
{
    double sum = 0;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (!unknown(el[i], s, now_ms) &&
            (s != KVR_SCORER_LMCACHE ||
             kvr_worker_lmcache(el[i], now_ms) == KVR_LMCACHE_AVAILABLE)) {
            sum += v[i][s];
            k++;
        }
    for (size_t i = 0; i < n; i++)
        if (unknown(el[i], s, now_ms))
            v[i][s] = k ? sum / (double)k : none;
}

void kvr_scorers_eval(kvr_worker *const *el, size_t n, const double *weights, const double *ratio,
                      int session_idx, uint64_t now_ms, double (*v)[KVR_NSCORERS])
{
    double max_rel = 0, max_w = 0, qmin = HUGE_VAL, qmax = -HUGE_VAL;
    for (size_t i = 0; i < n; i++) {
        double wt = weights ? weights[i] : 1;
        double rel = (double)(kvr_worker_load(el[i]) > 0 ? kvr_worker_load(el[i]) : 0) / wt;
        max_rel = rel > max_rel ? rel : max_rel;
        max_w = wt > max_w ? wt : max_w;
        if (el[i]->queue >= 0) {
            qmin = el[i]->queue < qmin ? el[i]->queue : qmin;
            qmax = el[i]->queue > qmax ? el[i]->queue : qmax;
        }
    }
    for (size_t i = 0; i < n; i++) {
        const kvr_worker *w = el[i];
        double wt = weights ? weights[i] : 1;
        double rel = (double)(kvr_worker_load(w) > 0 ? kvr_worker_load(w) : 0) / wt;
        v[i][KVR_SCORER_PREFIX] = ratio ? clamp01(ratio[i]) : 0;
        v[i][KVR_SCORER_SESSION] = (int)i == session_idx;
        v[i][KVR_SCORER_LOAD] = max_rel > 0 ? 1 - rel / max_rel : 1;
        v[i][KVR_SCORER_WEIGHT] = max_w > 0 ? wt / max_w : 1;
        v[i][KVR_SCORER_QUEUE] = qmax > qmin ? (qmax - w->queue) / (qmax - qmin) : 1;
        v[i][KVR_SCORER_KV_USAGE] = 1 - clamp01(w->kv_usage);
        /* A cache that said it is unavailable ranks below every other, known or not. */
        v[i][KVR_SCORER_LMCACHE] =
            kvr_worker_lmcache(w, now_ms) == KVR_LMCACHE_UNAVAILABLE ? 0
                                                                     : 1 - clamp01(w->lmcache_occupancy);
    }
    neutral(el, n, KVR_SCORER_QUEUE, now_ms, v, 1);
    neutral(el, n, KVR_SCORER_KV_USAGE, now_ms, v, 1);
    neutral(el, n, KVR_SCORER_LMCACHE, now_ms, v, 0.5);
}

double kvr_scorers_sum(const double *values, const double *weights)
{
    double sum = 0;
    for (int s = 0; s < KVR_NSCORERS; s++)
        sum += values[s] * weights[s];
    return sum;
}
