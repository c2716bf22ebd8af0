/* Unit tests for src/obs: the registry's exposition text, process metrics and the text-format
 * parser used to scrape vLLM. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "obs/metrics.h"

/* ---- helpers ------------------------------------------------------------------------------- */

static char *render(kvr_metrics *r)
{
    kvr_buf b;
    kvr_buf_init(&b, 0);
    assert_int_equal(kvr_metrics_render(r, &b), 0);
    if (!b.data)
        kvr_buf_puts(&b, "");
    return b.data; /* caller frees */
}

/* Parsed samples, flattened: name, labels as `k=v,k=v` in input order, value. */
typedef struct got {
    char name[128];
    char labels[1024];
    double value;
} got;

typedef struct gotlist {
    got *v;
    size_t n, cap;
} gotlist;

static void collect(void *ud, const kvr_prom_sample *s)
{
    gotlist *l = ud;
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 64;
        l->v = realloc(l->v, l->cap * sizeof(got));
        assert_non_null(l->v);
    }
    got *g = &l->v[l->n++];
    snprintf(g->name, sizeof(g->name), "%s", s->name);
    g->labels[0] = '\0';
    size_t off = 0;
    for (size_t i = 0; i < s->nlabels; i++) {
        int k = snprintf(g->labels + off, sizeof(g->labels) - off, "%s%s=%s", i ? "," : "",
                         s->label_names[i], s->label_values[i]);
        assert_true(k > 0 && (size_t)k < sizeof(g->labels) - off);
        off += (size_t)k;
    }
    g->value = s->value;
}

static const got *find(const gotlist *l, const char *name, const char *labels)
{
    for (size_t i = 0; i < l->n; i++)
        if (strcmp(l->v[i].name, name) == 0 && strcmp(l->v[i].labels, labels) == 0)
            return &l->v[i];
    return NULL;
}

static double value_of(const gotlist *l, const char *name, const char *labels)
{
    const got *g = find(l, name, labels);
    if (!g)
        fail_msg("sample %s{%s} missing", name, labels);
    return g->value;
}

static void counting_cb(void *ud, const kvr_prom_sample *s)
{
    /* Touch every byte the parser hands over so ASan sees any bad pointer. */
    size_t *sum = ud;
    *sum += strlen(s->name);
    for (size_t i = 0; i < s->nlabels; i++)
        *sum += strlen(s->label_names[i]) + strlen(s->label_values[i]);
}

/* ---- exposition ---------------------------------------------------------------------------- */

static void test_exposition_byte_exact(void **state)
{
    (void)state;
    kvr_metrics *r = kvr_metrics_new();
    const char *wl[] = {"worker", "model"};
    kvr_metric *req = kvr_metrics_counter(r, "kvroute_requests_total", "Requests routed.", 2, wl);
    kvr_metric *up = kvr_metrics_counter(r, "kvroute_restarts_total", "Restarts.", 0, NULL);
    kvr_metric *run = kvr_metrics_gauge(r, "vllm:num_requests_running",
                                        "Number of requests in model execution batches.", 1,
                                        (const char *[]){"model_name"});
    const double bounds[] = {0.005, 0.1, 1, 2.5};
    kvr_metric *ttft = kvr_metrics_histogram(r, "kvroute_ttft_seconds", "Time to first token.",
                                             1, (const char *[]){"worker"}, bounds, 4);
    kvr_metric *empty = kvr_metrics_gauge(r, "kvroute_empty", "No series yet.", 1,
                                          (const char *[]){"worker"});
    assert_non_null(req);
    assert_non_null(up);
    assert_non_null(run);
    assert_non_null(ttft);
    assert_non_null(empty);

    /* Series are created in this order: w2 first, so it must render first. */
    kvr_metric_inc(req, (const char *[]){"w2", "llama"}, 1);
    kvr_metric_inc(req, (const char *[]){"w1", "llama"}, 2);
    kvr_metric_inc(req, (const char *[]){"w2", "llama"}, 2);
    kvr_metric_set(run, (const char *[]){"m"}, 3);
    kvr_metric_set(run, (const char *[]){"n"}, 0.25);
    kvr_metric_observe(ttft, (const char *[]){"w1"}, 0.05);
    kvr_metric_observe(ttft, (const char *[]){"w1"}, 2);
    kvr_metric_observe(ttft, (const char *[]){"w1"}, 10);

    char *text = render(r);
    const char *want =
        "# HELP kvroute_requests_total Requests routed.\n"
        "# TYPE kvroute_requests_total counter\n"
        "kvroute_requests_total{worker=\"w2\",model=\"llama\"} 3\n"
        "kvroute_requests_total{worker=\"w1\",model=\"llama\"} 2\n"
        "# HELP kvroute_restarts_total Restarts.\n"
        "# TYPE kvroute_restarts_total counter\n"
        "kvroute_restarts_total 0\n"
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        "vllm:num_requests_running{model_name=\"m\"} 3\n"
        "vllm:num_requests_running{model_name=\"n\"} 0.25\n"
        "# HELP kvroute_ttft_seconds Time to first token.\n"
        "# TYPE kvroute_ttft_seconds histogram\n"
        "kvroute_ttft_seconds_bucket{worker=\"w1\",le=\"0.005\"} 0\n"
        "kvroute_ttft_seconds_bucket{worker=\"w1\",le=\"0.1\"} 1\n"
        "kvroute_ttft_seconds_bucket{worker=\"w1\",le=\"1\"} 1\n"
        "kvroute_ttft_seconds_bucket{worker=\"w1\",le=\"2.5\"} 2\n"
        "kvroute_ttft_seconds_bucket{worker=\"w1\",le=\"+Inf\"} 3\n"
        "kvroute_ttft_seconds_sum{worker=\"w1\"} 12.05\n"
        "kvroute_ttft_seconds_count{worker=\"w1\"} 3\n"
        "# HELP kvroute_empty No series yet.\n"
        "# TYPE kvroute_empty gauge\n";
    assert_string_equal(text, want);
    free(text);

    /* Rendering is repeatable and appends to what the buffer already holds. */
    kvr_buf b;
    kvr_buf_init(&b, 0);
    kvr_buf_puts(&b, "prefix\n");
    assert_int_equal(kvr_metrics_render(r, &b), 0);
    assert_memory_equal(b.data, "prefix\n", 7);
    assert_string_equal(b.data + 7, want);
    kvr_buf_free(&b);
    kvr_metrics_free(r);
}

