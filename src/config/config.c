/* Flag table and parser. One row per flag: name, type, where it goes, bounds, help. */
#include "config/config.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { T_STR, T_INT, T_U64, T_SIZE, T_DOUBLE, T_WORKER } ftype;

typedef struct flag {
    const char *name;
    ftype type;
    size_t off;
    double min, max;
    const char *help;
} flag;

#define OFF(f) offsetof(kvr_config, f)
static const flag flags[] = {
    {"worker", T_WORKER, 0, 0, 0, "worker base URL, e.g. http://127.0.0.1:9001 (repeatable)"},
    {"model", T_STR, OFF(model), 0, 0, "model served (default: ask the workers' /v1/models)"},
    {"policy", T_STR, OFF(policy), 0, 0, "routing policy"},
    {"host", T_STR, OFF(host), 0, 0, "address to listen on"},
    {"port", T_INT, OFF(port), 1, 65535, "port to listen on"},
    {"admin-host", T_STR, OFF(admin_host), 0, 0, "admin listener address"},
    {"admin-port", T_INT, OFF(admin_port), 0, 65535, "admin listener port (0 = off)"},
    {"admin-token-file", T_STR, OFF(admin_token_file), 0, 0,
     "file holding the admin bearer token (unset = no auth)"},
    {"drain-timeout", T_U64, OFF(drain_timeout_s), 0, 86400,
     "seconds to let in-flight requests finish on SIGTERM"},
    {"health-interval-ms", T_U64, OFF(health_interval_ms), 0, 3600000,
     "active health check period (0 = off)"},
    {"health-path", T_STR, OFF(health_path), 0, 0, "worker health check path"},
    {"scrape-interval", T_U64, OFF(scrape_interval_s), 0, 3600,
     "seconds between worker /metrics scrapes (0 = off)"},
    {"retry-after", T_U64, OFF(retry_after_s), 0, 3600, "Retry-After seconds on 503"},
    {"log-level", T_STR, OFF(log_level), 0, 0, "debug, info, warn or error"},
    {"seed", T_U64, OFF(seed), 0, 1.8e19, "random seed for tie-breaks (0 = clock)"},
    {"max-body-bytes", T_SIZE, OFF(http.max_body_bytes), 1, 1e12, "request body limit (413)"},
    {"max-header-bytes", T_SIZE, OFF(http.max_header_bytes), 256, 1e9,
     "request line + headers limit (431)"},
    {"max-headers", T_SIZE, OFF(http.max_headers), 1, 1e6, "header line count limit (431)"},
    {"header-timeout-ms", T_U64, OFF(http.header_timeout_ms), 1, 1e9,
     "absolute deadline to receive a request's headers (408)"},
    {"body-timeout-ms", T_U64, OFF(http.body_timeout_ms), 1, 1e9,
     "absolute deadline to receive a request's body (408)"},
    {"idle-timeout-ms", T_U64, OFF(http.idle_timeout_ms), 1, 1e9, "keep-alive idle timeout"},
    {"max-total-body-bytes", T_SIZE, OFF(http.max_total_body_bytes), 1, 1e13,
     "request body bytes held at once by all connections (503 above)"},
    {"max-connections", T_SIZE, OFF(http.max_connections), 1, 1e7,
     "open client connections (more are refused)"},
    {"write-buffer-bytes", T_SIZE, OFF(http.write_high_water), 1024, 1e9,
     "bytes buffered per client before the worker stream is paused"},
    {"connect-timeout-ms", T_U64, OFF(upstream.connect_timeout_ms), 1, 1e9,
     "worker TCP connect timeout"},
    {"first-byte-timeout-ms", T_U64, OFF(upstream.first_byte_timeout_ms), 1, 1e10,
     "worker response headers deadline (prefill of long prompts)"},
    {"stream-idle-timeout-ms", T_U64, OFF(upstream.stream_idle_timeout_ms), 1, 1e10,
     "max gap between a worker's body bytes"},
    {"max-worker-connections", T_INT, OFF(upstream.max_host_connections), 0, 1e6,
     "connections per worker (0 = unlimited)"},
    {"cache-threshold", T_DOUBLE, OFF(policy_cfg.cache_threshold), 0, 1,
     "min prefix match ratio for prefix_match"},
    {"balance-abs-threshold", T_DOUBLE, OFF(policy_cfg.balance_abs_threshold), 0, 1e9,
     "overload gate: load - min_load above this"},
    {"balance-rel-threshold", T_DOUBLE, OFF(policy_cfg.balance_rel_threshold), 1, 1e9,
     "overload gate: load above min_load times this"},
    {"session-ttl", T_U64, OFF(policy_cfg.session_ttl_s), 1, 1e9, "session TTL in seconds"},
    {"max-sessions", T_SIZE, OFF(policy_cfg.max_sessions), 1, 1e9, "session map capacity"},
    {"block-bytes", T_SIZE, OFF(policy_cfg.block_bytes), 8, 65536,
     "prefix index block size in bytes"},
    {"max-index-blocks", T_SIZE, OFF(policy_cfg.max_index_blocks), 1, 1e10,
     "global cap on distinct prefix index blocks"},
    {"worker-index-blocks", T_SIZE, OFF(policy_cfg.worker_index_blocks), 0, 1e10,
     "per-worker index blocks (0 = from KV capacity, else global cap)"},
    {"max-routing-text-bytes", T_SIZE, OFF(max_routing_text_bytes), 0, 1e12,
     "routing text kept per request (longer is cut)"},
    {"session-keys", T_STR, OFF(session_keys), 0, 0,
     "session id sources: comma list of header:NAME and body:PATH"},
    {"max-usage-scan-bytes", T_SIZE, OFF(max_usage_bytes), 0, 1e9,
     "JSON response bytes kept to read token usage"},
};

