/* Sweeps: each rate is one kvr_bench_replay() pass appended to one run, summarised over its
 * own records and time window. */
#include "sweep.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/time.h"

void kvr_bench_sweep_opts_defaults(kvr_bench_sweep_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->duration_s = 60;
    o->points = 6;
    o->start_rate = 0.5;
    o->max_probes = 10;
}

int kvr_bench_sweep_parse_rates(const char *s, double *out, size_t cap)
{
    size_t n = 0;
    const char *p = s;
    if (!s || !*s)
        return -1;
    for (;;) {
        char *end;
        errno = 0;
        double v = strtod(p, &end);
        if (end == p || errno || !isfinite(v) || !(v > 0) || n >= cap)
            return -1;
        out[n++] = v;
        if (*end == '\0')
            break;
        if (*end != ',')
            return -1;
        p = end + 1;
    }
    return (int)n;
}

void kvr_bench_sweep_auto_rates(double sat, size_t points, double *out)
{
    if (points < 2)
        points = 2;
    for (size_t i = 0; i < points; i++)
        out[i] = sat * (0.1 + 1.1 * (double)i / (double)(points - 1));
}

bool kvr_bench_sweep_saturated(const kvr_bench_summary *s)
{
    if (s->requests == 0 || isnan(s->goodput))
        return true;
    return s->goodput < 0.9 || (double)s->errors > 0.05 * (double)s->requests;
}

/* One pass at `rate`: appends to `run`, summarises its window into `p`. */
static int pass(const kvr_bench_trace *t, const kvr_bench_config *base, double rate,
                double duration_s, uint32_t pass_no, kvr_bench_run *run,
                kvr_bench_sweep_point *p, char *err, size_t errlen)
{
    kvr_bench_config c = *base;
    c.mode = KVR_BENCH_MODE_RATE;
    c.rate = rate;
    double want = ceil(rate * duration_s);
    c.sessions = want < 2 ? 2 : want > KVR_BENCH_SWEEP_MAX_SESSIONS ? KVR_BENCH_SWEEP_MAX_SESSIONS : (size_t)want;
    c.pass = pass_no;
    c.append = pass_no > 1;
    if (!c.append)
        memset(run, 0, sizeof(*run));
    size_t nb = run->inflight_cap;
    double *busy0 = calloc(nb ? nb : 1, sizeof(*busy0));
    if (!busy0) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    uint64_t start = kvr_now_ns();
    for (size_t i = 0; i < nb; i++)
        busy0[i] = kvr_bench_gauge_busy_until(&run->inflight[i], start);
    size_t from = run->nrecords;
    if (c.progress)
        fprintf(stderr, "kvroute-bench: pass %u: %g sessions per model second, %zu sessions\n",
                pass_no, rate, c.sessions);
    int rc = kvr_bench_replay(t, &c, run, err, errlen);
    kvr_bench_window w = {.from = from, .to = run->nrecords, .start_ns = start,
                          .end_ns = kvr_now_ns(), .busy0 = busy0, .nbusy0 = nb};
    memset(p, 0, sizeof(*p));
    p->offered_rate = rate;
    p->sessions = c.sessions;
    if (rc == 0 && kvr_bench_summarize_window(run, &w, &p->s) < 0) {
        snprintf(err, errlen, "out of memory");
        rc = -1;
    }
    free(busy0);
    return rc;
}

static int push(kvr_bench_sweep_point **v, size_t *n, const kvr_bench_sweep_point *p)
{
    kvr_bench_sweep_point *nv = realloc(*v, (*n + 1) * sizeof(**v));
    if (!nv)
        return -1;
    nv[(*n)++] = *p;
    *v = nv;
    return 0;
}

/* The ramp: doubling from start_rate until a pass is saturated (halving first when the
 * start already is), then two passes bisecting (geometrically) between the last good and the
 * first saturated rate. Sets res->saturation_rate to the highest good rate (NAN if none). */