static void test_unlabelled_histogram(void **state)
{
    (void)state;
    kvr_metrics *r = kvr_metrics_new();
    kvr_metric *h = kvr_metrics_histogram(r, "h", "", 0, NULL, (const double[]){1}, 1);
    char *text = render(r);
    assert_string_equal(text, "# HELP h \n"
                              "# TYPE h histogram\n"
                              "h_bucket{le=\"1\"} 0\n"
                              "h_bucket{le=\"+Inf\"} 0\n"
                              "h_sum 0\n"
                              "h_count 0\n");
    free(text);
    kvr_metric_observe(h, NULL, 0.5);
    assert_true(kvr_metric_get(h, NULL) == 1);
    kvr_metrics_free(r);
}

static void test_value_formatting(void **state)
{
    (void)state;
    kvr_metrics *r = kvr_metrics_new();
    kvr_metric *g = kvr_metrics_gauge(r, "g", "h", 1, (const char *[]){"k"});
    struct {
        const char *k;
        double v;
        const char *want;
    } cases[] = {
        {"int", 3, "3"},
        {"neg", -42, "-42"},
        {"big", 123456789012, "123456789012"},
        {"tenth", 0.1, "0.1"},
        {"third", 1.0 / 3, "0.3333333333333333"},
        {"huge", 1e20, "1e+20"},
        {"tiny", 1e-300, "1e-300"},
        {"nan", NAN, "NaN"},
        {"pinf", INFINITY, "+Inf"},
        {"ninf", -INFINITY, "-Inf"},
        {"zero", -0.0, "0"},
    };
    size_t n = sizeof(cases) / sizeof(cases[0]);
    for (size_t i = 0; i < n; i++)
        kvr_metric_set(g, (const char *[]){cases[i].k}, cases[i].v);
    char *text = render(r);
    for (size_t i = 0; i < n; i++) {
        char line[128];
        snprintf(line, sizeof(line), "\ng{k=\"%s\"} %s\n", cases[i].k, cases[i].want);
        if (!strstr(text, line))
            fail_msg("missing line %s in:\n%s", line + 1, text);
    }
    free(text);
    kvr_metrics_free(r);
}

static void test_label_escaping(void **state)
{
    (void)state;
    kvr_metrics *r = kvr_metrics_new();
    kvr_metric *g = kvr_metrics_gauge(r, "esc", "Help with \\ backslash,\nnewline and \"quotes\".",
                                      2, (const char *[]){"path", "empty"});
    kvr_metric_set(g, (const char *[]){"C:\\dir \"x\"\nnext", ""}, 1);
    kvr_metric_set(g, (const char *[]){"plain", NULL}, 2); /* NULL value counts as "" */
    char *text = render(r);
    assert_string_equal(text,
                        "# HELP esc Help with \\\\ backslash,\\nnewline and \"quotes\".\n"
                        "# TYPE esc gauge\n"
                        "esc{path=\"C:\\\\dir \\\"x\\\"\\nnext\",empty=\"\"} 1\n"
                        "esc{path=\"plain\",empty=\"\"} 2\n");

    /* And the parser reads the escaped value back to the original bytes. */
    gotlist l = {0};
    assert_int_equal(kvr_prom_parse(text, strlen(text), collect, &l), 2);
    assert_string_equal(l.v[0].labels, "path=C:\\dir \"x\"\nnext,empty=");
    assert_true(kvr_metric_get(g, (const char *[]){"plain", ""}) == 2);
    free(l.v);
    free(text);
    kvr_metrics_free(r);
}

/* ---- semantics ----------------------------------------------------------------------------- */

