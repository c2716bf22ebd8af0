/* kvroute's flag tables (one row per flag: name, type, field, bounds, help), parsed by the
 * shared table-driven parser in src/util/flags.h, the order file → flags → route settings,
 * and the cross-checks that need the whole configuration. */
#include "config/config.h"

#include <jansson.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "routing/scorers.h"
#include "upstream/egress.h"
#include "workers/k8s.h"
#include "util/flags.h"

static int set_worker(void *target, const kvr_flag *f, const char *v, char *err, size_t cap);
static int set_scorer(void *target, const kvr_flag *f, const char *v, char *err, size_t cap);
static int set_route_scorers(void *target, const kvr_flag *f, const char *v, char *err,
                             size_t cap);
static void show_scorers(FILE *out, const void *target, const kvr_flag *f);
static void show_worker(FILE *out, const void *target, const kvr_flag *f);
static int set_k8s_service(void *target, const kvr_flag *f, const char *v, char *err, size_t cap);
static void show_none(FILE *out, const void *target, const kvr_flag *f);
static int set_kv_events(void *target, const kvr_flag *f, const char *v, char *err, size_t cap);
static int set_upstream_client(void *target, const kvr_flag *f, const char *v, char *err,
                               size_t cap);
static void show_upstream_client(FILE *out, const void *target, const kvr_flag *f);

/* Per-route flags, written once: each row is both a route key of the file (offsets into
 * kvr_route_cfg) and a global flag setting the defaults of every route (offsets into
 * kvr_config.route). */
#define ROUTE_FLAGS(X)                                                                        \
    X("policy", STR, policy, 0, 0, "routing policy")                                          \
    X("cache-threshold", DOUBLE, p.cache_threshold, 0, 1,                                     \
      "min prefix match ratio for prefix_match")                                              \
    X("balance-abs-threshold", DOUBLE, p.balance_abs_threshold, 0, 1e9,                       \
      "overload gate: load - min_load above this")                                            \
    X("balance-rel-threshold", DOUBLE, p.balance_rel_threshold, 1, 1e9,                       \
      "overload gate: load above min_load times this")                                        \
    X("session-ttl", U64, p.session_ttl_s, 1, 1e9, "session TTL in seconds")                  \
    X("max-sessions", SIZE, p.max_sessions, 1, 1e9, "session map capacity")                   \
    X("block-bytes", SIZE, p.block_bytes, 8, 65536, "prefix index block size in bytes")       \
    X("max-index-blocks", SIZE, p.max_index_blocks, 1, 1e10,                                  \
      "global cap on distinct prefix index blocks")                                           \
    X("worker-index-blocks", SIZE, p.worker_index_blocks, 0, 1e10,                            \
      "per-worker index blocks (0 = from KV capacity, else global cap)")                     \
    X("hash-load-factor", DOUBLE, p.hash_load_factor, 0, 1e6,                                 \
      "consistent_hash/rendezvous_hash bounded loads: a worker holds at most this times its "  \
      "share of the in-flight requests (0 = unbounded)")                                       \
    X("pd-mode", STR, pd_mode, 0, 0,                                                          \
      "prefill/decode disaggregation of routes with prefill workers: vllm (NixlConnector, "   \
      "prefill then decode) or sglang (bootstrap, both at once)")                             \
    X("pd-prefill-policy", STR, prefill_policy, 0, 0,                                         \
      "policy of a disaggregated route's prefill side (sessions, prefix index, KV events)")   \
    X("pd-decode-policy", STR, decode_policy, 0, 0,                                           \
      "policy of a disaggregated route's decode side")

#define ROUTE_ROW(n, t, field, lo, hi, h)                                                     \
    {.name = n, .type = KVR_FLAG_##t, .off = offsetof(kvr_route_cfg, field), .min = lo,       \
     .max = hi, .help = h},
#define GLOBAL_ROUTE_ROW(n, t, field, lo, hi, h)                                              \
    {.name = n, .type = KVR_FLAG_##t,                                                         \
     .off = offsetof(kvr_config, route) + offsetof(kvr_route_cfg, field), .min = lo,          \
     .max = hi, .help = h},

/* A route's `scorers` (file only: a mapping there, see file.c) replaces the defaults entirely;
 * the command line's spelling is the repeatable --scorer. */
static const kvr_flag route_flags[] = {
    ROUTE_FLAGS(ROUTE_ROW)
    {.name = "scorers", .type = KVR_FLAG_CUSTOM, .off = offsetof(kvr_route_cfg, p.scorers),
     .help = "pipeline scorer weights, NAME=WEIGHT,... (unlisted scorers weigh 0)",
     .set = set_route_scorers, .show = show_scorers},
};