static int ramp(const kvr_bench_trace *t, const kvr_bench_config *base,
                const kvr_bench_sweep_opts *o, kvr_bench_run *run, kvr_bench_sweep_result *res,
                uint32_t *pass_no, char *err, size_t errlen)
{
    double rate = o->start_rate, good = NAN, bad = NAN;
    res->saturation_rate = NAN;
    while (res->nprobes < o->max_probes && !(base->stop && *base->stop)) {
        kvr_bench_sweep_point p;
        if (pass(t, base, rate, o->duration_s, ++*pass_no, run, &p, err, errlen) < 0)
            return -1;
        bool sat = kvr_bench_sweep_saturated(&p.s);
        if (push(&res->probes, &res->nprobes, &p) < 0) {
            kvr_bench_summary_free(&p.s);
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        if (run->interrupted)
            break;
        if (sat) {
            bad = rate;
            if (!isnan(good))
                break;
            rate /= 2;
        } else {
            good = rate;
            if (!isnan(bad))
                break;
            rate *= 2;
        }
    }
    for (int refine = 0; refine < 2 && !isnan(good) && !isnan(bad) &&
                         res->nprobes < o->max_probes && !run->interrupted &&
                         !(base->stop && *base->stop);
         refine++) {
        double mid = sqrt(good * bad);
        kvr_bench_sweep_point p;
        if (pass(t, base, mid, o->duration_s, ++*pass_no, run, &p, err, errlen) < 0)
            return -1;
        bool sat = kvr_bench_sweep_saturated(&p.s);
        if (push(&res->probes, &res->nprobes, &p) < 0) {
            kvr_bench_summary_free(&p.s);
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        if (sat)
            bad = mid;
        else
            good = mid;
    }
    res->saturation_rate = good;
    return 0;
}

int kvr_bench_sweep_run(const kvr_bench_trace *t, const kvr_bench_config *base,
                        const kvr_bench_sweep_opts *o, kvr_bench_run *run,
                        kvr_bench_sweep_result *res, char *err, size_t errlen)
{
    memset(res, 0, sizeof(*res));
    memset(run, 0, sizeof(*run));
    res->saturation_rate = NAN;
    double rates[KVR_BENCH_SWEEP_MAX_RATES];
    size_t nrates = 0;
    uint32_t pass_no = 0;
    if (!(o->duration_s > 0)) {
        snprintf(err, errlen, "the sweep duration must be positive");
        return -1;
    }
    if (o->automatic) {
        if (o->points < 2 || o->points > KVR_BENCH_SWEEP_MAX_RATES || o->max_probes < 2 ||
            !(o->start_rate > 0)) {
            snprintf(err, errlen, "bad automatic sweep settings");
            return -1;
        }
        if (ramp(t, base, o, run, res, &pass_no, err, errlen) < 0)
            return -1;
        if (isnan(res->saturation_rate)) {
            if (!run->interrupted)
                fprintf(stderr, "kvroute-bench: the ramp found no rate meeting the SLO (down to "
                                "%g sessions/s); no sweep\n",
                        res->nprobes ? res->probes[res->nprobes - 1].offered_rate : o->start_rate);
            return 0;
        }
        fprintf(stderr, "kvroute-bench: saturation at about %g sessions per model second\n",
                res->saturation_rate);
        nrates = o->points;
        kvr_bench_sweep_auto_rates(res->saturation_rate, nrates, rates);
    } else {
        if (o->nrates < 1 || o->nrates > KVR_BENCH_SWEEP_MAX_RATES) {
            snprintf(err, errlen, "a sweep needs 1 to %d rates", KVR_BENCH_SWEEP_MAX_RATES);
            return -1;
        }
        nrates = o->nrates;
        memcpy(rates, o->rates, nrates * sizeof(*rates));
    }
    for (size_t i = 0; i < nrates && !run->interrupted && !(base->stop && *base->stop); i++) {
        kvr_bench_sweep_point p;
        if (pass(t, base, rates[i], o->duration_s, ++pass_no, run, &p, err, errlen) < 0)
            return -1;
        if (push(&res->points, &res->npoints, &p) < 0) {
            kvr_bench_summary_free(&p.s);
            snprintf(err, errlen, "out of memory");
            return -1;
        }
    }
    return 0;
}

void kvr_bench_sweep_result_free(kvr_bench_sweep_result *res)
{
    for (size_t i = 0; i < res->npoints; i++)
        kvr_bench_summary_free(&res->points[i].s);
    for (size_t i = 0; i < res->nprobes; i++)
        kvr_bench_summary_free(&res->probes[i].s);
    free(res->points);
    free(res->probes);
    memset(res, 0, sizeof(*res));
}

static json_t *num(double v)
{
    return isnan(v) || isinf(v) ? json_null() : json_real(v);
}

json_t *kvr_bench_sweep_point_json(const kvr_bench_sweep_point *p)
{
    const kvr_bench_summary *s = &p->s;
    json_t *workers = json_object();
    for (size_t i = 0; workers && i < s->nworkers; i++)
        json_object_set_new(workers, s->workers[i].name,
                            json_pack("{s:I,s:o}", "requests", (json_int_t)s->workers[i].requests,
                                      "busy_share", num(s->workers[i].busy_share)));
    return json_pack(
        "{s:o,s:o,s:o,s:I,s:I,s:I,s:I,s:{s:o,s:o,s:o},s:{s:o,s:o},s:{s:o,s:o},s:o,s:o,s:o,s:o,"
        "s:o}",
        "offered_rate", num(p->offered_rate), "offered_rps", num(s->offered_rps), "achieved_rps",
        num(s->achieved_rps), "sessions",
        (json_int_t)p->sessions, "requests", (json_int_t)s->requests, "ok", (json_int_t)s->ok,
        "errors", (json_int_t)s->errors, "ttft_s", "p50", num(s->ttft_p50), "p90",
        num(s->ttft_p90), "p99", num(s->ttft_p99), "itl_s", "p50", num(s->itl_p50), "p90",
        num(s->itl_p90), "e2e_s", "p50", num(s->e2e_p50), "p99", num(s->e2e_p99), "output_tps",
        num(s->output_tok_s), "goodput", num(s->goodput), "hit_rate", num(s->hit_rate),
        "elapsed_s", num(s->elapsed_s), "workers", workers ? workers : json_object());
}

json_t *kvr_bench_sweep_json(const kvr_bench_sweep_result *res)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < res->npoints; i++)
        if (json_array_append_new(a, kvr_bench_sweep_point_json(&res->points[i])) < 0) {
            json_decref(a);
            return NULL;
        }
    return a;
}