static void test_histogram_buckets(void **state)
{
    (void)state;
    kvr_metrics *r = kvr_metrics_new();
    const double bounds[] = {0.005, 0.1, 1, INFINITY}; /* trailing +Inf is dropped */
    kvr_metric *h = kvr_metrics_histogram(r, "lat", "Latency.", 1, (const char *[]){"w"}, bounds,
                                          4);
    assert_non_null(h);
    const double obs[] = {0.001, 0.005 /* le is inclusive */, 0.05, 0.5, 1, 5, 1e9};
    double sum = 0;
    for (size_t i = 0; i < sizeof(obs) / sizeof(obs[0]); i++) {
        kvr_metric_observe(h, (const char *[]){"a"}, obs[i]);
        sum += obs[i];
    }
    kvr_metric_observe(h, (const char *[]){"b"}, 0.2);
    assert_true(kvr_metric_get(h, (const char *[]){"a"}) == 7);
    assert_true(kvr_metric_get(h, (const char *[]){"b"}) == 1);

    char *text = render(r);
    gotlist l = {0};
    kvr_prom_parse(text, strlen(text), collect, &l);
    assert_true(value_of(&l, "lat_bucket", "w=a,le=0.005") == 2);
    assert_true(value_of(&l, "lat_bucket", "w=a,le=0.1") == 3);
    assert_true(value_of(&l, "lat_bucket", "w=a,le=1") == 5);
    assert_true(value_of(&l, "lat_bucket", "w=a,le=+Inf") == 7);
    assert_null(find(&l, "lat_bucket", "w=a,le=inf")); /* exactly one +Inf bucket */
    assert_true(value_of(&l, "lat_count", "w=a") == 7);
    assert_true(value_of(&l, "lat_sum", "w=a") == sum);
    assert_true(value_of(&l, "lat_bucket", "w=b,le=0.1") == 0);
    assert_true(value_of(&l, "lat_bucket", "w=b,le=1") == 1);
    assert_true(value_of(&l, "lat_bucket", "w=b,le=+Inf") == 1);
    /* Buckets never decrease along le, for every series. */
    double prev = -1;
    for (size_t i = 0; i < l.n; i++) {
        if (strcmp(l.v[i].name, "lat_bucket") != 0) {
            prev = -1;
            continue;
        }
        assert_true(l.v[i].value >= prev);
        prev = l.v[i].value;
    }
    size_t buckets = 0;
    for (size_t i = 0; i < l.n; i++)
        buckets += strcmp(l.v[i].name, "lat_bucket") == 0;
    assert_int_equal(buckets, 8); /* 3 bounds + +Inf, two series */
    free(l.v);
    free(text);
    kvr_metrics_free(r);
}

static void test_type_rules(void **state)
{
    (void)state;
    kvr_metrics *r = kvr_metrics_new();
    kvr_metric *c = kvr_metrics_counter(r, "c_total", "c", 0, NULL);
    kvr_metric *g = kvr_metrics_gauge(r, "g", "g", 0, NULL);
    kvr_metric *h = kvr_metrics_histogram(r, "h", "h", 0, NULL, NULL, 0);
    kvr_metric_inc(c, NULL, 2);
    kvr_metric_inc(c, NULL, -1);  /* counters only go up */
    kvr_metric_inc(c, NULL, NAN); /* ... and stay numbers */
    assert_true(kvr_metric_get(c, NULL) == 2);
    kvr_metric_set(c, NULL, 7.5); /* mirroring a total kept elsewhere */
    assert_true(kvr_metric_get(c, NULL) == 7.5);
    kvr_metric_observe(c, NULL, 1); /* wrong type: ignored */
    assert_true(kvr_metric_get(c, NULL) == 7.5);

    kvr_metric_inc(g, NULL, 5);
    kvr_metric_inc(g, NULL, -7);
    assert_true(kvr_metric_get(g, NULL) == -2);

    kvr_metric_inc(h, NULL, 5);
    kvr_metric_set(h, NULL, 5);
    assert_true(kvr_metric_get(h, NULL) == 0);
    kvr_metric_observe(h, NULL, NAN); /* no bounds: only +Inf */
    assert_true(kvr_metric_get(h, NULL) == 1);

    /* Absent series read as 0 and are not created by reading. */
    kvr_metric *lg = kvr_metrics_gauge(r, "lg", "lg", 1, (const char *[]){"k"});
    assert_true(kvr_metric_get(lg, (const char *[]){"nope"}) == 0);
    char *text = render(r);
    assert_null(strstr(text, "nope"));
    free(text);
    kvr_metrics_free(r);
}