#define OFF(f) offsetof(kvr_config, f)
#define FL(n, t, field, lo, hi, h) \
    {.name = n, .type = KVR_FLAG_##t, .off = OFF(field), .min = lo, .max = hi, .help = h}
static const kvr_flag flags[] = {
    FL("config", STR, config_file, 0, 0, "YAML config file (routes, workers, settings)"),
    FL("check", BOOL, check, 0, 0, "validate the configuration, print a summary and exit"),
    {.name = "worker", .type = KVR_FLAG_CUSTOM, .off = OFF(workers),
     .help = "worker base URL, e.g. http://127.0.0.1:9001 (repeatable); URL@N: a vLLM engine "
             "of N data-parallel ranks, routed as URL#0..URL#N-1",
     .set = set_worker,
     .show = show_worker},
    {.name = "prefill", .type = KVR_FLAG_CUSTOM, .off = OFF(workers),
     .help = "a prefill-only worker's base URL (prefill/decode disaggregation; repeatable)",
     .set = set_worker, .show = show_worker},
    {.name = "decode", .type = KVR_FLAG_CUSTOM, .off = OFF(workers),
     .help = "a decode-only worker's base URL (prefill/decode disaggregation; repeatable)",
     .set = set_worker, .show = show_worker},
    FL("model", STR, model, 0, 0,
       "one route of this name over every worker (default: a route per model the workers' "
       "/v1/models list)"),
    FL("discovery-interval", U64, discovery_interval_s, 1, 86400,
       "seconds between reads of every worker's /v1/models when routes are discovered"),
    {.name = "k8s-service", .type = KVR_FLAG_CUSTOM, .off = OFF(k8s),
     .help = "Kubernetes Service whose EndpointSlices are the workers (repeatable; list + "
             "watch, see docs/operations.md)",
     .set = set_k8s_service, .show = show_none},
    FL("k8s-namespace", STR, k8s.ns, 0, 0,
       "namespace of --k8s-service (default: the pod's own, from the service-account mount)"),
    FL("k8s-port", STR, k8s.port, 0, 0,
       "the workers' port in the EndpointSlices: a name or a number (default: the only one, "
       "or the one named http)"),
    FL("k8s-api-url", STR, k8s.api_url, 0, 0,
       "Kubernetes API server (default: https://$KUBERNETES_SERVICE_HOST:"
       "$KUBERNETES_SERVICE_PORT)"),
    FL("k8s-token-file", STR, k8s.token_file, 0, 0,
       "bearer token file, re-read before every call (default: the service-account token)"),
    FL("k8s-ca-file", STR, k8s.ca_file, 0, 0,
       "CA bundle of the API server (default: the service-account ca.crt)"),
    FL("k8s-kv-events-port", STR, k8s.kv_port, 0, 0,
       "the workers' KV-event PUB port in the EndpointSlices, a name or number (precise)"),
    FL("k8s-kv-replay-port", STR, k8s.kv_replay_port, 0, 0,
       "the workers' KV-event replay port in the EndpointSlices, a name or number"),
    FL("k8s-kv-topic", STR, k8s.kv_topic, 0, 0,
       "topic of the discovered workers' KV events (unset = every message)"),
    FL("k8s-data-parallel-size", U32, k8s.data_parallel_size, 1, KVR_MAX_DP_SIZE,
       "data-parallel ranks of each discovered engine (vLLM --data-parallel-size): it becomes "
       "URL#0..URL#N-1, rank r's KV events on the events port + r"),
    FL("k8s-watch-timeout-s", U64, k8s.watch_timeout_s, 1, 3600,
       "timeoutSeconds of each EndpointSlice watch (then resumed)"),
    FL("k8s-backoff-max-ms", U64, k8s.backoff_max_ms, 1, 3600000,
       "longest wait between Kubernetes API retries after errors"),
    FL("k8s-max-event-bytes", SIZE, k8s.max_event_bytes, 1024, 1e9,
       "longest EndpointSlice watch event line"),
    FL("k8s-max-list-bytes", SIZE, k8s.max_list_bytes, 1024, 1e10,
       "largest EndpointSlice list body"),
    FL("k8s-max-endpoints", SIZE, k8s.max_endpoints, 1, 1e6,
       "endpoint addresses kept per EndpointSlice"),
    ROUTE_FLAGS(GLOBAL_ROUTE_ROW)
    {.name = "scorer", .type = KVR_FLAG_CUSTOM, .off = OFF(route.p.scorers),
     .help = "NAME=WEIGHT: a pipeline scorer's weight (repeatable; the first replaces the "
             "defaults, an unnamed scorer weighs 0): prefix, session, load, queue, kv_usage, "
             "weight, lmcache",
     .set = set_scorer, .show = show_scorers},
    FL("host", STR, host, 0, 0, "address to listen on"),
    FL("port", INT, port, 1, 65535, "port to listen on"),
    FL("admin-host", STR, admin_host, 0, 0, "admin listener address"),
    FL("admin-port", INT, admin_port, 0, 65535, "admin listener port (0 = off)"),
    FL("admin-token-file", STR, admin_token_file, 0, 0,
      "file holding the admin bearer token (unset = no auth)"),
    FL("api-key-file", STR, api_key_file, 0, 0,
       "client API keys, one per line as KEY or NAME:KEY (unset = no client auth)"),
    FL("metrics-require-key", BOOL, metrics_require_key, 0, 0,
       "GET /metrics needs a client API key too"),
    FL("max-inflight", U64, max_inflight, 0, 1e9,
       "upstream attempts in flight in the process (0 = unlimited; more wait in the queue)"),
    FL("max-queue", SIZE, max_queue, 0, 1e7, "requests waiting for a free slot (503 above)"),
    FL("queue-timeout-ms", U64, queue_timeout_ms, 1, 1e9,
       "longest wait in the admission queue (then 503)"),
    FL("max-connections-per-ip", SIZE, http.max_connections_per_ip, 0, 1e7,
       "open client connections per client address (0 = off)"),
    FL("drain-timeout", U64, drain_timeout_s, 0, 86400,
      "seconds to let in-flight requests finish on SIGTERM"),
    FL("shutdown-delay-ms", U64, shutdown_delay_ms, 0, 3600000,
       "on SIGTERM: /readyz 503 at once, keep serving this long, then drain (0 = drain at once)"),
    FL("health-interval-ms", U64, health_interval_ms, 0, 3600000,
      "active health check period (0 = off)"),
    FL("health-path", STR, health_path, 0, 0, "worker health check path"),
    FL("unhealthy-threshold", U32, unhealthy_threshold, 1, 1000,
       "failed health checks in a row that make a worker unhealthy"),
    FL("healthy-threshold", U32, healthy_threshold, 1, 1000,
       "passed health checks in a row that make it healthy again"),
    FL("forget-after-ms", U64, forget_after_ms, 0, 1e10,
       "a worker down this long loses its sessions, index entries and pins"),
    FL("breaker-failures", U32, breaker.failures, 0, 1e6,
       "consecutive failures that open a worker's circuit breaker (0 = never)"),
    FL("breaker-cooldown-ms", U64, breaker.cooldown_ms, 1, 1e9,
       "how long an open breaker keeps the worker out before one trial request"),
    FL("breaker-max-cooldown-ms", U64, breaker.max_cooldown_ms, 1, 1e10,
       "cap of the cooldown, doubled on every re-open"),
    FL("max-retries", U32, max_retries, 0, 15,
       "further attempts on untried workers for a request that failed before any byte"),
    FL("retry-budget", DOUBLE, retry_budget, 0, 100,
       "retries may add this share of a route's requests over 10 s (plus 3 per second)"),
    FL("scrape-interval", U64, scrape_interval_s, 0, 3600,
      "seconds between worker /metrics scrapes (0 = off)"),
    FL("lmcache-interval-ms", U64, lmcache_interval_ms, 10, 3600000,
       "period of the polls of the workers' LMCache status endpoints (lmcache_aware)"),
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
    {.name = "upstream-client", .type = KVR_FLAG_CUSTOM, .off = OFF(upstream.client),
     .help = "HTTP client of http:// workers: native (kvroute's own HTTP/1.1 client) or curl "
             "(libcurl); https:// always uses libcurl",
     .set = set_upstream_client, .show = show_upstream_client},
    FL("upstream-max-idle", SIZE, upstream.max_idle, 0, 1e6,
       "native client: idle keep-alive connections kept per worker"),
    FL("upstream-idle-timeout-ms", U64, upstream.idle_timeout_ms, 0, 1e10,
       "native client: an idle worker connection is closed after this long (0 = never)"),
    FL("upstream-max-requests-per-connection", U64, upstream.max_requests_per_connection, 0,
       1e12, "native client: a worker connection is closed after this many responses "
             "(0 = unlimited)"),
    FL("upstream-resend-window-ms", U64, upstream.resend_window_ms, 0, 1e7,
       "native client: a reused connection closed within this long of the request's write, "
       "before any response byte, re-sends it once on a fresh connection (0 = never)"),
    FL("max-routing-text-bytes", SIZE, max_routing_text_bytes, 0, 1e12,
      "routing text kept per request (longer is cut)"),
    FL("routing-text-cache-bytes", SIZE, routing_text_cache_bytes, 0, 1e12,
      "memory for the routing texts of recent messages, reused when a later turn sends them "
      "again (0 = none)"),
    FL("session-keys", STR, session_keys, 0, 0,
      "session id sources: comma list of header:NAME and body:PATH"),
    FL("max-usage-scan-bytes", SIZE, max_usage_bytes, 0, 1e9,
      "JSON response bytes kept to read token usage"),
    FL("pd-max-prefill-bytes", SIZE, pd_max_prefill_bytes, 1024, 1e9,
      "largest prefill worker answer read for its kv_transfer_params and usage (larger: a "
      "prefill failure)"),
    FL("pd-prefill-timeout-ms", U64, pd_prefill_timeout_ms, 0, 1e10,
      "a prefill call's whole answer must come within this (0 = only the upstream deadlines); "
      "later: a prefill failure (another prefill worker, then a local prefill)"),
    {.name = "kv-events", .type = KVR_FLAG_CUSTOM, .off = OFF(kv_events_args),
     .help = "WORKER_URL=ENDPOINT[,REPLAY_ENDPOINT]: the worker's vLLM KV-event PUB (and "
             "replay) sockets, e.g. tcp://10.0.0.5:5557 (repeatable)",
     .set = set_kv_events, .show = show_worker},
    FL("teach-completion-max-bytes", SIZE, teach_completion_max_bytes, 0, 1e9,
       "a reply up to this size is taught after its prompt, so follow-ups find it (0 = off)"),
    FL("max-kv-blocks", SIZE, kv.max_blocks, 1, 1e10,
       "KV block index entries over all workers (stores past it are skipped)"),
    FL("kv-events-stale-ms", U64, kv.stale_ms, 1, 1e10,
       "a worker serving requests without a KV event this long turns degraded"),
    FL("kv-speculative-ms", U64, kv.speculative_ms, 0, 1e9,
       "a routed request's blocks count as resident this long unless an event settles them"),
    FL("kv-events-queue", SIZE, kv.ingest.queue_batches, 1, 1e8,
       "decoded KV-event batches waiting for the event loop (overflow resyncs the worker)"),
    FL("kv-events-max-bytes", SIZE, kv.ingest.max_message_bytes, 1024, 1e10,
       "largest KV-event message accepted"),
    FL("tokenize-timeout-ms", U64, tokenize.timeout_ms, 1, 1e9,
       "deadline of a worker /tokenize call for precise routing (then approximate)"),
    FL("tokenize-cache-entries", SIZE, tokenize.cache_entries, 0, 1e8,
       "token id lists kept for repeated routing texts (0 = no cache)"),
    FL("otlp-endpoint", STR, otlp.endpoint, 0, 0,
       "OpenTelemetry collector URL for traces, OTLP/HTTP JSON, e.g. "
       "http://127.0.0.1:4318/v1/traces (unset = no tracing)"),
    FL("otlp-sample-ratio", DOUBLE, otlp.sample_ratio, 0, 1,
       "share of new traces recorded (a client's traceparent decides for its own)"),
    FL("otlp-service-name", STR, otlp.service_name, 0, 0, "service.name of kvroute's spans"),
    FL("otlp-batch-size", SIZE, otlp.batch_size, 1, 1e6, "spans per OTLP export"),
    FL("otlp-flush-ms", U64, otlp.flush_ms, 1, 3600000,
       "longest a finished span waits before it is exported"),
    FL("otlp-max-queue", SIZE, otlp.max_queue, 1, 1e8,
       "spans waiting for export (more are dropped and counted)"),
    FL("otlp-timeout-ms", U64, otlp.timeout_ms, 1, 3600000,
       "an OTLP export not answered by then is abandoned (its spans dropped)"),
    FL("access-log", STR, access_log, 0, 0,
       "JSON-lines access log, one line per API request: a file, or - for stdout "
       "(unset = off; reopened on SIGUSR1)"),
    FL("access-log-buffer-bytes", SIZE, access_log_buffer_bytes, 4096, 1e10,
       "access-log bytes held before they are written (lines past it are dropped and "
       "counted)"),
    FL("status-ttft-samples", SIZE, status_ttft_samples, 1, 1e7,
       "recent TTFTs the admin GET /status takes its p50/p99 from"),
    FL("redis", STR, cluster.url, 0, 0,
       "share routing state with the other replicas through this Redis: "
       "redis://[user:pass@]host:port/db (unset = this replica alone)"),
    FL("redis-key-prefix", STR, cluster.key_prefix, 0, 0,
       "prefix of kvroute's Redis keys: replicas with the same Redis and prefix are one cluster"),
    FL("redis-password-file", STR, cluster.password_file, 0, 0,
       "file whose first line is the Redis password (wins over the URL's)"),
    FL("replica-id", STR, cluster.replica_id, 0, 0,
       "this replica's name in the cluster (default: host name and pid)"),
    FL("redis-log-max-len", SIZE, cluster.log_max_len, 1, 1e10,
       "routing-log entries Redis keeps (XADD MAXLEN ~)"),
    FL("redis-flush-ms", U64, cluster.flush_ms, 1, 60000,
       "longest a routing-log entry waits before it is sent (entries are batched)"),
    FL("redis-warm-max-entries", SIZE, cluster.warm_max_entries, 0, 1e10,
       "newest routing-log entries replayed at start"),
    FL("redis-warm-timeout-ms", U64, cluster.warm_timeout_ms, 0, 3600000,
       "/readyz waits no longer than this for the routing-log replay"),
    FL("redis-warm-hold-ms", U64, cluster.warm_hold_ms, 0, 600000,
       "a request arriving during the warm start waits for it at most this long (0 = never)"),
    FL("redis-load-interval-ms", U64, cluster.load_interval_ms, 10, 600000,
       "period of the in-flight counts published to and read from the other replicas"),
    FL("redis-timeout-ms", U64, cluster.timeout_ms, 1, 60000,
       "longest a request waits for the cross-replica rate-limit check"),
    FL("redis-stall-ms", U64, cluster.stall_ms, 10, 600000,
       "a Redis command unanswered this long marks Redis down (reconnect)"),
    FL("redis-queue-max", SIZE, cluster.queue_max, 1, 1e9,
       "routing-log entries held while Redis is away (more are dropped and counted)"),
    FL("redis-queue-max-bytes", SIZE, cluster.queue_max_bytes, 4096, 1e12,
       "bytes of routing-log entries held while Redis is away (more are dropped and counted)"),
    FL("redis-entry-max-blocks", SIZE, cluster.entry_max_blocks, 1, 65536,
       "block keys one routing-log entry carries (longer texts: their first blocks)"),
};

#define NFLAGS (sizeof(flags) / sizeof(flags[0]))
#define NROUTE_FLAGS (sizeof(route_flags) / sizeof(route_flags[0]))

const kvr_flag *kvr_config_flags(size_t *n)
{
    *n = NFLAGS;
    return flags;
}

const kvr_flag *kvr_config_route_flags(size_t *n)
{
    *n = NROUTE_FLAGS;
    return route_flags;
}

/* The arena: a singly linked list of blocks, each one allocation. Config loading is rare
 * (start, reload) and small, so simplicity beats packing. */
typedef struct arena_block {
    struct arena_block *next;
    max_align_t data[];
} arena_block;

void *kvr_config_alloc(kvr_config *c, size_t size)
{
    arena_block *b = calloc(1, sizeof(*b) + (size ? size : 1));
    if (!b)
        abort();
    b->next = c->arena;
    c->arena = b;
    return b->data;
}

char *kvr_config_strndup(kvr_config *c, const char *s, size_t n)
{
    char *d = kvr_config_alloc(c, n + 1);
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

void kvr_config_free(kvr_config *c)
{
    for (arena_block *b = c->arena, *n; b; b = n) {
        n = b->next;
        free(b);
    }
    c->arena = NULL;
    c->workers = NULL;
    c->nworkers = 0;
    c->routes = NULL;
    c->nroutes = 0;
}

void kvr_config_default(kvr_config *c)
{
    memset(c, 0, sizeof(*c));
    c->route.policy = "cache_aware";
    c->route.pd_mode = "vllm";
    c->pd_max_prefill_bytes = 4u << 20;
    c->pd_prefill_timeout_ms = 60000;
    c->route.prefill_policy = "cache_aware";
    c->route.decode_policy = "least_load";
    kvr_policy_cfg_default(&c->route.p);
    c->discovery_interval_s = 30;
    c->host = "127.0.0.1";
    c->port = 8000;
    c->admin_host = "127.0.0.1";
    c->drain_timeout_s = 30;
    c->shutdown_delay_ms = 5000;
    c->health_interval_ms = 2000;
    c->health_path = "/health";
    c->unhealthy_threshold = 2;
    c->healthy_threshold = 2;
    c->forget_after_ms = 30000;
    c->breaker = (kvr_breaker_cfg){.failures = 5, .cooldown_ms = 5000, .max_cooldown_ms = 60000};
    c->max_retries = 2;
    c->max_queue = 1024;
    c->queue_timeout_ms = 30000;
    c->retry_budget = 0.2;
    c->scrape_interval_s = 5;
    c->lmcache_interval_ms = 1000;
    c->retry_after_s = 1;
    c->log_level = "info";
    c->max_usage_bytes = 1 << 20;
    c->max_routing_text_bytes = 32u << 20;
    c->routing_text_cache_bytes = 64u << 20;
    kvr_kv_events_cfg_default(&c->kv);
    kvr_k8s_cfg_default(&c->k8s);
    c->teach_completion_max_bytes = 262144;
    c->tokenize = (kvr_tokenize_cfg){.timeout_ms = 100, .cache_entries = 4096};
    kvr_otlp_cfg_default(&c->otlp);
    c->access_log_buffer_bytes = 1u << 20;
    c->status_ttft_samples = 1024;
    kvr_cluster_cfg_default(&c->cluster);
    kvr_http_limits_default(&c->http);
    kvr_upstream_opts_default(&c->upstream);
}

/* --k8s-service is repeatable: each one is a Service watched. */
static int set_k8s_service(void *target, const kvr_flag *f, const char *v, char *err, size_t cap)
{
    (void)f;
    kvr_config *c = target;
    for (size_t i = 0; i < c->k8s.nservices; i++)
        if (strcmp(c->k8s.services[i], v) == 0)
            return 0;
    if (c->k8s.nservices >= KVR_K8S_MAX_SERVICES) {
        snprintf(err, cap, "too many Kubernetes services (max %d)", KVR_K8S_MAX_SERVICES);
        return -1;
    }
    c->k8s.services[c->k8s.nservices++] = v;
    return 0;
}

static void show_none(FILE *out, const void *target, const kvr_flag *f)
{
    (void)target;
    (void)f;
    fputs("none", out);
}

int kvr_config_split_dp(const char *arg, size_t *url_len, uint32_t *size)
{
    size_t n = strlen(arg);
    const char *at = strrchr(arg, '@');
    *url_len = n;
    *size = 0;
    if (!at || !at[1] || strspn(at + 1, "0123456789") != strlen(at + 1))
        return 0; /* no suffix: an '@' of the URL's userinfo is not one */
    *url_len = (size_t)(at - arg);
    if (strlen(at + 1) > 4 || atoi(at + 1) < 1 || atoi(at + 1) > KVR_MAX_DP_SIZE)
        return -1;
    *size = (uint32_t)atoi(at + 1);
    return 0;
}

/* --worker, --prefill and --decode are repeatable: each one appends a worker named by its URL,
 * with the flag's role; a trailing "@N" makes it a data-parallel engine of N ranks. */
static int set_worker(void *target, const kvr_flag *f, const char *v, char *err, size_t cap)
{
    kvr_config *c = target;
    kvr_worker_role role = !strcmp(f->name, "prefill")  ? KVR_ROLE_PREFILL
                           : !strcmp(f->name, "decode") ? KVR_ROLE_DECODE
                                                        : KVR_ROLE_BOTH;
    if (c->nworkers >= KVR_MAX_WORKERS) {
        snprintf(err, cap, "too many workers (max %d)", KVR_MAX_WORKERS);
        return -1;
    }
    size_t ul;
    uint32_t dp;
    if (kvr_config_split_dp(v, &ul, &dp) < 0) {
        snprintf(err, cap, "--%s %s: the data-parallel size after '@' must be 1..%d", f->name,
                 v, KVR_MAX_DP_SIZE);
        return -1;
    }
    const char *url = ul == strlen(v) ? v : kvr_config_strndup(c, v, ul);
    kvr_worker_spec *nw = kvr_config_alloc(c, (c->nworkers + 1) * sizeof(*nw));
    if (c->nworkers)
        memcpy(nw, c->workers, c->nworkers * sizeof(*nw));
    nw[c->nworkers++] = (kvr_worker_spec){.url = url, .name = url, .weight = 1,
                                          .data_parallel_size = dp, .role = role};
    c->workers = nw;
    return 0;
}

static void show_worker(FILE *out, const void *target, const kvr_flag *f)
{
    (void)target;
    fputs(strcmp(f->name, "worker") == 0 ? "required without a config file" : "none", out);
}

/* --scorer is repeatable: the first replaces the defaults (and the file's) entirely, so that
 * the command line says all there is, as a route's `scorers` map does. */
static int set_scorer(void *target, const kvr_flag *f, const char *v, char *err, size_t cap)
{
    (void)f;
    kvr_config *c = target;
    char e[300];
    if (kvr_scorers_parse(v, c->route.p.scorers, !c->scorer_args, e, sizeof(e)) < 0) {
        snprintf(err, cap, "--scorer: %s", e);
        return -1;
    }
    c->scorer_args++;
    return 0;
}

static int set_route_scorers(void *target, const kvr_flag *f, const char *v, char *err,
                             size_t cap)
{
    char e[300];
    if (kvr_scorers_parse(v, (double *)((char *)target + f->off), 1, e, sizeof(e)) < 0) {
        snprintf(err, cap, "--%s: %s", f->name, e);
        return -1;
    }
    return 0;
}

static void show_scorers(FILE *out, const void *target, const kvr_flag *f)
{
    (void)target;
    (void)f;
    double w[KVR_NSCORERS];
    char buf[256];
    kvr_scorers_default(w);
    kvr_scorers_format(w, buf, sizeof(buf));
    fputs(buf, out);
}

/* --kv-events is repeatable; each is matched to its worker once every flag is read. */
static int set_kv_events(void *target, const kvr_flag *f, const char *v, char *err, size_t cap)
{
    (void)f;
    kvr_config *c = target;
    const char *eq = strchr(v, '=');
    if (!eq || eq == v || !eq[1]) {
        snprintf(err, cap, "--kv-events: expected WORKER_URL=ENDPOINT[,REPLAY_ENDPOINT], got '%s'",
                 v);
        return -1;
    }
    if (c->nkv_events_args >= KVR_MAX_WORKERS) {
        snprintf(err, cap, "--kv-events: too many (max %d)", KVR_MAX_WORKERS);
        return -1;
    }
    const char **a = kvr_config_alloc(c, (c->nkv_events_args + 1) * sizeof(*a));
    if (c->nkv_events_args)
        memcpy(a, c->kv_events_args, c->nkv_events_args * sizeof(*a));
    a[c->nkv_events_args++] = v;
    c->kv_events_args = a;
    return 0;
}

static int set_upstream_client(void *target, const kvr_flag *f, const char *v, char *err,
                               size_t cap)
{
    kvr_upstream_client *c = (kvr_upstream_client *)((char *)target + f->off);
    if (!strcmp(v, "native"))
        *c = KVR_UP_CLIENT_NATIVE;
    else if (!strcmp(v, "curl"))
        *c = KVR_UP_CLIENT_CURL;
    else {
        snprintf(err, cap, "--upstream-client: expected native or curl, got '%s'", v);
        return -1;
    }
    return 0;
}

static void show_upstream_client(FILE *out, const void *target, const kvr_flag *f)
{
    const kvr_upstream_client *c = (const kvr_upstream_client *)((const char *)target + f->off);
    fputs(*c == KVR_UP_CLIENT_CURL ? "curl" : "native", out);
}

/* "--config FILE" / "--config=FILE" anywhere in argv: the file is read before the flags. */
static const char *find_config_arg(int argc, char **argv)
{
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--config") == 0 && i + 1 < argc)
            path = argv[++i];
        else if (strncmp(argv[i], "--config=", 9) == 0)
            path = argv[i] + 9;
    }
    return path;
}

/* Where a spec was written, for messages: "FILE:LINE:COL" or "command line". */
static void where(const kvr_config *c, int line, int col, char *out, size_t cap)
{
    if (line > 0 && c->config_file)
        snprintf(out, cap, "%s:%d:%d", c->config_file, line, col);
    else
        snprintf(out, cap, "command line");
}

int kvr_config_url_ok(const char *u)
{
    if (strncmp(u, "http://", 7) != 0)
        return 0;
    if (strchr(u, '#'))
        return 0; /* a fragment is never sent, and URL#r names a data-parallel rank */
    const char *h = u + 7;
    size_t hl = strcspn(h, "/?#");
    if (hl == 0 || h[0] == ':' || h[0] == '@')
        return 0;
    for (const char *p = u; *p; p++)
        if ((unsigned char)*p <= 0x20 || *p == 0x7f)
            return 0;
    const char *pe = h + hl, *colon;
    if (h[0] == '[') { /* an IPv6 literal: "[addr]" then, optionally, ":port" */
        const char *close = memchr(h, ']', hl);
        if (!close || close == h + 1 || (close + 1 < pe && close[1] != ':'))
            return 0;
        colon = close + 1 < pe ? close + 1 : NULL;
    } else {
        colon = memchr(h, ':', hl);
    }
    if (colon) {
        if (colon + 1 == pe)
            return 0;
        long port = 0;
        for (const char *p = colon + 1; p < pe; p++) {
            if (*p < '0' || *p > '9')
                return 0;
            port = port * 10 + (*p - '0');
            if (port > 65535)
                return 0;
        }
        if (port == 0)
            return 0;
    }
    return 1;
}

int kvr_config_same_url(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    while (la && a[la - 1] == '/')
        la--;
    while (lb && b[lb - 1] == '/')
        lb--;
    return la == lb && memcmp(a, b, la) == 0;
}

static const kvr_worker_spec *find_worker(const kvr_config *c, const char *name)
{
    for (size_t i = 0; i < c->nworkers; i++)
        if (strcmp(c->workers[i].name, name) == 0)
            return &c->workers[i];
    /* A worker named otherwise may still be referred to by its URL. */
    for (size_t i = 0; i < c->nworkers; i++)
        if (strcmp(c->workers[i].url, name) == 0)
            return &c->workers[i];
    return NULL;
}

/* Every route name and alias must be distinct across all routes. */
static void check_names(const kvr_config *c, kvr_errlist *errs)
{
    char at[600];
    size_t names = 0;
    for (size_t r = 0; r < c->nroutes; r++)
        names += 1 + c->routes[r].naliases;
    if (names > KVR_MAX_ROUTE_NAMES) {
        /* The check below is quadratic, and reloads run on the event loop. */
        where(c, c->routes[0].line, c->routes[0].col, at, sizeof(at));
        kvr_errlist_add(errs, "%s: %zu route names and aliases (max %d)", at, names,
                        KVR_MAX_ROUTE_NAMES);
        return;
    }
    for (size_t r = 0; r < c->nroutes; r++) {
        const kvr_route_spec *rs = &c->routes[r];
        for (size_t a = 0; a <= rs->naliases; a++) {
            const char *nm = a == 0 ? rs->name : rs->aliases[a - 1];
            int dup = 0;
            for (size_t q = 0; q <= r && !dup; q++) {
                const kvr_route_spec *o = &c->routes[q];
                size_t lim = q == r ? a : o->naliases + 1;
                for (size_t b = 0; b < lim && !dup; b++)
                    dup = strcmp(nm, b == 0 ? o->name : o->aliases[b - 1]) == 0;
            }
            if (dup) {
                where(c, rs->line, rs->col, at, sizeof(at));
                kvr_errlist_add(errs, "%s: duplicate route name or alias '%s'", at, nm);
            }
        }
    }
}

/* Every configured endpoint must pass the egress policy (seed 004: a denied one makes the
 * configuration fail to load, naming the entry and the rule). */
static void check_egress(const kvr_config *c, kvr_errlist *errs)
{
    char at[600], why[300];
    where(c, c->egress_line, c->egress_col, at, sizeof(at));
    kvr_egress *e = kvr_egress_new(c->egress_allow, c->negress_allow, c->egress_deny,
                                   c->negress_deny, at, errs);
    for (size_t i = 0; i < c->nworkers; i++) {
        const kvr_worker_spec *w = &c->workers[i];
        where(c, w->line, w->col, at, sizeof(at));
        if (!kvr_egress_check_url(e, w->url, why, sizeof(why)))
            kvr_errlist_add(errs, "%s: worker '%s' (%s) is refused by the egress policy: %s", at,
                            w->name, w->url, why);
        const char *eps[] = {w->kv_endpoint, w->kv_replay_endpoint};
        for (int k = 0; k < 2; k++)
            if (eps[k] && !kvr_egress_check_url(e, eps[k], why, sizeof(why)))
                kvr_errlist_add(errs, "%s: worker '%s': KV-event endpoint %s is refused by the "
                                "egress policy: %s", at, w->name, eps[k], why);
        if (w->lmcache_endpoint && !kvr_egress_check_url(e, w->lmcache_endpoint, why, sizeof(why)))
            kvr_errlist_add(errs, "%s: worker '%s': LMCache endpoint %s is refused by the egress "
                            "policy: %s", at, w->name, w->lmcache_endpoint, why);
    }
    const char *otlp = c->otlp.endpoint;
    if (otlp && *otlp && !kvr_egress_check_url(e, otlp, why, sizeof(why)))
        kvr_errlist_add(errs, "--otlp-endpoint %s is refused by the egress policy: %s", otlp,
                        why);
    kvr_egress_free(e);
}

int kvr_config_rank_name(const char *name)
{
    const char *h = strrchr(name, '#');
    return h && h[1] && strspn(h + 1, "0123456789") == strlen(h + 1);
}

int kvr_config_worker_url_ok(const char *u)
{
    return kvr_config_url_ok(u) && !strchr(u, '?');
}

static void check_workers(const kvr_config *c, kvr_errlist *errs)
{
    char at[600];
    for (size_t i = 0; i < c->nworkers; i++) {
        const kvr_worker_spec *w = &c->workers[i];
        where(c, w->line, w->col, at, sizeof(at));
        if (!kvr_config_worker_url_ok(w->url))
            kvr_errlist_add(errs, "%s: worker URL '%s' is malformed (expected http://HOST[:PORT])",
                            at, w->url);
        if (kvr_config_rank_name(w->name))
            kvr_errlist_add(errs, "%s: worker name '%s': names ending in #N are the ranks of "
                            "data-parallel workers", at, w->name);
        if (w->lmcache_endpoint && !kvr_config_url_ok(w->lmcache_endpoint))
            kvr_errlist_add(errs, "%s: worker '%s': LMCache endpoint '%s' is malformed (expected "
                            "http://HOST[:PORT]/PATH)", at, w->name, w->lmcache_endpoint);
        for (size_t j = 0; j < i; j++) {
            const kvr_worker_spec *o = &c->workers[j];
            if (kvr_config_same_url(o->url, w->url))
                kvr_errlist_add(errs, "%s: duplicate worker URL '%s'", at, w->url);
            else if (strcmp(o->name, w->name) == 0)
                kvr_errlist_add(errs, "%s: duplicate worker name '%s'", at, w->name);
            else if (strcmp(o->name, w->url) == 0 || strcmp(o->url, w->name) == 0)
                kvr_errlist_add(errs, "%s: worker '%s': a name may not be another worker's URL",
                                at, w->name);
        }
    }
}

/* "tcp://HOST:PORT", what kvroute resolves and ZeroMQ dials (the runtime's own parser). */
static int zmq_endpoint_ok(const char *e)
{
    char host[256], port[16];
    return kvr_kv_events_split(e, host, sizeof(host), port, sizeof(port)) == 0;
}

/* --kv-events WORKER_URL=ENDPOINT[,REPLAY] over the workers' own kv_events, then the shape of
 * every endpoint. */
static void check_kv_events(kvr_config *c, kvr_errlist *errs)
{
    char at[600];
    for (size_t i = 0; i < c->nkv_events_args; i++) {
        const char *a = c->kv_events_args[i], *eq = strchr(a, '=');
        char *url = kvr_config_strndup(c, a, (size_t)(eq - a));
        const char *comma = strchr(eq + 1, ',');
        kvr_worker_spec *w = NULL;
        for (size_t j = 0; j < c->nworkers && !w; j++)
            if (kvr_config_same_url(c->workers[j].url, url) ||
                strcmp(c->workers[j].name, url) == 0)
                w = &c->workers[j];
        if (!w) {
            kvr_errlist_add(errs, "--kv-events %s: no worker '%s'", a, url);
            continue;
        }
        w->kv_endpoint = comma ? kvr_config_strndup(c, eq + 1, (size_t)(comma - eq - 1))
                               : eq + 1;
        w->kv_replay_endpoint = comma ? comma + 1 : NULL;
    }
    for (size_t i = 0; i < c->nworkers; i++) {
        const kvr_worker_spec *w = &c->workers[i];
        const char *eps[] = {w->kv_endpoint, w->kv_replay_endpoint};
        where(c, w->line, w->col, at, sizeof(at));
        for (int k = 0; k < 2; k++)
            if (eps[k] && !zmq_endpoint_ok(eps[k]))
                kvr_errlist_add(errs, "%s: worker '%s': KV-event endpoint '%s' is malformed "
                                "(expected tcp://HOST:PORT with the worker's host: vLLM's "
                                "tcp://*:PORT is where it binds, not an address to dial)",
                                at, w->name, eps[k]);
        if (!w->kv_endpoint && w->kv_replay_endpoint)
            kvr_errlist_add(errs, "%s: worker '%s': a replay endpoint needs an endpoint", at,
                            w->name);
    }
}

/* Kubernetes discovery's names, so that --check catches what the start would refuse. */
static void check_k8s(const kvr_config *c, kvr_errlist *errs)
{
    for (size_t i = 0; i < c->k8s.nservices; i++)
        if (!kvr_k8s_dns_label(c->k8s.services[i]))
            kvr_errlist_add(errs, "--k8s-service '%.64s': not a Service name (a DNS label)",
                            c->k8s.services[i]);
    if (c->k8s.ns && !kvr_k8s_dns_label(c->k8s.ns))
        kvr_errlist_add(errs, "--k8s-namespace '%.64s': not a namespace name (a DNS label)",
                        c->k8s.ns);
    for (size_t i = 0; i < c->nroutes; i++)
        if (c->routes[i].k8s_service && !kvr_k8s_dns_label(c->routes[i].k8s_service))
            kvr_errlist_add(errs, "route '%s': service '%.64s': not a Service name (a DNS label)",
                            c->routes[i].name, c->routes[i].k8s_service);
    const char *ports[][2] = {{"--k8s-port", c->k8s.port},
                              {"--k8s-kv-events-port", c->k8s.kv_port},
                              {"--k8s-kv-replay-port", c->k8s.kv_replay_port}};
    for (size_t i = 0; i < sizeof(ports) / sizeof(ports[0]); i++)
        if (ports[i][1] && !kvr_k8s_port_ok(ports[i][1]))
            kvr_errlist_add(errs, "%s '%.64s': not a port (1-65535, or a port name)",
                            ports[i][0], ports[i][1]);
    if (c->k8s.api_url && strncmp(c->k8s.api_url, "https://", 8) != 0 &&
        strncmp(c->k8s.api_url, "http://", 7) != 0)
        kvr_errlist_add(errs, "--k8s-api-url %.200s: expected https://HOST[:PORT]",
                        c->k8s.api_url);
}

/* A route's prefill/decode settings (`at`: where to report, `name`: the route or NULL for the
 * defaults). */
static void check_pd(const kvr_route_cfg *rc, const char *at, const char *name,
                     kvr_errlist *errs)
{
    char who[400];
    if (name)
        snprintf(who, sizeof(who), "%s: route '%s': ", at, name);
    else
        who[0] = '\0';
    if (strcmp(rc->pd_mode, "vllm") && strcmp(rc->pd_mode, "sglang"))
        kvr_errlist_add(errs, "%spd mode '%s' (one of vllm, sglang)", who, rc->pd_mode);
    const char *pols[] = {rc->prefill_policy, rc->decode_policy};
    for (int i = 0; i < 2; i++)
        if (!kvr_policy_find(pols[i]))
            kvr_errlist_add(errs, "%s%s policy: unknown policy '%s' (one of %s)", who,
                            i ? "decode" : "prefill", pols[i], kvr_policy_names());
}

/* Without routes in the file, every worker is a target of the command line's routes: prefill
 * workers need a decode (or both) one beside them. */
static void check_cli_roles(const kvr_config *c, kvr_errlist *errs)
{
    size_t roles[3] = {0, 0, 0};
    for (size_t i = 0; i < c->nworkers; i++)
        roles[c->workers[i].role]++;
    if (!c->nroutes && roles[KVR_ROLE_PREFILL] && !roles[KVR_ROLE_DECODE] &&
        !roles[KVR_ROLE_BOTH])
        kvr_errlist_add(errs, "prefill workers (--prefill) need a decode worker (--decode, or "
                        "--worker for one that does both) to decode on");
    check_pd(&c->route, "", NULL, errs);
}

/* Applies each route's own settings over the defaults, and checks its targets. */
static void resolve_routes(kvr_config *c, kvr_errlist *errs)
{
    char at[600], err[512];
    for (size_t r = 0; r < c->nroutes; r++) {
        kvr_route_spec *rs = &c->routes[r];
        rs->cfg = c->route;
        for (size_t s = 0; s < rs->nsettings; s++) {
            const kvr_setting *st = &rs->settings[s];
            char name[128];
            snprintf(name, sizeof(name), "%s", st->key);
            for (char *p = name; *p; p++)
                if (*p == '_')
                    *p = '-';
            const kvr_flag *f = kvr_flags_find(route_flags, NROUTE_FLAGS, name);
            where(c, st->line, st->col, at, sizeof(at));
            if (!f)
                kvr_errlist_add(errs, "%s: unknown route key '%s'", at, st->key);
            else if (kvr_flags_set(f, &rs->cfg, st->value, err, sizeof(err)) < 0)
                kvr_errlist_add(errs, "%s: %s", at, err);
        }
        where(c, rs->line, rs->col, at, sizeof(at));
        if (!kvr_policy_find(rs->cfg.policy))
            kvr_errlist_add(errs, "%s: route '%s': unknown policy '%s' (one of %s)", at, rs->name,
                            rs->cfg.policy, kvr_policy_names());
        check_pd(&rs->cfg, at, rs->name, errs);
        size_t roles[3] = {0, 0, 0};
        for (size_t t = 0; t < rs->ntargets; t++) {
            const kvr_worker_spec *w = find_worker(c, rs->targets[t].worker);
            if (w)
                roles[w->role]++;
        }
        if (roles[KVR_ROLE_PREFILL] && !roles[KVR_ROLE_DECODE] && !roles[KVR_ROLE_BOTH])
            kvr_errlist_add(errs, "%s: route '%s' has prefill workers but no decode (or both) "
                            "worker to decode on", at, rs->name);
        if (rs->ntargets == 0 && !rs->k8s_service)
            kvr_errlist_add(errs, "%s: route '%s' has no targets (nor a Kubernetes `service`)",
                            at, rs->name);
        if (rs->k8s_service) {
            char e2[128];
            if (set_k8s_service(c, NULL, rs->k8s_service, e2, sizeof(e2)) < 0)
                kvr_errlist_add(errs, "%s: route '%s': %s", at, rs->name, e2);
        }
        for (size_t t = 0; t < rs->ntargets; t++) {
            const kvr_target_spec *ts = &rs->targets[t];
            where(c, ts->line, ts->col, at, sizeof(at));
            if (!find_worker(c, ts->worker))
                kvr_errlist_add(errs, "%s: route '%s': target names unknown worker '%s'", at,
                                rs->name, ts->worker);
            for (size_t u = 0; u < t; u++)
                if (find_worker(c, ts->worker) &&
                    find_worker(c, rs->targets[u].worker) == find_worker(c, ts->worker))
                    kvr_errlist_add(errs, "%s: route '%s': worker '%s' is a target twice", at,
                                    rs->name, ts->worker);
        }
    }
}

/* The collector URL: http:// (or https://, which libcurl also speaks) with a host. */
static void check_otlp(const kvr_config *c, kvr_errlist *errs)
{
    const char *u = c->otlp.endpoint;
    char http[2048];
    if (!u || !*u)
        return;
    int ok = kvr_config_url_ok(u);
    if (!ok && strncmp(u, "https://", 8) == 0 && strlen(u) < sizeof(http) - 8) {
        snprintf(http, sizeof(http), "http://%s", u + 8);
        ok = kvr_config_url_ok(http);
    }
    if (!ok)
        kvr_errlist_add(errs, "--otlp-endpoint '%s' is malformed (expected "
                        "http[s]://HOST[:PORT]/PATH, e.g. http://127.0.0.1:4318/v1/traces)", u);
    /* Span bodies are JSON: the service name must be UTF-8 (RFC 8259 §8.1). */
    json_t *name = json_string(c->otlp.service_name ? c->otlp.service_name : "");
    if (!name)
        kvr_errlist_add(errs, "--otlp-service-name is not valid UTF-8");
    json_decref(name);
}

/* "tcp://HOST:PORT" with PORT + `add` (vLLM offsets each data-parallel rank's publisher and
 * replay ports by its rank), in the arena; NULL when it is malformed or overflows. */
static const char *offset_port(kvr_config *c, const char *ep, uint32_t add)
{
    char out[300];
    if (!ep || kvr_kv_events_offset(ep, add, out, sizeof(out)) < 0)
        return NULL;
    return kvr_config_strndup(c, out, strlen(out));
}

static void check_dp(const kvr_config *c, kvr_errlist *errs)
{
    char at[600];
    size_t ranks = 0;
    for (size_t i = 0; i < c->nworkers; i++) {
        const kvr_worker_spec *w = &c->workers[i];
        uint32_t n = w->data_parallel_size > 1 ? w->data_parallel_size : 1;
        ranks += n;
        where(c, w->line, w->col, at, sizeof(at));
        if (w->data_parallel_size > KVR_MAX_DP_SIZE)
            kvr_errlist_add(errs, "%s: worker '%s': data_parallel_size %u is over %d", at, w->name,
                            w->data_parallel_size, KVR_MAX_DP_SIZE);
        if (w->kv_rank_port_offset && n > 1) {
            const char *eps[] = {w->kv_endpoint, w->kv_replay_endpoint};
            for (int k = 0; k < 2; k++)
                if (eps[k] && zmq_endpoint_ok(eps[k]) &&
                    !offset_port((kvr_config *)c, eps[k], n - 1))
                    kvr_errlist_add(errs, "%s: worker '%s': KV-event endpoint %s plus rank %u "
                                    "is past port 65535", at, w->name, eps[k], n - 1);
        }
    }
    if (ranks > KVR_MAX_RANK_WORKERS)
        kvr_errlist_add(errs, "data-parallel ranks make %zu workers (max %d)", ranks,
                        KVR_MAX_RANK_WORKERS);
}

/* A data-parallel worker becomes one worker spec per rank ("URL#r", named "NAME#r"), and a
 * route target naming it one target per rank, so everything after the configuration (the
 * registry, routes, indexes, metrics) sees ranks as workers. Run on a checked config. */
static void expand_dp(kvr_config *c)
{
    size_t n = 0;
    for (size_t i = 0; i < c->nworkers; i++)
        n += c->workers[i].data_parallel_size > 1 ? c->workers[i].data_parallel_size : 1;
    if (n == c->nworkers)
        return;
    kvr_worker_spec *ws = kvr_config_alloc(c, n * sizeof(*ws));
    size_t k = 0;
    char buf[2200];
    for (size_t i = 0; i < c->nworkers; i++) {
        const kvr_worker_spec *w = &c->workers[i];
        if (w->data_parallel_size <= 1) {
            ws[k++] = *w;
            continue;
        }
        for (uint32_t r = 0; r < w->data_parallel_size; r++) {
            kvr_worker_spec s = *w;
            s.dp_rank = (int)r;
            s.dp_url = w->url;
            snprintf(buf, sizeof(buf), "%s#%u", w->url, r);
            s.url = kvr_config_strndup(c, buf, strlen(buf));
            snprintf(buf, sizeof(buf), "%s#%u", w->name, r);
            s.name = kvr_config_strndup(c, buf, strlen(buf));
            if (w->kv_endpoint && w->kv_rank_port_offset) {
                s.kv_endpoint = offset_port(c, w->kv_endpoint, r);
                s.kv_replay_endpoint = w->kv_replay_endpoint
                                           ? offset_port(c, w->kv_replay_endpoint, r) : NULL;
            }
            ws[k++] = s;
        }
    }
    for (size_t r = 0; r < c->nroutes; r++) {
        kvr_route_spec *rs = &c->routes[r];
        size_t nt = 0;
        for (size_t t = 0; t < rs->ntargets; t++) {
            const kvr_worker_spec *w = find_worker(c, rs->targets[t].worker);
            nt += w && w->data_parallel_size > 1 ? w->data_parallel_size : 1;
        }
        if (nt == rs->ntargets)
            continue;
        kvr_target_spec *ts = kvr_config_alloc(c, nt * sizeof(*ts));
        size_t m = 0;
        for (size_t t = 0; t < rs->ntargets; t++) {
            const kvr_worker_spec *w = find_worker(c, rs->targets[t].worker);
            if (!w || w->data_parallel_size <= 1) {
                ts[m++] = rs->targets[t];
                continue;
            }
            for (uint32_t q = 0; q < w->data_parallel_size; q++) {
                ts[m] = rs->targets[t];
                snprintf(buf, sizeof(buf), "%s#%u", w->name, q);
                ts[m++].worker = kvr_config_strndup(c, buf, strlen(buf));
            }
        }
        rs->targets = ts;
        rs->ntargets = m;
    }
    c->workers = ws;
    c->nworkers = k;
}

int kvr_config_load(kvr_config *c, int argc, char **argv, kvr_errlist *errs)
{
    size_t before = errs->n;
    char err[512];
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            kvr_config_usage(stdout);
            return 1;
        }
    const char *path = find_config_arg(argc, argv);
    if (path) {
        c->config_file = path;
        kvr_config_file_load(c, path, errs);
    }
    if (kvr_flags_parse(flags, NFLAGS, c, argc, argv, err, sizeof(err)) != 0) {
        kvr_errlist_add(errs, "%s", err);
        return -1;
    }
    if (!kvr_policy_find(c->route.policy))
        kvr_errlist_add(errs, "unknown policy '%s' (one of %s)", c->route.policy,
                        kvr_policy_names());
    /* A file that did not parse says so already: "no workers" would only repeat it. */
    int route_services = 0;
    for (size_t i = 0; i < c->nroutes; i++)
        route_services |= c->routes[i].k8s_service != NULL;
    if (c->nworkers == 0 && c->k8s.nservices == 0 && !route_services && errs->n == before)
        kvr_errlist_add(errs, path ? "%s:1:1: no workers: add a `workers:` list (or --worker URL)"
                                   : "at least one --worker URL is required (see --help)%s",
                        path ? path : "");
    if (c->nworkers > KVR_MAX_WORKERS)
        kvr_errlist_add(errs, "too many workers (max %d)", KVR_MAX_WORKERS);
    check_workers(c, errs);
    check_kv_events(c, errs);
    check_dp(c, errs);
    check_egress(c, errs);
    check_otlp(c, errs);
    check_k8s(c, errs);
    check_names(c, errs);
    if (c->cluster.url && *c->cluster.url) {
        char cerr[400];
        if (kvr_cluster_check(&c->cluster, cerr, sizeof(cerr)) < 0)
            kvr_errlist_add(errs, "%s", cerr);
    } else if ((c->cluster.key_prefix && strcmp(c->cluster.key_prefix, "kvroute:") != 0) ||
               c->cluster.password_file || c->cluster.replica_id) {
        /* Settings of a Redis without the Redis: sharing would silently be off. */
        kvr_errlist_add(errs, "--redis-key-prefix, --redis-password-file and --replica-id "
                        "(redis: key_prefix, password_file) need --redis URL (redis: url)");
    }
    resolve_routes(c, errs);
    check_cli_roles(c, errs);
    if (c->breaker.max_cooldown_ms < c->breaker.cooldown_ms)
        kvr_errlist_add(errs, "--breaker-max-cooldown-ms must be >= --breaker-cooldown-ms");
    if (c->nroutes && c->model) {
        char at[600];
        where(c, c->routes[0].line, c->routes[0].col, at, sizeof(at));
        kvr_errlist_add(errs, "%s: --model (or model:) cannot be combined with routes", at);
    }
    if (errs->n > before)
        return -1;
    expand_dp(c);
    return 0;
}

void kvr_config_summary(const kvr_config *c, char *out, size_t cap)
{
    size_t targets = 0;
    for (size_t r = 0; r < c->nroutes; r++)
        targets += c->routes[r].ntargets;
    size_t routes = c->nroutes;
    if (!routes && c->model) { /* --model: one route over every worker */
        routes = 1;
        targets = c->nworkers;
    }
    const char *mode = c->nroutes ? "" : c->model ? " (one route over every worker)"
                                                  : " (routes discovered from /v1/models)";
    snprintf(out, cap, "ok: %s: %zu routes, %zu workers, %zu targets%s",
             c->config_file ? c->config_file : "command line", routes, c->nworkers, targets,
             mode);
}

void kvr_config_usage(void *file)
{
    FILE *f = file;
    kvr_config d;
    kvr_config_default(&d);
    fprintf(f, "usage: kvroute --worker URL [--worker URL ...] [flags]\n"
               "       kvroute --config FILE [flags]     (flags win over the file)\n"
               "       kvroute --check --config FILE     (validate and exit)\n\n"
               "policies: %s\n\nflags (default in brackets):\n",
            kvr_policy_names());
    kvr_flags_usage(f, flags, NFLAGS, &d, 24);
}
