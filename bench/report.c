/* Summary, table and JSON of a replay. */
#include "report.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

double kvr_bench_record_itl(const kvr_bench_record *r)
{
    if (r->error >= 0 || isnan(r->ttft_s) || r->completion_tokens < 2)
        return NAN;
    double d = (r->e2e_s - r->ttft_s) / (double)(r->completion_tokens - 1);
    return d < 0 ? 0 : d;
}

/* Fills everything but the worker rows from records [from, to). */
static int summarize_records(const kvr_bench_run *run, size_t from, size_t to, double wall_s,
                             kvr_bench_summary *s)
{
    double k = run->model_per_wall > 0 ? run->model_per_wall : 1.0;
    s->requests = to - from;
    s->error_kinds = &run->errors;
    s->decisions = &run->decisions;
    s->wall_s = wall_s;
    s->elapsed_s = wall_s * k;
    s->interrupted = run->interrupted;
    s->slo_ttft_s = run->slo_ttft_s;
    s->slo_itl_s = run->slo_itl_s;
    kvr_bench_samples ttft = {0}, e2e = {0}, itl = {0};
    int rc = 0;
    for (size_t i = from; i < to; i++) {
        const kvr_bench_record *r = &run->records[i];
        if (r->session_header)
            s->session_header++;
        if (r->bypassed)
            s->bypassed++;
        if (r->prompt_tokens >= 0) {
            s->with_usage++;
            s->prompt_tokens += r->prompt_tokens;
            s->cached_tokens += r->cached_tokens > 0 ? r->cached_tokens : 0;
            s->completion_tokens += r->completion_tokens > 0 ? r->completion_tokens : 0;
            if (r->bypassed) {
                s->bypassed_prompt_tokens += r->prompt_tokens;
                s->bypassed_cached_tokens += r->cached_tokens > 0 ? r->cached_tokens : 0;
            }
        }
        if (r->error >= 0) {
            s->errors++;
            continue;
        }
        s->ok++;
        double it = kvr_bench_record_itl(r);
        if (!isnan(r->ttft_s) && r->ttft_s * k <= run->slo_ttft_s &&
            (isnan(it) || it * k <= run->slo_itl_s))
            s->good++;
        if (kvr_bench_samples_add(&ttft, r->ttft_s * k) < 0 ||
            kvr_bench_samples_add(&e2e, r->e2e_s * k) < 0 || kvr_bench_samples_add(&itl, it * k) < 0)
            rc = -1;
    }
    double first = INFINITY, last = -INFINITY, end = -INFINITY;
    for (size_t i = from; i < to; i++) {
        const kvr_bench_record *r = &run->records[i];
        first = r->start_s < first ? r->start_s : first;
        last = r->start_s > last ? r->start_s : last;
        if (r->error < 0 && r->start_s + r->e2e_s > end)
            end = r->start_s + r->e2e_s;
    }
    s->offered_rps = to - from >= 2 && last > first ? (double)(to - from) / ((last - first) * k) : NAN;
    s->achieved_rps = s->ok && end > first ? (double)s->ok / ((end - first) * k) : NAN;
    s->goodput = kvr_bench_ratio((double)s->good, (double)s->requests);
    s->hit_rate = kvr_bench_ratio((double)s->cached_tokens, (double)s->prompt_tokens);
    s->ttft_p50 = kvr_bench_samples_pct(&ttft, 50);
    s->ttft_p90 = kvr_bench_samples_pct(&ttft, 90);
    s->ttft_p99 = kvr_bench_samples_pct(&ttft, 99);
    s->e2e_p50 = kvr_bench_samples_pct(&e2e, 50);
    s->e2e_p99 = kvr_bench_samples_pct(&e2e, 99);
    s->itl_p50 = kvr_bench_samples_pct(&itl, 50);
    s->itl_p90 = kvr_bench_samples_pct(&itl, 90);
    kvr_bench_samples_free(&ttft);
    kvr_bench_samples_free(&e2e);
    kvr_bench_samples_free(&itl);
    s->output_tok_s = s->elapsed_s > 0 ? (double)s->completion_tokens / s->elapsed_s : NAN;
    s->requests_s = s->elapsed_s > 0 ? (double)s->requests / s->elapsed_s : NAN;
    return rc;
}

