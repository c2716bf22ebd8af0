/* kvroute's flag table: one row per flag (name, type, field, bounds, help), parsed by the
 * shared table-driven parser in src/util/flags.h. */
#include "config/config.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "util/flags.h"

static int set_worker(void *target, const kvr_flag *f, const char *v, char *err, size_t cap);
static void show_worker(FILE *out, const void *target, const kvr_flag *f);

#define OFF(f) offsetof(kvr_config, f)
#define FL(n, t, field, lo, hi, h) \
    {.name = n, .type = KVR_FLAG_##t, .off = OFF(field), .min = lo, .max = hi, .help = h}
static const kvr_flag flags[] = {
    {.name = "worker", .type = KVR_FLAG_CUSTOM, .off = OFF(workers),
     .help = "worker base URL, e.g. http://127.0.0.1:9001 (repeatable)", .set = set_worker,
     .show = show_worker},
    FL("model", STR, model, 0, 0, "model served (default: ask the workers' /v1/models)"),
    FL("policy", STR, policy, 0, 0, "routing policy"),
    FL("host", STR, host, 0, 0, "address to listen on"),
    FL("port", INT, port, 1, 65535, "port to listen on"),
    FL("admin-host", STR, admin_host, 0, 0, "admin listener address"),
    FL("admin-port", INT, admin_port, 0, 65535, "admin listener port (0 = off)"),
    FL("admin-token-file", STR, admin_token_file, 0, 0,
      "file holding the admin bearer token (unset = no auth)"),
    FL("drain-timeout", U64, drain_timeout_s, 0, 86400,
      "seconds to let in-flight requests finish on SIGTERM"),
    FL("health-interval-ms", U64, health_interval_ms, 0, 3600000,
      "active health check period (0 = off)"),
    FL("health-path", STR, health_path, 0, 0, "worker health check path"),
    FL("scrape-interval", U64, scrape_interval_s, 0, 3600,
      "seconds between worker /metrics scrapes (0 = off)"),
    FL("retry-after", U64, retry_after_s, 0, 3600, "Retry-After seconds on 503"),
    FL("log-level", STR, log_level, 0, 0, "debug, info, warn or error"),
    FL("seed", U64, seed, 0, 1.8e19, "random seed for tie-breaks (0 = clock)"),
    FL("max-body-bytes", SIZE, http.max_body_bytes, 1, 1e12, "request body limit (413)"),
    FL("max-header-bytes", SIZE, http.max_header_bytes, 256, 1e9,
      "request line + headers limit (431)"),
    FL("max-headers", SIZE, http.max_headers, 1, 1e6, "header line count limit (431)"),
    FL("header-timeout-ms", U64, http.header_timeout_ms, 1, 1e9,
      "absolute deadline to receive a request's headers (408)"),
    FL("body-timeout-ms", U64, http.body_timeout_ms, 1, 1e9,
      "absolute deadline to receive a request's body (408)"),
    FL("idle-timeout-ms", U64, http.idle_timeout_ms, 1, 1e9, "keep-alive idle timeout"),
    FL("max-total-body-bytes", SIZE, http.max_total_body_bytes, 1, 1e13,
      "request body bytes held at once by all connections (503 above)"),
    FL("max-connections", SIZE, http.max_connections, 1, 1e7,
      "open client connections (more are refused)"),
    FL("write-buffer-bytes", SIZE, http.write_high_water, 1024, 1e9,
      "bytes buffered per client before the worker stream is paused"),
    FL("connect-timeout-ms", U64, upstream.connect_timeout_ms, 1, 1e9,
      "worker TCP connect timeout"),
    FL("first-byte-timeout-ms", U64, upstream.first_byte_timeout_ms, 1, 1e10,
      "worker response headers deadline (prefill of long prompts)"),
    FL("stream-idle-timeout-ms", U64, upstream.stream_idle_timeout_ms, 1, 1e10,
      "max gap between a worker's body bytes"),
    FL("max-worker-connections", LONG, upstream.max_host_connections, 0, 1e6,
      "connections per worker (0 = unlimited)"),
    FL("cache-threshold", DOUBLE, policy_cfg.cache_threshold, 0, 1,
      "min prefix match ratio for prefix_match"),
    FL("balance-abs-threshold", DOUBLE, policy_cfg.balance_abs_threshold, 0, 1e9,
      "overload gate: load - min_load above this"),
    FL("balance-rel-threshold", DOUBLE, policy_cfg.balance_rel_threshold, 1, 1e9,
      "overload gate: load above min_load times this"),
    FL("session-ttl", U64, policy_cfg.session_ttl_s, 1, 1e9, "session TTL in seconds"),
    FL("max-sessions", SIZE, policy_cfg.max_sessions, 1, 1e9, "session map capacity"),
    FL("block-bytes", SIZE, policy_cfg.block_bytes, 8, 65536,
      "prefix index block size in bytes"),
    FL("max-index-blocks", SIZE, policy_cfg.max_index_blocks, 1, 1e10,
      "global cap on distinct prefix index blocks"),
    FL("worker-index-blocks", SIZE, policy_cfg.worker_index_blocks, 0, 1e10,
      "per-worker index blocks (0 = from KV capacity, else global cap)"),
    FL("max-routing-text-bytes", SIZE, max_routing_text_bytes, 0, 1e12,
      "routing text kept per request (longer is cut)"),
    FL("session-keys", STR, session_keys, 0, 0,
      "session id sources: comma list of header:NAME and body:PATH"),
    FL("max-usage-scan-bytes", SIZE, max_usage_bytes, 0, 1e9,
      "JSON response bytes kept to read token usage"),
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

/* --worker is repeatable: each one appends, up to KVR_MAX_WORKERS. */
static int set_worker(void *target, const kvr_flag *f, const char *v, char *err, size_t cap)
{
    (void)f;
    kvr_config *c = target;
    if (c->nworkers == KVR_MAX_WORKERS) {
        snprintf(err, cap, "too many --worker (max %d)", KVR_MAX_WORKERS);
        return -1;
    }
    c->workers[c->nworkers++] = v;
    return 0;
}

static void show_worker(FILE *out, const void *target, const kvr_flag *f)
{
    (void)target, (void)f;
    fputs("required", out);
}

#define NFLAGS (sizeof(flags) / sizeof(flags[0]))

int kvr_config_parse(kvr_config *c, int argc, char **argv, char *err, size_t cap)
{
    int rc = kvr_flags_parse(flags, NFLAGS, c, argc, argv, err, cap);
    if (rc == 1)
        kvr_config_usage(stdout);
    if (rc != 0)
        return rc;
    if (c->nworkers == 0) {
        snprintf(err, cap, "at least one --worker URL is required (see --help)");
        return -1;
    }
    return 0;
}

void kvr_config_usage(void *file)
{
    FILE *f = file;
    kvr_config d;
    kvr_config_default(&d);
    fprintf(f, "usage: kvroute --worker URL [--worker URL ...] [flags]\n\n"
               "policies: %s\n\nflags (default in brackets):\n",
            kvr_policy_names());
    kvr_flags_usage(f, flags, NFLAGS, &d, 24);
}
