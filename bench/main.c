/* kvroute-bench: replay a public trace against an OpenAI-compatible URL (kvroute, a worker, or
 * kvroute-sim) and report what caching and routing bought. Usage: docs/bench.md. */
#include <curl/curl.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "replay.h"
#include "report.h"
#include "sweep.h"
#include "trace.h"

static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

static void usage(FILE *f)
{
    fprintf(f,
        "usage: kvroute-bench --url URL --trace FILE|DIR --format FORMAT [options]\n"
        "Replays a trace as streaming OpenAI chat-completions requests and reports hit rate,\n"
        "TTFT, E2E latency, per-worker load and decisions.\n"
        "\n"
        "  --url URL                   base URL of kvroute or a worker (…/v1/chat/completions is added);\n"
        "                              repeat it for router replicas: requests are spread over them\n"
        "  --spread round_robin|random how requests are spread over several --url (round_robin)\n"
        "  --trace FILE|DIR            trace file, or its dataset folder\n"
        "  --format F                  tau | sweagent | sharegpt | mtbench | mooncake | azure\n"
        "  --model NAME                model name (default: first id of GET URL/v1/models)\n"
        "  --api-key KEY               sent as Authorization: Bearer KEY\n"
        "Every time is in model seconds, what the GPU would show: the workers' --time-scale F\n"
        "runs a model second in F wall seconds, and the bench divides what it measures by F.\n"
        "arrivals (one of):\n"
        "  --concurrency N             closed loop, N sessions active at a time (default 8)\n"
        "  --rate R                    open loop, Poisson session arrivals, R per model second\n"
        "  --timestamps                open loop, the trace's arrival times (mooncake, azure)\n"
        "  --sweep R1,R2,...           one open-loop pass per rate (sessions per model second)\n"
        "  --sweep-auto                ramp to the rate where goodput falls below 90 %%, then sweep\n"
        "                              10 %%..120 %% of it\n"
        "  --time-scale F              the workers' time scale: wall = model time x F (default 1;\n"
        "                              0.1 = 10x faster); arrivals and think times are scaled by F,\n"
        "                              reported times divided by it (0: no scaling)\n"
        "  --think-ms MS               mean think time between a session's turns, exponential,\n"
        "                              model ms (default 1000; 0 = none)\n"
        "sweeps:\n"
        "  --sweep-duration S          model seconds of arrivals per rate: ceil(rate x S) sessions,\n"
        "                              copies of the trace's (default 60)\n"
        "  --sweep-points N            --sweep-auto: rates from 10 %% to 120 %% (default 6)\n"
        "  --sweep-start R             --sweep-auto: the ramp's first rate (default 0.5)\n"
        "  --sweep-max-probes N        --sweep-auto: most ramp passes (default 10)\n"
        "  --slo-ttft-ms MS            goodput: TTFT at most this, model ms (default 2000)\n"
        "  --slo-itl-ms MS             goodput: mean inter-token latency at most this (default 100)\n"
        "requests:\n"
        "  --session-header-share F    share of sessions sent with x-session-id (default 0.5)\n"
        "  --max-requests N            replay only the first N requests (default: all)\n"
        "  --max-tokens-cap N          cap on max_tokens (default 512; 0 = none)\n"
        "  --default-max-tokens N      max_tokens when the answer length is unknown (default 256)\n"
        "  --ignore-eos                add vLLM's \"ignore_eos\": true (honour recorded lengths)\n"
        "  --seed S                    seeds header choice, think times, arrivals, text, bypass (default 1)\n"
        "  --bypass-share F            share of requests (0-1) sent straight to a random --bypass-worker,\n"
        "                              not to --url, as another router or a direct client would (default 0)\n"
        "  --bypass-worker URL         a worker's base URL for bypassed requests (repeatable)\n"
        "limits:\n"
        "  --max-inflight N            hard cap on concurrent requests (default 1024)\n"
        "  --timeout-ms MS             whole-request timeout (default 600000)\n"
        "  --connect-timeout-ms MS     connect timeout (default 10000)\n"
        "  --max-event-bytes N         cap on one SSE event (default 1048576)\n"
        "output:\n"
        "  --json OUT                  write the summary as JSON\n"
        "  --records OUT               write one JSON line per request\n"
        "  --progress auto|bar|lines|none  progress on stderr (default auto: bar on a TTY)\n"
        "  --help\n");
}