static void load_ratio(kvr_bench_summary *s)
{
    uint64_t total = 0, max = 0;
    for (size_t i = 0; i < s->nworkers; i++) {
        total += s->workers[i].requests;
        if (s->workers[i].requests > max)
            max = s->workers[i].requests;
    }
    for (size_t i = 0; i < s->nworkers; i++)
        s->workers[i].share = kvr_bench_ratio((double)s->workers[i].requests, (double)total);
    s->load_max_over_mean =
        s->nworkers ? kvr_bench_ratio((double)max, (double)total / (double)s->nworkers) : NAN;
}

int kvr_bench_summarize(const kvr_bench_run *run, kvr_bench_summary *s)
{
    memset(s, 0, sizeof(*s));
    s->planned = run->planned;
    int rc = summarize_records(run, 0, run->nrecords, run->elapsed_s, s);
    s->nworkers = run->workers.n;
    s->workers = calloc(s->nworkers ? s->nworkers : 1, sizeof(*s->workers));
    if (!s->workers)
        return -1;
    double span = (double)(run->end_ns - run->start_ns) / 1e9;
    for (size_t i = 0; i < s->nworkers; i++) {
        kvr_bench_worker_row *w = &s->workers[i];
        w->name = run->workers.names[i];
        w->requests = run->workers.counts[i];
        if (i < run->inflight_cap) {
            w->max_inflight = run->inflight[i].max;
            w->mean_inflight = kvr_bench_gauge_mean(&run->inflight[i], run->start_ns, run->end_ns);
            w->busy_share = span > 0 ? kvr_bench_gauge_busy_until(&run->inflight[i], run->end_ns) / span : 0;
        }
    }
    load_ratio(s);
    return rc;
}

int kvr_bench_summarize_window(const kvr_bench_run *run, const kvr_bench_window *w,
                               kvr_bench_summary *s)
{
    memset(s, 0, sizeof(*s));
    size_t to = w->to < run->nrecords ? w->to : run->nrecords, from = w->from < to ? w->from : to;
    double span = w->end_ns > w->start_ns ? (double)(w->end_ns - w->start_ns) / 1e9 : 0;
    s->planned = to - from;
    int rc = summarize_records(run, from, to, span, s);
    s->nworkers = run->workers.n;
    s->workers = calloc(s->nworkers ? s->nworkers : 1, sizeof(*s->workers));
    if (!s->workers)
        return -1;
    for (size_t i = 0; i < s->nworkers; i++) {
        kvr_bench_worker_row *row = &s->workers[i];
        row->name = run->workers.names[i];
        if (i < run->inflight_cap && span > 0) {
            double b0 = w->busy0 && i < w->nbusy0 ? w->busy0[i] : 0;
            row->busy_share = (kvr_bench_gauge_busy_until(&run->inflight[i], w->end_ns) - b0) / span;
        }
    }
    for (size_t i = from; i < to; i++)
        if (run->records[i].worker >= 0 && (size_t)run->records[i].worker < s->nworkers)
            s->workers[run->records[i].worker].requests++;
    load_ratio(s);
    return rc;
}

void kvr_bench_summary_free(kvr_bench_summary *s)
{
    free(s->workers);
    s->workers = NULL;
    s->nworkers = 0;
}

static void fmt_s(char *out, size_t n, double v)
{
    if (isnan(v))
        snprintf(out, n, "-");
    else if (v < 1)
        snprintf(out, n, "%.1f ms", v * 1e3);
    else
        snprintf(out, n, "%.2f s", v);
}

static void print_tally(FILE *f, const char *label, const kvr_bench_tally *t)
{
    fprintf(f, "  %-22s", label);
    if (!t->n)
        fprintf(f, "-");
    for (size_t i = 0; i < t->n; i++)
        fprintf(f, "%s%s %llu", i ? ", " : "", t->names[i], (unsigned long long)t->counts[i]);
    fputc('\n', f);
}