void kvr_config_default(kvr_config *c)
{
    memset(c, 0, sizeof(*c));
    c->policy = "cache_aware";
    c->host = "127.0.0.1";
    c->port = 8000;
    c->admin_host = "127.0.0.1";
    c->drain_timeout_s = 30;
    c->health_interval_ms = 2000;
    c->health_path = "/health";
    c->scrape_interval_s = 5;
    c->retry_after_s = 1;
    c->log_level = "info";
    c->max_usage_bytes = 1 << 20;
    c->max_routing_text_bytes = 32u << 20;
    kvr_http_limits_default(&c->http);
    kvr_upstream_opts_default(&c->upstream);
    kvr_policy_cfg_default(&c->policy_cfg);
}

static int set_value(kvr_config *c, const flag *f, const char *v, char *err, size_t cap)
{
    char *p = (char *)c + f->off;
    if (f->type == T_STR) {
        *(const char **)p = v;
        return 0;
    }
    if (f->type == T_WORKER) {
        if (c->nworkers == KVR_MAX_WORKERS) {
            snprintf(err, cap, "too many --worker (max %d)", KVR_MAX_WORKERS);
            return -1;
        }
        c->workers[c->nworkers++] = v;
        return 0;
    }
    errno = 0;
    char *end;
    double d = strtod(v, &end);
    if (errno || end == v || *end || d < f->min || d > f->max ||
        (f->type != T_DOUBLE && d != (double)(long long)d)) {
        snprintf(err, cap, "--%s: bad value '%s' (expected %s in [%g, %g])", f->name, v,
                 f->type == T_DOUBLE ? "a number" : "an integer", f->min, f->max);
        return -1;
    }
    switch (f->type) {
    case T_INT:
        if (f->off == OFF(upstream.max_host_connections))
            *(long *)p = (long)d;
        else
            *(int *)p = (int)d;
        break;
    case T_U64:
        *(uint64_t *)p = (uint64_t)strtoull(v, NULL, 10);
        break;
    case T_SIZE:
        *(size_t *)p = (size_t)strtoull(v, NULL, 10);
        break;
    default:
        *(double *)p = d;
    }
    return 0;
}

int kvr_config_parse(kvr_config *c, int argc, char **argv, char *err, size_t cap)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            kvr_config_usage(stdout);
            return 1;
        }
        if (strncmp(a, "--", 2) != 0) {
            snprintf(err, cap, "unexpected argument '%s' (see --help)", a);
            return -1;
        }
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t nl = eq ? (size_t)(eq - name) : strlen(name);
        const flag *f = NULL;
        for (size_t k = 0; k < sizeof(flags) / sizeof(flags[0]); k++)
            if (strlen(flags[k].name) == nl && strncmp(flags[k].name, name, nl) == 0)
                f = &flags[k];
        if (!f) {
            snprintf(err, cap, "unknown flag '%s' (see --help)", a);
            return -1;
        }
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v) {
            snprintf(err, cap, "--%s needs a value", f->name);
            return -1;
        }
        if (set_value(c, f, v, err, cap) < 0)
            return -1;
    }
    if (c->nworkers == 0) {
        snprintf(err, cap, "at least one --worker URL is required (see --help)");
        return -1;
    }
    return 0;
}

static void print_default(FILE *f, const kvr_config *d, const flag *fl)
{
    const char *p = (const char *)d + fl->off;
    switch (fl->type) {
    case T_STR:
        fprintf(f, "%s", *(const char *const *)p ? *(const char *const *)p : "unset");
        break;
    case T_INT:
        if (fl->off == OFF(upstream.max_host_connections))
            fprintf(f, "%ld", *(const long *)p);
        else
            fprintf(f, "%d", *(const int *)p);
        break;
    case T_U64:
        fprintf(f, "%llu", (unsigned long long)*(const uint64_t *)p);
        break;
    case T_SIZE:
        fprintf(f, "%zu", *(const size_t *)p);
        break;
    case T_DOUBLE:
        fprintf(f, "%g", *(const double *)p);
        break;
    case T_WORKER:
        fprintf(f, "required");
        break;
    }
}

void kvr_config_usage(void *file)
{
    FILE *f = file;
    kvr_config d;
    kvr_config_default(&d);
    fprintf(f, "usage: kvroute --worker URL [--worker URL ...] [flags]\n\n"
               "policies: %s\n\nflags (default in brackets):\n",
            kvr_policy_names());
    for (size_t k = 0; k < sizeof(flags) / sizeof(flags[0]); k++) {
        fprintf(f, "  --%-24s %s [", flags[k].name, flags[k].help);
        print_default(f, &d, &flags[k]);
        fprintf(f, "]\n");
    }
}