static void test_registration_rules(void **state)
{
    (void)state;
    kvr_metrics *r = kvr_metrics_new();
    const char *wl[] = {"worker"};
    kvr_metric *a = kvr_metrics_counter(r, "a_total", "a", 1, wl);
    assert_non_null(a);
    /* Same shape again: the same family, not a duplicate in the output. */
    assert_ptr_equal(kvr_metrics_counter(r, "a_total", "other help", 1, wl), a);
    assert_ptr_equal(kvr_metrics_find(r, "a_total"), a);
    assert_null(kvr_metrics_find(r, "nope"));
    /* Clashes and invalid names are refused with NULL, and NULL is safe to use. */
    assert_null(kvr_metrics_gauge(r, "a_total", "a", 1, wl));
    assert_null(kvr_metrics_counter(r, "a_total", "a", 0, NULL));
    assert_null(kvr_metrics_counter(r, "9lives", "x", 0, NULL));
    assert_null(kvr_metrics_counter(r, "has-dash", "x", 0, NULL));
    assert_null(kvr_metrics_counter(r, "", "x", 0, NULL));
    assert_null(kvr_metrics_counter(r, "x", "x", 1, (const char *[]){"__reserved"}));
    assert_null(kvr_metrics_counter(r, "x", "x", 1, (const char *[]){"with:colon"}));
    assert_null(kvr_metrics_counter(r, "x", "x", 2, (const char *[]){"k", "k"}));
    assert_null(kvr_metrics_histogram(r, "x", "x", 1, (const char *[]){"le"}, NULL, 0));
    assert_null(kvr_metrics_histogram(r, "x", "x", 0, NULL, (const double[]){1, 1}, 2));
    assert_null(kvr_metrics_histogram(r, "x", "x", 0, NULL, (const double[]){2, 1}, 2));
    assert_null(kvr_metrics_histogram(r, "x", "x", 0, NULL, (const double[]){NAN}, 1));
    assert_non_null(kvr_metrics_gauge(r, "ns:sub:name_1", "colons are fine", 0, NULL));
    kvr_metric_inc(NULL, NULL, 1);
    kvr_metric_set(NULL, NULL, 1);
    kvr_metric_observe(NULL, NULL, 1);
    kvr_metric_remove_matching(NULL, "worker", "w");
    assert_true(kvr_metric_get(NULL, NULL) == 0);

    char *text = render(r);
    assert_string_equal(text, "# HELP a_total a\n"
                              "# TYPE a_total counter\n"
                              "# HELP ns:sub:name_1 colons are fine\n"
                              "# TYPE ns:sub:name_1 gauge\n"
                              "ns:sub:name_1 0\n");
    free(text);
    kvr_metrics_free(r);
}

static void test_remove_matching(void **state)
{
    (void)state;
    kvr_metrics *r = kvr_metrics_new();
    kvr_metric *m = kvr_metrics_gauge(r, "inflight", "In-flight requests.", 2,
                                      (const char *[]){"model", "worker"});
    kvr_metric_set(m, (const char *[]){"a", "w1"}, 1);
    kvr_metric_set(m, (const char *[]){"a", "w2"}, 2);
    kvr_metric_set(m, (const char *[]){"b", "w1"}, 3);
    kvr_metric_set(m, (const char *[]){"b", "w3"}, 4);

    kvr_metric_remove_matching(m, "worker", "w1");
    char *text = render(r);
    assert_string_equal(text, "# HELP inflight In-flight requests.\n"
                              "# TYPE inflight gauge\n"
                              "inflight{model=\"a\",worker=\"w2\"} 2\n"
                              "inflight{model=\"b\",worker=\"w3\"} 4\n");
    free(text);
    assert_true(kvr_metric_get(m, (const char *[]){"a", "w1"}) == 0);
    assert_true(kvr_metric_get(m, (const char *[]){"b", "w3"}) == 4);

    /* Unknown label or value: nothing happens. */
    kvr_metric_remove_matching(m, "zone", "w2");
    kvr_metric_remove_matching(m, "worker", "w9");
    assert_true(kvr_metric_get(m, (const char *[]){"a", "w2"}) == 2);

    /* A worker that comes back starts from zero, after the survivors. */
    kvr_metric_inc(m, (const char *[]){"a", "w1"}, 5);
    text = render(r);
    assert_non_null(strstr(text, "worker=\"w3\"} 4\ninflight{model=\"a\",worker=\"w1\"} 5\n"));
    free(text);
    kvr_metrics_free(r);
}

static void test_many_series_and_removal(void **state)
{
    (void)state;
    /* Enough series to grow the hash table several times, then remove half and check every
     * lookup still lands on the right series. */
    kvr_metrics *r = kvr_metrics_new();
    kvr_metric *m = kvr_metrics_counter(r, "hits_total", "h", 2,
                                        (const char *[]){"worker", "model"});
    enum { N = 5000 };
    char w[32], mo[32];
    for (int i = 0; i < N; i++) {
        snprintf(w, sizeof(w), "w%d", i % 100);
        snprintf(mo, sizeof(mo), "m%d", i);
        kvr_metric_inc(m, (const char *[]){w, mo}, i);
        kvr_metric_inc(m, (const char *[]){w, mo}, 1);
    }
    for (int i = 0; i < 100; i += 2) {
        snprintf(w, sizeof(w), "w%d", i);
        kvr_metric_remove_matching(m, "worker", w);
    }
    for (int i = 0; i < N; i++) {
        snprintf(w, sizeof(w), "w%d", i % 100);
        snprintf(mo, sizeof(mo), "m%d", i);
        double want = (i % 100) % 2 == 0 ? 0 : i + 1;
        assert_true(kvr_metric_get(m, (const char *[]){w, mo}) == want);
    }
    /* Joined-value ambiguity: ("ab","c") and ("a","bc") are different series. */
    kvr_metric_inc(m, (const char *[]){"ab", "c"}, 1);
    kvr_metric_inc(m, (const char *[]){"a", "bc"}, 2);
    assert_true(kvr_metric_get(m, (const char *[]){"ab", "c"}) == 1);
    assert_true(kvr_metric_get(m, (const char *[]){"a", "bc"}) == 2);

    char *text = render(r);
    gotlist l = {0};
    assert_int_equal(kvr_prom_parse(text, strlen(text), collect, &l), N / 2 + 2);
    free(l.v);
    free(text);
    kvr_metrics_free(r);
}