void kvr_bench_print_table(FILE *f, const char *title, const kvr_bench_summary *s)
{
    char a[32], b[32], c[32];
    fprintf(f, "%s%s\n", title, s->interrupted ? "  (INTERRUPTED)" : "");
    fprintf(f, "  (times in model seconds: wall time ÷ the time scale)\n");
    fprintf(f, "  %-22s%zu of %zu (%zu ok, %zu errors), %zu with x-session-id", "requests",
            s->requests, s->planned, s->ok, s->errors, s->session_header);
    if (s->bypassed)
        fprintf(f, ", %zu bypassed the router", s->bypassed);
    fputc('\n', f);
    print_tally(f, "errors by kind", s->error_kinds);
    fprintf(f, "  %-22s%lld\n", "prompt tokens", (long long)s->prompt_tokens);
    fprintf(f, "  %-22s%lld\n", "cached tokens", (long long)s->cached_tokens);
    fprintf(f, "  %-22s%lld\n", "uncached (prefilled)", (long long)(s->prompt_tokens - s->cached_tokens));
    if (isnan(s->hit_rate))
        fprintf(f, "  %-22s-\n", "hit rate");
    else
        fprintf(f, "  %-22s%.1f %%\n", "hit rate", s->hit_rate * 100);
    if (s->bypassed) {
        double routed = kvr_bench_ratio((double)(s->cached_tokens - s->bypassed_cached_tokens),
                                        (double)(s->prompt_tokens - s->bypassed_prompt_tokens));
        double byp = kvr_bench_ratio((double)s->bypassed_cached_tokens, (double)s->bypassed_prompt_tokens);
        char ra[16] = "-", ba[16] = "-";
        if (!isnan(routed))
            snprintf(ra, sizeof(ra), "%.1f %%", routed * 100);
        if (!isnan(byp))
            snprintf(ba, sizeof(ba), "%.1f %%", byp * 100);
        fprintf(f, "  %-22s%s routed, %s bypassed\n", "hit rate by path", ra, ba);
    }
    fmt_s(a, sizeof(a), s->ttft_p50);
    fmt_s(b, sizeof(b), s->ttft_p90);
    fmt_s(c, sizeof(c), s->ttft_p99);
    fprintf(f, "  %-22s%s / %s / %s\n", "TTFT p50/p90/p99", a, b, c);
    fmt_s(a, sizeof(a), s->e2e_p50);
    fmt_s(b, sizeof(b), s->e2e_p99);
    fprintf(f, "  %-22s%s / %s\n", "E2E p50/p99", a, b);
    fmt_s(a, sizeof(a), s->itl_p50);
    fmt_s(b, sizeof(b), s->itl_p90);
    fprintf(f, "  %-22s%s / %s\n", "ITL p50/p90", a, b);
    if (isnan(s->goodput))
        fprintf(f, "  %-22s-\n", "goodput");
    else
        fprintf(f, "  %-22s%.1f %% (TTFT ≤ %g ms, ITL ≤ %g ms)\n", "goodput", s->goodput * 100,
                s->slo_ttft_s * 1e3, s->slo_itl_s * 1e3);
    fprintf(f, "  %-22s%.1f (%.2f req/s over %.1f s; %.1f s of wall time)\n", "output tokens/s",
            s->output_tok_s, s->requests_s, s->elapsed_s, s->wall_s);
    fprintf(f, "  %-40s %9s %7s %13s %14s %6s\n", "worker", "requests", "share", "max in-flight",
            "mean in-flight", "busy");
    for (size_t i = 0; i < s->nworkers; i++) {
        const kvr_bench_worker_row *w = &s->workers[i];
        fprintf(f, "  %-40.40s %9llu %6.1f%% %13lld %14.2f %5.1f%%\n", w->name,
                (unsigned long long)w->requests, w->share * 100, (long long)w->max_inflight,
                w->mean_inflight, w->busy_share * 100);
    }
    if (s->nworkers > 1)
        fprintf(f, "  %-22s%.2f\n", "load max/mean", s->load_max_over_mean);
    print_tally(f, "decisions", s->decisions);
}

static json_t *num(double v)
{
    return isnan(v) || isinf(v) ? json_null() : json_real(v);
}

static json_t *tally_json(const kvr_bench_tally *t)
{
    json_t *o = json_object();
    for (size_t i = 0; o && i < t->n; i++)
        json_object_set_new(o, t->names[i], json_integer((json_int_t)t->counts[i]));
    return o;
}