static void ms(char *out, size_t n, double v)
{
    if (isnan(v))
        snprintf(out, n, "-");
    else
        snprintf(out, n, "%.0f", v * 1e3);
}

static void rows(FILE *f, const kvr_bench_sweep_point *v, size_t n)
{
    fprintf(f, "  %10s %8s %8s %7s %7s %7s %6s %6s %7s %7s %9s %8s %6s %s\n", "sessions/s",
            "offered", "achieved", "TTFT50", "TTFT90", "TTFT99", "ITL50", "ITL90", "E2E50",
            "E2E99", "output", "goodput", "errors", "busy per worker");
    fprintf(f, "  %10s %8s %8s %7s %7s %7s %6s %6s %7s %7s %9s %8s %6s\n", "", "req/s", "req/s",
            "ms", "ms", "ms", "ms", "ms", "ms", "ms", "tok/s", "", "");
    for (size_t i = 0; i < n; i++) {
        const kvr_bench_summary *s = &v[i].s;
        char a[6][24];
        ms(a[0], 24, s->ttft_p50);
        ms(a[1], 24, s->ttft_p90);
        ms(a[2], 24, s->ttft_p99);
        ms(a[3], 24, s->itl_p50);
        ms(a[4], 24, s->itl_p90);
        ms(a[5], 24, s->e2e_p50);
        char e99[24];
        ms(e99, sizeof(e99), s->e2e_p99);
        fprintf(f, "  %10.3g %8.2f %8.2f %7s %7s %7s %6s %6s %7s %7s %9.1f %7.1f%% %6zu ",
                v[i].offered_rate, isnan(s->offered_rps) ? 0.0 : s->offered_rps,
                isnan(s->achieved_rps) ? 0.0 : s->achieved_rps, a[0], a[1], a[2], a[3],
                a[4], a[5], e99, isnan(s->output_tok_s) ? 0.0 : s->output_tok_s,
                isnan(s->goodput) ? 0.0 : s->goodput * 100, s->errors);
        for (size_t w = 0; w < s->nworkers; w++)
            fprintf(f, "%s%.0f%%", w ? " " : "", s->workers[w].busy_share * 100);
        fputc('\n', f);
    }
}

void kvr_bench_sweep_print(FILE *f, const kvr_bench_sweep_result *res)
{
    if (res->nprobes) {
        fprintf(f, "ramp (finding the rate where goodput falls below 90 %%):\n");
        rows(f, res->probes, res->nprobes);
        if (isnan(res->saturation_rate))
            fprintf(f, "  saturation: not found\n");
        else
            fprintf(f, "  saturation: %.4g sessions per model second\n", res->saturation_rate);
    }
    fprintf(f, "sweep (times in model ms; goodput: share of requests within the SLO):\n");
    rows(f, res->points, res->npoints);
}