static int hook_calls;
static void hook_a(void *ud)
{
    hook_calls++;
    kvr_metric_set(ud, NULL, hook_calls * 10);
}
static void hook_b(void *ud)
{
    (void)ud;
    hook_calls *= 100; /* runs after hook_a: order is observable */
}

static void test_render_hook(void **state)
{
    (void)state;
    hook_calls = 0;
    kvr_metrics *r = kvr_metrics_new();
    kvr_metric *g = kvr_metrics_gauge(r, "queue_depth", "Refreshed at render.", 0, NULL);
    kvr_metrics_on_render(r, hook_a, g);
    char *text = render(r);
    assert_string_equal(text, "# HELP queue_depth Refreshed at render.\n"
                              "# TYPE queue_depth gauge\n"
                              "queue_depth 10\n");
    free(text);
    kvr_metrics_on_render(r, hook_b, NULL);
    text = render(r);
    assert_non_null(strstr(text, "\nqueue_depth 20\n"));
    assert_int_equal(hook_calls, 200);
    free(text);
    kvr_metrics_free(r);
}

static void test_render_respects_buffer_cap(void **state)
{
    (void)state;
    kvr_metrics *r = kvr_metrics_new();
    kvr_metric *g = kvr_metrics_gauge(r, "g", "g", 1, (const char *[]){"k"});
    for (int i = 0; i < 100; i++) {
        char k[16];
        snprintf(k, sizeof(k), "%d", i);
        kvr_metric_set(g, (const char *[]){k}, i);
    }
    kvr_buf b;
    kvr_buf_init(&b, 200);
    kvr_buf_puts(&b, "keep");
    assert_int_equal(kvr_metrics_render(r, &b), -1);
    assert_int_equal(b.len, 4);
    assert_string_equal(b.data, "keep");
    kvr_buf_free(&b);
    kvr_metrics_free(r);
}

static void test_process_metrics(void **state)
{
    (void)state;
    kvr_metrics *r = kvr_metrics_new();
    kvr_metrics_add_process(r);
    kvr_metrics_add_process(r); /* harmless twice */
    /* Burn a little CPU so the counter has something to show on a fast machine. */
    volatile double x = 0;
    for (int i = 0; i < 2000000; i++)
        x += i * 0.5;
    char *text = render(r);
    gotlist l = {0};
    assert_int_equal(kvr_prom_parse(text, strlen(text), collect, &l), 4);
    double rss = value_of(&l, "process_resident_memory_bytes", "");
    double fds = value_of(&l, "process_open_fds", "");
    double cpu = value_of(&l, "process_cpu_seconds_total", "");
    double start = value_of(&l, "process_start_time_seconds", "");
    assert_true(rss > 64 * 1024 && rss < 64.0 * 1024 * 1024 * 1024);
    assert_true(fds >= 3 && fds < 100000); /* stdin, stdout, stderr at least */
    assert_true(cpu >= 0 && cpu < 3600);
    double now = (double)time(NULL);
    assert_true(start > now - 3600 && start <= now + 2);
    assert_non_null(strstr(text, "# TYPE process_cpu_seconds_total counter\n"));
    assert_non_null(strstr(text, "# TYPE process_open_fds gauge\n"));

    /* Values are re-read at every render: opening fds shows up. */
    FILE *f[5];
    for (int i = 0; i < 5; i++)
        assert_non_null(f[i] = fopen("/proc/self/stat", "r"));
    free(text);
    free(l.v);
    l = (gotlist){0};
    text = render(r);
    kvr_prom_parse(text, strlen(text), collect, &l);
    assert_true(value_of(&l, "process_open_fds", "") == fds + 5);
    for (int i = 0; i < 5; i++)
        fclose(f[i]);
    free(l.v);
    free(text);
    kvr_metrics_free(r);
}

/* ---- parser -------------------------------------------------------------------------------- */