static int parse_double(const char *s, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end)
        return -1;
    *out = v;
    return 0;
}

static int parse_ulong(const char *s, unsigned long long *out)
{
    char *end;
    if (!s[0] || s[0] == '-')
        return -1;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end)
        return -1;
    *out = v;
    return 0;
}

static size_t collect(char *p, size_t size, size_t n, void *ud)
{
    return kvr_buf_append(ud, p, size * n) < 0 ? 0 : size * n;
}

/* GET <url>/v1/models → first data[].id (malloc'd), or NULL with a message on stderr. */
static char *discover_model(const char *url, long timeout_ms)
{
    char endpoint[2048];
    size_t ulen = strlen(url);
    while (ulen && url[ulen - 1] == '/')
        ulen--;
    snprintf(endpoint, sizeof(endpoint), "%.*s/v1/models", (int)ulen, url);
    kvr_buf b;
    kvr_buf_init(&b, 1 << 20);
    CURL *e = curl_easy_init();
    if (!e)
        return NULL;
    curl_easy_setopt(e, CURLOPT_URL, endpoint);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    CURLcode rc = curl_easy_perform(e);
    long status = 0;
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(e);
    char *model = NULL;
    if (rc == CURLE_OK && status == 200 && b.data) {
        json_t *j = json_loadb(b.data, b.len, 0, NULL);
        const char *id = json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id"));
        if (id)
            model = strdup(id);
        json_decref(j);
    }
    if (!model)
        fprintf(stderr, "kvroute-bench: cannot learn the model from %s (%s, status %ld); pass --model\n",
                endpoint, rc == CURLE_OK ? "no model in the answer" : curl_easy_strerror(rc), status);
    kvr_buf_free(&b);
    return model;
}