json_t *kvr_bench_summary_json(const kvr_bench_summary *s, json_t *meta)
{
    json_t *workers = json_object();
    for (size_t i = 0; workers && i < s->nworkers; i++) {
        const kvr_bench_worker_row *w = &s->workers[i];
        json_object_set_new(workers, w->name,
                            json_pack("{s:I,s:o,s:I,s:o,s:o}", "requests", (json_int_t)w->requests,
                                      "share", num(w->share), "max_inflight",
                                      (json_int_t)w->max_inflight, "mean_inflight",
                                      num(w->mean_inflight), "busy_share", num(w->busy_share)));
    }
    json_t *o = json_pack(
        "{s:I,s:I,s:I,s:I,s:o,s:I,s:I,s:I,s:I,s:I,s:o,s:{s:o,s:o,s:o},s:{s:o,s:o},s:o,s:o,s:o,"
        "s:o,s:o,s:o,s:b}",
        "planned", (json_int_t)s->planned, "requests", (json_int_t)s->requests, "ok",
        (json_int_t)s->ok, "errors", (json_int_t)s->errors, "errors_by_kind",
        tally_json(s->error_kinds), "with_usage", (json_int_t)s->with_usage,
        "session_header_requests", (json_int_t)s->session_header, "prompt_tokens",
        (json_int_t)s->prompt_tokens, "cached_tokens", (json_int_t)s->cached_tokens,
        "completion_tokens", (json_int_t)s->completion_tokens, "hit_rate", num(s->hit_rate),
        "ttft_s", "p50", num(s->ttft_p50), "p90", num(s->ttft_p90), "p99", num(s->ttft_p99),
        "e2e_s", "p50", num(s->e2e_p50), "p99", num(s->e2e_p99), "output_tokens_per_s",
        num(s->output_tok_s), "requests_per_s", num(s->requests_s), "elapsed_s",
        num(s->elapsed_s), "workers", workers ? workers : json_object(), "load_max_over_mean",
        num(s->load_max_over_mean), "decisions", tally_json(s->decisions), "interrupted",
        s->interrupted);
    if (o) {
        json_object_set_new(o, "itl_s", json_pack("{s:o,s:o}", "p50", num(s->itl_p50), "p90",
                                                  num(s->itl_p90)));
        json_object_set_new(o, "goodput", num(s->goodput));
        json_object_set_new(o, "slo", json_pack("{s:o,s:o}", "ttft_s", num(s->slo_ttft_s), "itl_s",
                                                num(s->slo_itl_s)));
        json_object_set_new(o, "wall_s", num(s->wall_s));
        json_object_set_new(o, "bypassed_requests", json_integer((json_int_t)s->bypassed));
        json_object_set_new(o, "bypassed_prompt_tokens", json_integer((json_int_t)s->bypassed_prompt_tokens));
        json_object_set_new(o, "bypassed_cached_tokens", json_integer((json_int_t)s->bypassed_cached_tokens));
        json_object_set_new(o, "routed_hit_rate",
                            num(kvr_bench_ratio((double)(s->cached_tokens - s->bypassed_cached_tokens),
                                                (double)(s->prompt_tokens - s->bypassed_prompt_tokens))));
        json_object_set_new(o, "bypassed_hit_rate",
                            num(kvr_bench_ratio((double)s->bypassed_cached_tokens,
                                                (double)s->bypassed_prompt_tokens)));
    }
    if (o && meta)
        json_object_set_new(o, "config", meta);
    else if (meta)
        json_decref(meta);
    return o;
}

int kvr_bench_write_records(const char *path, const kvr_bench_trace *t, const kvr_bench_run *run)
{
    double k = run->model_per_wall > 0 ? run->model_per_wall : 1.0;
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    for (size_t i = 0; i < run->nrecords; i++) {
        const kvr_bench_record *r = &run->records[i];
        json_t *o = json_pack(
            "{s:s,s:i,s:i,s:s?,s:s?,s:s?,s:b,s:b,s:o,s:o,s:o,s:I,s:I,s:I}", "session",
            t->sessions[r->session].name, "turn", (int)r->turn, "status", r->status, "error",
            r->error >= 0 ? run->errors.names[r->error] : NULL, "worker",
            r->worker >= 0 ? run->workers.names[r->worker] : NULL, "decision",
            r->decision >= 0 ? run->decisions.names[r->decision] : NULL, "session_header",
            r->session_header, "bypassed", r->bypassed, "start_s", num(r->start_s * k), "ttft_s",
            num(r->ttft_s * k), "e2e_s", num(r->e2e_s * k), "prompt_tokens", (json_int_t)r->prompt_tokens, "cached_tokens",
            (json_int_t)r->cached_tokens, "completion_tokens", (json_int_t)r->completion_tokens);
        if (o && (r->copy || r->pass)) {
            json_object_set_new(o, "pass", json_integer(r->pass));
            json_object_set_new(o, "copy", json_integer(r->copy));
        }
        if (o) {
            json_dumpf(o, f, JSON_COMPACT);
            fputc('\n', f);
            json_decref(o);
        }
    }
    return fclose(f) == 0 ? 0 : -1;
}