/* Shaped like vLLM 0.8's /metrics (Python prometheus_client output), trimmed. */
static const char vllm_sample[] =
    "# HELP python_gc_objects_collected_total Objects collected during gc\n"
    "# TYPE python_gc_objects_collected_total counter\n"
    "python_gc_objects_collected_total{generation=\"0\"} 12437.0\n"
    "python_gc_objects_collected_total{generation=\"1\"} 1392.0\n"
    "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
    "# TYPE process_resident_memory_bytes gauge\n"
    "process_resident_memory_bytes 2.147483648e+09\n"
    "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
    "# TYPE vllm:cache_config_info gauge\n"
    "vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",calculate_kv_scales=\"False\","
    "cpu_offload_gb=\"0\",enable_prefix_caching=\"True\",gpu_memory_utilization=\"0.9\","
    "is_attention_free=\"False\",num_cpu_blocks=\"None\",num_gpu_blocks=\"2000\","
    "num_gpu_blocks_override=\"None\",prefix_caching_hash_algo=\"builtin\","
    "sliding_window=\"None\",swap_space=\"4\",swap_space_bytes=\"4294967296\"} 1.0\n"
    "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
    "# TYPE vllm:num_requests_running gauge\n"
    "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0\n"
    "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
    "# TYPE vllm:num_requests_waiting gauge\n"
    "vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 0.0\n"
    "# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.\n"
    "# TYPE vllm:gpu_cache_usage_perc gauge\n"
    "vllm:gpu_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.4125\n"
    "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried "
    "tokens.\n"
    "# TYPE vllm:prefix_cache_queries_total counter\n"
    "vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} 1.5e3\n"
    "vllm:prefix_cache_queries_created{engine=\"0\",model_name=\"m\"} 1.7452198113386e+09\n"
    "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached "
    "tokens.\n"
    "# TYPE vllm:prefix_cache_hits_total counter\n"
    "vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} 640.0\n"
    "# HELP vllm:lora_requests_info Running stats on lora requests.\n"
    "# TYPE vllm:lora_requests_info gauge\n"
    "vllm:lora_requests_info{max_lora=\"1\",running_lora_adapters=\"\","
    "waiting_lora_adapters=\"\"} 1.7452198114e+09\n"
    "# HELP vllm:request_success_total Count of successfully processed requests.\n"
    "# TYPE vllm:request_success_total counter\n"
    "vllm:request_success_total{engine=\"0\",finished_reason=\"stop\",model_name=\"m\"} 40.0\n"
    "vllm:request_success_total{engine=\"0\",finished_reason=\"length\",model_name=\"m\"} 2.0\n"
    "# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.\n"
    "# TYPE vllm:time_to_first_token_seconds histogram\n"
    "vllm:time_to_first_token_seconds_sum{engine=\"0\",model_name=\"m\"} 3.2101\n"
    "vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.001\",model_name=\"m\"} 0.0\n"
    "vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.005\",model_name=\"m\"} 1.0\n"
    "vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.04\",model_name=\"m\"} 20.0\n"
    "vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.1\",model_name=\"m\"} 38.0\n"
    "vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"1.0\",model_name=\"m\"} 42.0\n"
    "vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"+Inf\",model_name=\"m\"} 42.0\n"
    "vllm:time_to_first_token_seconds_count{engine=\"0\",model_name=\"m\"} 42.0\n"
    "# HELP vllm:e2e_request_latency_seconds Histogram of end to end request latency.\n"
    "# TYPE vllm:e2e_request_latency_seconds histogram\n"
    "vllm:e2e_request_latency_seconds_bucket{engine=\"0\",le=\"+Inf\",model_name=\"m\"} 42.0\n"
    "vllm:e2e_request_latency_seconds_count{engine=\"0\",model_name=\"m\"} 42.0\n"
    "vllm:e2e_request_latency_seconds_sum{engine=\"0\",model_name=\"m\"} NaN\n"
    "# A free-form comment, then blank lines, CRLF, tabs, a timestamp and escapes\n"
    "\n"
    "   \n"
    "crlf_metric 7\r\n"
    "spaced_metric { a = \"1\" , b=\"2\", }\t-Inf\t1712345678901\n"
    "escaped{path=\"C:\\\\x \\\"q\\\"\\nz\"} +Inf\n"
    "hexval 0x1p4\n"
    "no_trailing_newline 1e-3";