enum {
    OPT_URL = 256, OPT_TRACE, OPT_FORMAT, OPT_MODEL, OPT_API_KEY, OPT_CONC, OPT_RATE, OPT_TS,
    OPT_SCALE, OPT_THINK, OPT_SHARE, OPT_MAXREQ, OPT_CAP, OPT_DEFTOK, OPT_EOS, OPT_SEED,
    OPT_INFLIGHT, OPT_TIMEOUT, OPT_CTIMEOUT, OPT_EVENT, OPT_JSON, OPT_RECORDS, OPT_PROGRESS,
    OPT_HELP, OPT_BYPASS_SHARE, OPT_BYPASS_WORKER, OPT_SWEEP, OPT_SWEEP_AUTO, OPT_SWEEP_DUR,
    OPT_SWEEP_POINTS, OPT_SWEEP_START, OPT_SWEEP_PROBES, OPT_SLO_TTFT, OPT_SLO_ITL, OPT_SPREAD,
};

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"url", required_argument, 0, OPT_URL},
        {"trace", required_argument, 0, OPT_TRACE},
        {"format", required_argument, 0, OPT_FORMAT},
        {"model", required_argument, 0, OPT_MODEL},
        {"api-key", required_argument, 0, OPT_API_KEY},
        {"concurrency", required_argument, 0, OPT_CONC},
        {"rate", required_argument, 0, OPT_RATE},
        {"timestamps", no_argument, 0, OPT_TS},
        {"time-scale", required_argument, 0, OPT_SCALE},
        {"think-ms", required_argument, 0, OPT_THINK},
        {"session-header-share", required_argument, 0, OPT_SHARE},
        {"max-requests", required_argument, 0, OPT_MAXREQ},
        {"max-tokens-cap", required_argument, 0, OPT_CAP},
        {"default-max-tokens", required_argument, 0, OPT_DEFTOK},
        {"ignore-eos", no_argument, 0, OPT_EOS},
        {"seed", required_argument, 0, OPT_SEED},
        {"max-inflight", required_argument, 0, OPT_INFLIGHT},
        {"timeout-ms", required_argument, 0, OPT_TIMEOUT},
        {"connect-timeout-ms", required_argument, 0, OPT_CTIMEOUT},
        {"max-event-bytes", required_argument, 0, OPT_EVENT},
        {"json", required_argument, 0, OPT_JSON},
        {"records", required_argument, 0, OPT_RECORDS},
        {"progress", required_argument, 0, OPT_PROGRESS},
        {"help", no_argument, 0, OPT_HELP},
        {"bypass-share", required_argument, 0, OPT_BYPASS_SHARE},
        {"bypass-worker", required_argument, 0, OPT_BYPASS_WORKER},
        {"sweep", required_argument, 0, OPT_SWEEP},
        {"sweep-auto", no_argument, 0, OPT_SWEEP_AUTO},
        {"sweep-duration", required_argument, 0, OPT_SWEEP_DUR},
        {"sweep-points", required_argument, 0, OPT_SWEEP_POINTS},
        {"sweep-start", required_argument, 0, OPT_SWEEP_START},
        {"sweep-max-probes", required_argument, 0, OPT_SWEEP_PROBES},
        {"slo-ttft-ms", required_argument, 0, OPT_SLO_TTFT},
        {"slo-itl-ms", required_argument, 0, OPT_SLO_ITL},
        {"spread", required_argument, 0, OPT_SPREAD},
        {0, 0, 0, 0},
    };
    kvr_bench_config c;
    kvr_bench_config_defaults(&c);
    const char *trace_path = NULL, *format = NULL, *json_out = NULL, *records_out = NULL,
               *progress = "auto";
    unsigned long long maxreq = 0, u;
    double d;
    int modes = 0, opt;
    bool sweep = false;
    double rates[KVR_BENCH_SWEEP_MAX_RATES];
    kvr_bench_sweep_opts so;
    kvr_bench_sweep_opts_defaults(&so);
    static const char *bypass_workers[256];
    c.bypass_workers = bypass_workers;
    static const char *urls[64];
    c.urls = urls;
    while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        const char *a = optarg;
        int bad = 0;
        switch (opt) {
        case OPT_URL:
            if (c.nurls >= sizeof(urls) / sizeof(urls[0])) {
                fprintf(stderr, "kvroute-bench: at most %zu --url\n",
                        sizeof(urls) / sizeof(urls[0]));
                return 2;
            }
            urls[c.nurls++] = a;
            if (!c.url)
                c.url = a;
            break;
        case OPT_SPREAD:
            if (!strcmp(a, "round_robin"))
                c.spread_random = false;
            else if (!strcmp(a, "random"))
                c.spread_random = true;
            else
                bad = 1;
            break;
        case OPT_TRACE: trace_path = a; break;
        case OPT_FORMAT: format = a; break;
        case OPT_MODEL: c.model = a; break;
        case OPT_API_KEY: c.api_key = a; break;
        case OPT_CONC:
            bad = parse_ulong(a, &u) < 0 || u < 1 || u > 100000;
            c.concurrency = (unsigned)u;
            c.mode = KVR_BENCH_MODE_CONCURRENCY;
            modes++;
            break;
        case OPT_RATE:
            bad = parse_double(a, &c.rate) < 0 || !(c.rate > 0 && c.rate <= 1e9);
            c.mode = KVR_BENCH_MODE_RATE;
            modes++;
            break;
        case OPT_TS:
            c.mode = KVR_BENCH_MODE_TIMESTAMPS;
            modes++;
            break;
        case OPT_SCALE:
            bad = parse_double(a, &c.time_scale) < 0 || !(c.time_scale >= 0 && c.time_scale <= 1e6);
            break;
        case OPT_THINK:
            bad = parse_double(a, &c.think_ms) < 0 || !(c.think_ms >= 0 && c.think_ms <= 1e9);
            break;
        case OPT_SWEEP: {
            int n = kvr_bench_sweep_parse_rates(a, rates, KVR_BENCH_SWEEP_MAX_RATES);
            bad = n < 1;
            so.rates = rates;
            so.nrates = n < 0 ? 0 : (size_t)n;
            sweep = true;
            modes++;
            break;
        }
        case OPT_SWEEP_AUTO:
            so.automatic = sweep = true;
            modes++;
            break;
        case OPT_SWEEP_DUR:
            bad = parse_double(a, &so.duration_s) < 0 || !(so.duration_s > 0 && so.duration_s <= 1e6);
            break;
        case OPT_SWEEP_POINTS:
            bad = parse_ulong(a, &u) < 0 || u < 2 || u > KVR_BENCH_SWEEP_MAX_RATES;
            so.points = (size_t)u;
            break;
        case OPT_SWEEP_START:
            bad = parse_double(a, &so.start_rate) < 0 || !(so.start_rate > 0 && so.start_rate <= 1e6);
            break;
        case OPT_SWEEP_PROBES:
            bad = parse_ulong(a, &u) < 0 || u < 2 || u > 30;
            so.max_probes = (size_t)u;
            break;
        case OPT_SLO_TTFT:
            bad = parse_double(a, &c.slo_ttft_ms) < 0 || !(c.slo_ttft_ms > 0 && c.slo_ttft_ms <= 1e9);
            break;
        case OPT_SLO_ITL:
            bad = parse_double(a, &c.slo_itl_ms) < 0 || !(c.slo_itl_ms > 0 && c.slo_itl_ms <= 1e9);
            break;
        case OPT_SHARE:
            bad = parse_double(a, &d) < 0 || !(d >= 0 && d <= 1);
            c.session_header_share = d;
            break;
        case OPT_MAXREQ: bad = parse_ulong(a, &maxreq) < 0; break;
        case OPT_CAP:
            bad = parse_ulong(a, &u) < 0 || u > UINT32_MAX;
            c.max_tokens_cap = (uint32_t)u;
            break;
        case OPT_DEFTOK:
            bad = parse_ulong(a, &u) < 0 || u < 1 || u > UINT32_MAX;
            c.default_max_tokens = (uint32_t)u;
            break;
        case OPT_EOS: c.ignore_eos = true; break;
        case OPT_SEED: bad = parse_ulong(a, &u) < 0; c.seed = u; break;
        case OPT_INFLIGHT:
            bad = parse_ulong(a, &u) < 0 || u < 1 || u > 100000;
            c.max_inflight = (unsigned)u;
            break;
        case OPT_TIMEOUT:
            bad = parse_ulong(a, &u) < 0 || u < 1 || u > 86400000;
            c.timeout_ms = (long)u;
            break;
        case OPT_CTIMEOUT:
            bad = parse_ulong(a, &u) < 0 || u < 1 || u > 86400000;
            c.connect_timeout_ms = (long)u;
            break;
        case OPT_EVENT:
            bad = parse_ulong(a, &u) < 0 || u < 1024;
            c.max_event_bytes = (size_t)u;
            break;
        case OPT_JSON: json_out = a; break;
        case OPT_RECORDS: records_out = a; break;
        case OPT_PROGRESS: progress = a; break;
        case OPT_BYPASS_SHARE:
            bad = parse_double(a, &d) < 0 || !(d >= 0 && d <= 1);
            c.bypass_share = d;
            break;
        case OPT_BYPASS_WORKER:
            bad = (strncmp(a, "http://", 7) != 0 && strncmp(a, "https://", 8) != 0) ||
                  c.nbypass_workers >= sizeof(bypass_workers) / sizeof(bypass_workers[0]);
            if (!bad)
                bypass_workers[c.nbypass_workers++] = a;
            break;
        case OPT_HELP: usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (bad) {
            fprintf(stderr, "kvroute-bench: bad value for --%s: '%s'\n", opts[opt - OPT_URL].name, a);
            return 2;
        }
    }
    if (optind < argc || !c.url || !trace_path || !format) {
        fprintf(stderr, "kvroute-bench: --url, --trace and --format are required%s\n",
                optind < argc ? " (and there are stray arguments)" : "");
        usage(stderr);
        return 2;
    }
    if (modes > 1) {
        fprintf(stderr, "kvroute-bench: choose one of --concurrency, --rate, --timestamps, --sweep, --sweep-auto\n");
        return 2;
    }
    if (c.bypass_share > 0 && c.nbypass_workers == 0) {
        fprintf(stderr, "kvroute-bench: --bypass-share needs at least one --bypass-worker URL\n");
        return 2;
    }
    if (!strcmp(progress, "auto"))
        c.progress = isatty(STDERR_FILENO) ? 2 : 1;
    else if (!strcmp(progress, "bar"))
        c.progress = 2;
    else if (!strcmp(progress, "lines"))
        c.progress = 1;
    else if (!strcmp(progress, "none"))
        c.progress = 0;
    else {
        fprintf(stderr, "kvroute-bench: --progress is auto, bar, lines or none\n");
        return 2;
    }
    kvr_bench_format fmt;
    if (kvr_bench_format_parse(format, &fmt) < 0) {
        fprintf(stderr, "kvroute-bench: unknown --format '%s'\n", format);
        return 2;
    }
    if (c.mode == KVR_BENCH_MODE_TIMESTAMPS && kvr_bench_format_is_conversation(fmt)) {
        fprintf(stderr, "kvroute-bench: the %s trace has no timestamps; use --concurrency or --rate\n", format);
        return 2;
    }

    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fprintf(stderr, "kvroute-bench: libcurl failed to start\n");
        return 1;
    }
    char err[512] = "";
    kvr_bench_trace t;
    if (kvr_bench_trace_load(&t, fmt, trace_path, (size_t)maxreq, err, sizeof(err)) < 0) {
        fprintf(stderr, "kvroute-bench: %s\n", err);
        return 1;
    }
    char *owned_model = NULL;
    if (!c.model) {
        owned_model = discover_model(c.url, c.connect_timeout_ms + 5000);
        if (!owned_model) {
            kvr_bench_trace_free(&t);
            return 1;
        }
        c.model = owned_model;
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    c.stop = &g_stop;

    const char *mode_name = sweep                                ? (so.automatic ? "sweep-auto" : "sweep")
                            : c.mode == KVR_BENCH_MODE_CONCURRENCY ? "concurrency"
                            : c.mode == KVR_BENCH_MODE_RATE        ? "rate"
                                                                   : "timestamps";
    fprintf(stderr, "kvroute-bench: %zu sessions, %zu requests from %s (%s), model %s, %s mode\n",
            t.nsessions, t.nturns, trace_path, format, c.model, mode_name);
    kvr_bench_run run;
    kvr_bench_sweep_result sr = {0};
    int rc = 0;
    int ran = sweep ? kvr_bench_sweep_run(&t, &c, &so, &run, &sr, err, sizeof(err))
                    : kvr_bench_replay(&t, &c, &run, err, sizeof(err));
    if (ran < 0) {
        fprintf(stderr, "kvroute-bench: %s\n", err);
        rc = 1;
        kvr_bench_sweep_result_free(&sr);
        kvr_bench_run_free(&run);
    } else {
        kvr_bench_summary s;
        kvr_bench_summarize(&run, &s);
        char title[4400];
        if (sweep)
            snprintf(title, sizeof(title), "kvroute-bench  %s → %s  (%s, %g model s of arrivals per rate, think %g ms, time scale %g; all passes)",
                     format, c.url, mode_name, so.duration_s, c.think_ms, c.time_scale);
        else if (c.mode == KVR_BENCH_MODE_CONCURRENCY)
            snprintf(title, sizeof(title), "kvroute-bench  %s → %s  (concurrency %u, think %g ms, time scale %g)",
                     format, c.url, c.concurrency, c.think_ms, c.time_scale);
        else if (c.mode == KVR_BENCH_MODE_RATE)
            snprintf(title, sizeof(title), "kvroute-bench  %s → %s  (rate %g sessions/model s, think %g ms, time scale %g)",
                     format, c.url, c.rate, c.think_ms, c.time_scale);
        else
            snprintf(title, sizeof(title), "kvroute-bench  %s → %s  (timestamps × %g)", format,
                     c.url, c.time_scale);
        kvr_bench_print_table(stdout, title, &s);
        if (sweep)
            kvr_bench_sweep_print(stdout, &sr);
        fflush(stdout);
        if (json_out) {
            json_t *meta = json_pack(
                "{s:s,s:s,s:s,s:s,s:s,s:i,s:f,s:f,s:f,s:f,s:I,s:i,s:I}", "url", c.url, "trace",
                trace_path, "format", format, "model", c.model, "mode", mode_name, "concurrency",
                (int)c.concurrency, "rate", c.rate, "time_scale", c.time_scale, "think_ms",
                c.think_ms, "session_header_share", c.session_header_share, "seed",
                (json_int_t)c.seed, "max_tokens_cap", (int)c.max_tokens_cap, "max_requests",
                (json_int_t)maxreq);
            if (meta) {
                json_t *ua = json_array();
                for (size_t i = 0; ua && i < c.nurls; i++)
                    json_array_append_new(ua, json_string(c.urls[i]));
                json_object_set_new(meta, "urls", ua ? ua : json_null());
                json_object_set_new(meta, "spread",
                                    json_string(c.spread_random ? "random" : "round_robin"));
                json_t *bw = json_array();
                for (size_t i = 0; bw && i < c.nbypass_workers; i++)
                    json_array_append_new(bw, json_string(c.bypass_workers[i]));
                json_object_set_new(meta, "bypass_share", json_real(c.bypass_share));
                json_object_set_new(meta, "bypass_workers", bw ? bw : json_array());
                json_object_set_new(meta, "slo_ttft_ms", json_real(c.slo_ttft_ms));
                json_object_set_new(meta, "slo_itl_ms", json_real(c.slo_itl_ms));
                if (sweep)
                    json_object_set_new(meta, "sweep_duration_s", json_real(so.duration_s));
            }
            json_t *j = kvr_bench_summary_json(&s, meta);
            if (j && sweep) {
                json_object_set_new(j, "sweep", kvr_bench_sweep_json(&sr));
                if (so.automatic) {
                    kvr_bench_sweep_result probes = {.points = sr.probes, .npoints = sr.nprobes};
                    json_t *pj = kvr_bench_sweep_json(&probes);
                    json_object_set_new(j, "sweep_auto",
                                        json_pack("{s:o,s:o}", "saturation_rate",
                                                  isnan(sr.saturation_rate) ? json_null()
                                                                            : json_real(sr.saturation_rate),
                                                  "ramp", pj ? pj : json_array()));
                }
            }
            if (!j || json_dump_file(j, json_out, JSON_INDENT(2)) < 0) {
                fprintf(stderr, "kvroute-bench: cannot write %s\n", json_out);
                rc = 1;
            }
            json_decref(j);
        }
        if (records_out && kvr_bench_write_records(records_out, &t, &run) < 0) {
            fprintf(stderr, "kvroute-bench: cannot write %s\n", records_out);
            rc = 1;
        }
        if (run.interrupted && rc == 0)
            rc = 130;
        kvr_bench_summary_free(&s);
        kvr_bench_sweep_result_free(&sr);
        kvr_bench_run_free(&run);
    }
    kvr_bench_trace_free(&t);
    free(owned_model);
    curl_global_cleanup();
    return rc;
}