static void test_parse_vllm(void **state)
{
    (void)state;
    gotlist l = {0};
    size_t n = kvr_prom_parse(vllm_sample, strlen(vllm_sample), collect, &l);
    assert_int_equal(n, 29);
    assert_int_equal(l.n, 29);

    assert_true(value_of(&l, "vllm:num_requests_running", "engine=0,model_name=m") == 3);
    assert_true(value_of(&l, "vllm:num_requests_waiting", "engine=0,model_name=m") == 0);
    assert_true(value_of(&l, "vllm:gpu_cache_usage_perc", "engine=0,model_name=m") == 0.4125);
    assert_true(value_of(&l, "vllm:prefix_cache_queries_total", "engine=0,model_name=m") ==
                1500);
    assert_true(value_of(&l, "process_resident_memory_bytes", "") == 2147483648.0);
    assert_true(value_of(&l, "vllm:request_success_total",
                         "engine=0,finished_reason=length,model_name=m") == 2);

    /* The info gauge: a router reads block size and capacity out of its labels. */
    const got *info = NULL;
    for (size_t i = 0; i < l.n; i++)
        if (strcmp(l.v[i].name, "vllm:cache_config_info") == 0)
            info = &l.v[i];
    assert_non_null(info);
    assert_true(info->value == 1);
    assert_non_null(strstr(info->labels, "block_size=16,"));
    assert_non_null(strstr(info->labels, ",num_gpu_blocks=2000,"));
    assert_non_null(strstr(info->labels, ",swap_space_bytes=4294967296"));
    assert_non_null(strstr(info->labels, "enable_prefix_caching=True"));
    assert_non_null(
        find(&l, "vllm:lora_requests_info",
             "max_lora=1,running_lora_adapters=,waiting_lora_adapters="));

    assert_true(value_of(&l, "vllm:time_to_first_token_seconds_bucket",
                         "engine=0,le=0.04,model_name=m") == 20);
    assert_true(value_of(&l, "vllm:time_to_first_token_seconds_bucket",
                         "engine=0,le=+Inf,model_name=m") == 42);
    assert_true(value_of(&l, "vllm:time_to_first_token_seconds_sum", "engine=0,model_name=m") ==
                3.2101);
    assert_true(isnan(value_of(&l, "vllm:e2e_request_latency_seconds_sum",
                               "engine=0,model_name=m")));

    assert_true(value_of(&l, "crlf_metric", "") == 7);
    double v = value_of(&l, "spaced_metric", "a=1,b=2");
    assert_true(isinf(v) && v < 0);
    v = value_of(&l, "escaped", "path=C:\\x \"q\"\nz");
    assert_true(isinf(v) && v > 0);
    assert_true(value_of(&l, "hexval", "") == 16);
    assert_true(value_of(&l, "no_trailing_newline", "") == 1e-3);

    /* No text, NULL text and a NULL callback are all fine. */
    assert_int_equal(kvr_prom_parse("", 0, collect, &l), 0);
    assert_int_equal(kvr_prom_parse(NULL, 5, collect, &l), 0);
    assert_int_equal(kvr_prom_parse(vllm_sample, strlen(vllm_sample), NULL, NULL), 29);
    free(l.v);
}

static void test_parse_malformed_lines(void **state)
{
    (void)state;
    /* Each bad line is skipped on its own; the good lines around them still count. */
    static const char text[] = "good_a 1\n"
                               "{a=\"1\"} 2\n"           /* no name */
                               "9name 3\n"               /* name starts with a digit */
                               "name_only\n"             /* no value */
                               "bad_value abc\n"         /* not a number */
                               "bad_value2 1.5x\n"       /* trailing junk in value */
                               "unclosed{a=\"1\" 4\n"    /* label set never closed */
                               "unquoted{a=1} 5\n"       /* value not quoted */
                               "open_quote{a=\"1} 6\n"   /* quote never closed */
                               "bad_escape{a=\"\\t\"} 7\n" /* only \\ \" \n are escapes */
                               "dash-name{a=\"1\"} 8\n"  /* '-' ends the name */
                               "nolabelname{=\"1\"} 9\n"
                               "noeq{a \"1\"} 10\n"
                               "bad_ts 1 12ab\n"
                               "extra_field 1 2 3\n"
                               "float_ts 1 1.5\n"
                               "trailing_backslash{a=\"\\\n"
                               "good_b{x=\"y\"} 2 -5\n";
    gotlist l = {0};
    assert_int_equal(kvr_prom_parse(text, strlen(text), collect, &l), 2);
    assert_string_equal(l.v[0].name, "good_a");
    assert_string_equal(l.v[1].name, "good_b");
    assert_string_equal(l.v[1].labels, "x=y");
    free(l.v);

    /* A NUL byte never crashes: in a value it makes the line malformed; in a label value the
     * C string simply ends there. */
    static const char withnul[] = "a 1\nb 2\0junk\nc{k=\"v\0w\"} 3\n";
    l = (gotlist){0};
    assert_int_equal(kvr_prom_parse(withnul, sizeof(withnul) - 1, collect, &l), 2);
    assert_string_equal(l.v[1].name, "c");
    free(l.v);
}

static uint64_t xorshift(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void test_parse_garbage(void **state)
{
    (void)state;
    size_t touched = 0;
    uint64_t seed = 0x9e3779b97f4a7c15ULL;
    /* Random bytes, heap-allocated at exact size so ASan catches any read past the end. */
    for (int round = 0; round < 2000; round++) {
        size_t len = (size_t)(xorshift(&seed) % 512);
        char *buf = malloc(len ? len : 1);
        for (size_t i = 0; i < len; i++) {
            uint64_t x = xorshift(&seed);
            /* Bias toward the grammar's own characters so the parser gets deep. */
            static const char alpha[] = "ab_:{}=\",\\\n\t 01.e+-InfNa#";
            buf[i] = (x & 1) ? alpha[(x >> 8) % (sizeof(alpha) - 1)] : (char)(x >> 16);
        }
        kvr_prom_parse(buf, len, counting_cb, &touched);
        free(buf);
    }
    /* Every truncation of a realistic scrape: only complete lines (or a valid prefix of the
     * final one) may count, and never more than the whole. */
    size_t full = kvr_prom_parse(vllm_sample, strlen(vllm_sample), NULL, NULL);
    size_t prev = 0;
    for (size_t cut = 0; cut <= strlen(vllm_sample); cut++) {
        char *buf = malloc(cut ? cut : 1);
        memcpy(buf, vllm_sample, cut);
        size_t n = kvr_prom_parse(buf, cut, counting_cb, &touched);
        assert_true(n <= full);
        assert_true(n + 1 >= prev); /* cutting later never loses more than the last line */
        prev = n;
        free(buf);
    }
    assert_int_equal(prev, full);
    assert_true(touched > 0);
}

static void test_round_trip(void **state)
{
    (void)state;
    kvr_metrics *r = kvr_metrics_new();
    kvr_metric *g = kvr_metrics_gauge(r, "vllm:rt_gauge", "g", 2, (const char *[]){"k", "odd"});
    kvr_metric *c = kvr_metrics_counter(r, "rt_total", "c", 0, NULL);
    kvr_metric *h = kvr_metrics_histogram(r, "rt_seconds", "h", 1, (const char *[]){"w"},
                                          (const double[]){1e-4, 0.1, 1.0 / 3, 1e6}, 4);
    const double vals[] = {
        0,       1,      -1,     0.1,          1.0 / 3,
        2.0 / 3, 1e-300, 5e-324, 1e300,        1.7976931348623157e308,
        -2.5e-7, NAN,    INFINITY, -INFINITY,  123456789012345678.0,
        9007199254740993.0 /* 2^53+1 rounds to 2^53 */, 0.30000000000000004,
    };
    size_t n = sizeof(vals) / sizeof(vals[0]);
    char key[16];
    for (size_t i = 0; i < n; i++) {
        snprintf(key, sizeof(key), "%zu", i);
        kvr_metric_set(g, (const char *[]){key, "a\\b\"c\nd{e}=f,g"}, vals[i]);
    }
    kvr_metric_inc(c, NULL, 0.1);
    kvr_metric_inc(c, NULL, 0.2);
    for (int i = 0; i < 100; i++)
        kvr_metric_observe(h, (const char *[]){"x"}, i * 0.013);

    char *text = render(r);
    gotlist l = {0};
    kvr_prom_parse(text, strlen(text), collect, &l);
    assert_int_equal(l.n, n + 1 + 5 + 2);
    for (size_t i = 0; i < n; i++) {
        char labels[64];
        snprintf(labels, sizeof(labels), "k=%zu,odd=a\\b\"c\nd{e}=f,g", i);
        double got_v = value_of(&l, "vllm:rt_gauge", labels);
        if (isnan(vals[i]))
            assert_true(isnan(got_v));
        else if (memcmp(&got_v, &vals[i], sizeof(double)) != 0 && !(got_v == 0 && vals[i] == 0))
            fail_msg("value %zu: rendered %.17g, parsed %.17g", i, vals[i], got_v);
    }
    assert_true(value_of(&l, "rt_total", "") == 0.1 + 0.2);
    assert_true(value_of(&l, "rt_seconds_count", "w=x") == 100);
    double sum = 0;
    for (int i = 0; i < 100; i++)
        sum += i * 0.013;
    assert_true(value_of(&l, "rt_seconds_sum", "w=x") == sum);
    /* The le labels read back as the exact bounds. */
    const got *b = NULL;
    for (size_t i = 0; i < l.n; i++)
        if (strcmp(l.v[i].name, "rt_seconds_bucket") == 0 && strstr(l.v[i].labels, "le=0.333"))
            b = &l.v[i];
    if (!b)
        fail_msg("bucket le=1/3 missing");
    const char *le = strstr(b->labels, "le=");
    if (!le)
        fail_msg("no le label");
    assert_true(strtod(le + 3, NULL) == 1.0 / 3);
    assert_true(b->value == 26); /* 0, 0.013, ..., 0.325 */
    free(l.v);
    free(text);
    kvr_metrics_free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exposition_byte_exact),
        cmocka_unit_test(test_unlabelled_histogram),
        cmocka_unit_test(test_value_formatting),
        cmocka_unit_test(test_label_escaping),
        cmocka_unit_test(test_histogram_buckets),
        cmocka_unit_test(test_type_rules),
        cmocka_unit_test(test_registration_rules),
        cmocka_unit_test(test_remove_matching),
        cmocka_unit_test(test_many_series_and_removal),
        cmocka_unit_test(test_render_hook),
        cmocka_unit_test(test_render_respects_buffer_cap),
        cmocka_unit_test(test_process_metrics),
        cmocka_unit_test(test_parse_vllm),
        cmocka_unit_test(test_parse_malformed_lines),
        cmocka_unit_test(test_parse_garbage),
        cmocka_unit_test(test_round_trip),
    };
    return cmocka_run_group_tests(tests, 0, NULL);
}
