/* kvroute's configuration: every flag, its default and its bounds (one declarative table in
 * src/config/config.c), optionally a YAML file (src/config/file.c) read first, so that a flag
 * given on the command line wins over the file. The result is one validated kvr_config: global
 * settings, the workers and the routes (DESIGN §3a). */
#ifndef KVR_CONFIG_CONFIG_H
#define KVR_CONFIG_CONFIG_H
#include <stddef.h>
#include <stdint.h>

#include "cluster/cluster.h"
#include "events/kvevents.h"
#include "http/server.h"
#include "obs/otlp.h"
#include "proxy/tokenize.h"
#include "routing/policy.h"
#include "upstream/upstream.h"
#include "util/errlist.h"
#include "util/flags.h"
#include "workers/breaker.h"
#include "workers/k8s.h"
#include "workers/worker.h"

#define KVR_MAX_WORKERS 256
/** Most route names and aliases in all (the uniqueness check is quadratic, on the loop). */
#define KVR_MAX_ROUTE_NAMES 4096

/** What a route is configured with besides its name and targets: its policy and the policy's
 *  tunables. Per-route keys of the file (and the `defaults` section) use the flag names with
 *  underscores: policy, cache_threshold, balance_abs_threshold, balance_rel_threshold,
 *  session_ttl, max_sessions, block_bytes, max_index_blocks, worker_index_blocks,
 *  hash_load_factor, and `scorers` (a mapping NAME: WEIGHT that replaces the default pipeline
 *  scorer weights entirely; --scorer NAME=WEIGHT on the command line). */
typedef struct kvr_route_cfg {
    const char *policy;   /**< policy name (kvr_policy_find), "cache_aware" by default */
    kvr_policy_cfg p;     /**< its tunables */
    /* Prefill/decode disaggregation (a route whose targets include prefill-role workers;
     * file: a route's `pd: {mode, prefill_policy, decode_policy}`, flags --pd-mode,
     * --pd-prefill-policy, --pd-decode-policy). Each side gets its own policy instance with
     * the route's tunables (`p`). */
    const char *pd_mode;         /**< "vllm" (NixlConnector, sequential; default) or
                                      "sglang" (bootstrap, concurrent) */
    const char *prefill_policy;  /**< the prefill side's policy ("cache_aware") */
    const char *decode_policy;   /**< the decode side's policy ("least_load") */
} kvr_route_cfg;

/** One worker as configured. Strings are owned by the kvr_config (its arena). */
typedef struct kvr_worker_spec {
    const char *url;      /**< base URL exactly as written (the worker's identity) */
    const char *name;     /**< its name; defaults to the URL */
    double weight;        /**< > 0 (1) */
    const char *api_key_file; /**< file whose first line is the worker's own API key, sent as
                                   `Authorization: Bearer` on every request kvroute makes to
                                   it (NULL = none); never printed */
    const char *api_key_env;  /**< or: environment variable holding that key (NULL = none) */
    uint32_t max_inflight;    /**< most attempts in flight at this worker (0 = no limit);
                                   more wait in the admission queue */
    const char *kv_endpoint;  /**< file `kv_events.endpoint` or --kv-events: its vLLM KV-event
                                   PUB socket, "tcp://HOST:PORT" (NULL = no events) */
    const char *kv_replay_endpoint; /**< `kv_events.replay_endpoint`: its replay ROUTER */
    const char *kv_topic;     /**< `kv_events.topic`: SUB prefix (NULL = "") */
    const char *lmcache_endpoint; /**< `lmcache.endpoint`: the full http:// URL polled for its
                                       LMCache status (lmcache_aware), NULL = none */
    uint32_t data_parallel_size; /**< `data_parallel_size` or --worker URL@N: the engine runs N
                                      data-parallel ranks behind one URL (vLLM
                                      --data-parallel-size); 0 or 1 = a plain worker. After
                                      kvr_config_load the spec is expanded into one spec per
                                      rank (see dp_rank) */
    int kv_rank_port_offset;  /**< `kv_events.rank_port_offset`: rank r publishes on the
                                   endpoint's port + r (vLLM's per-rank publishers); else all
                                   ranks' batches come on one endpoint, told apart by their
                                   data_parallel_rank */
    const char *dp_url;       /**< set by kvr_config_load's expansion: this spec is rank
                                   dp_rank of the engine at dp_url (the URL as written; its url
                                   is "dp_url#r", its name "NAME#r", its kv_events endpoints
                                   offset by r with rank_port_offset). NULL = a plain worker */
    int dp_rank;              /**< the rank (meaningful only with dp_url) */
    kvr_worker_role role;     /**< `role: prefill | decode | both` (both); --prefill URL and
                                   --decode URL add workers with that role */
    uint32_t bootstrap_port;  /**< `bootstrap_port`: the SGLang disaggregation bootstrap port
                                   of a prefill worker (0 = SGLang's default, 8998) */
    int line, col;        /**< 1-based position in the file; 0 from the command line */
} kvr_worker_spec;

/** Most data-parallel ranks one worker may have (`data_parallel_size`). */
#define KVR_MAX_DP_SIZE 256
/** Most registry workers a configuration may expand to (data-parallel ranks counted). */
#define KVR_MAX_RANK_WORKERS 4096

/** A per-route setting as written in the file (key with underscores, scalar value), applied
 *  over the route defaults once the command line is parsed. */
typedef struct kvr_setting {
    const char *key;      /**< e.g. "cache_threshold" */
    const char *value;    /**< the scalar as written, e.g. "0.7" */
    int line, col;        /**< position of the value (where its errors are reported) */
} kvr_setting;

/** One target of a route: a worker, the model name the worker knows, a weight. */
typedef struct kvr_target_spec {
    const char *worker;   /**< a worker's name (which defaults to its URL) */
    const char *model;    /**< upstream model name; NULL = the route's name */
    double weight;        /**< > 0; 0 = unset, the worker's weight */
    int line, col;
} kvr_target_spec;

/** One route: what a client names in `model`. */
typedef struct kvr_route_spec {
    const char *name;          /**< public model name */
    const char **aliases;      /**< other public names */
    size_t naliases;
    kvr_setting *settings;     /**< its own per-route keys, as written */
    size_t nsettings;
    kvr_route_cfg cfg;         /**< resolved: defaults (file, then flags) + its settings */
    kvr_target_spec *targets;
    size_t ntargets;
    const char *k8s_service;   /**< `service`: a Kubernetes Service whose discovered workers
                                    are targets of this route (and of no other; the service is
                                    watched as a --k8s-service is); NULL = none. A route with
                                    one may have no `targets` */
    int line, col;
} kvr_route_spec;

/** One per-key rate limit (config `rate_limits: {NAME: {...}}`); 0 = no limit of that kind. */
typedef struct kvr_rate_limit_spec {
    const char *key;              /**< the client key's NAME (from the key file) */
    uint64_t requests_per_minute;
    uint64_t tokens_per_minute;   /**< prompt tokens + max_tokens, settled against usage */
    int line, col;
} kvr_rate_limit_spec;

/** Everything the daemon is configured with. Strings point into argv or into the config's
 *  arena (owned; freed by kvr_config_free). */
typedef struct kvr_config {
    const char *config_file;       /**< --config FILE (NULL = command line only) */
    int check;                     /**< --check: validate, print a summary, exit */
    const char *model;             /**< --model: one route of that name over every worker;
                                        NULL (and no routes in the file) = discover */
    uint64_t discovery_interval_s; /**< --discovery-interval: seconds between /v1/models
                                        reads of every worker when discovering (30) */
    kvr_route_cfg route;           /**< --policy and the per-route flags: defaults of every
                                        route (the file's `defaults` section, flags win) */
    kvr_worker_spec *workers;      /**< the file's workers, then each --worker */
    size_t nworkers;
    kvr_route_spec *routes;        /**< the file's routes (none from the command line) */
    size_t nroutes;
    const char *api_key_file;      /**< --api-key-file; file: auth.api_keys_file. Client keys,
                                        one per line, optional `NAME:` prefix, `#` comments
                                        (NULL = no client auth) */
    int metrics_require_key;       /**< --metrics-require-key: /metrics needs a client key */
    const char **egress_allow;     /**< file: egress.allow — CIDRs, IPs or host globs */
    size_t negress_allow;
    const char **egress_deny;      /**< file: egress.deny (deny wins over allow) */
    size_t negress_deny;
    int egress_line, egress_col;   /**< where `egress` was written (messages) */
    kvr_rate_limit_spec *rate_limits; /**< file: rate_limits */
    size_t nrate_limits;
    uint64_t max_inflight;         /**< --max-inflight: attempts in flight in the process
                                        (0 = unlimited); more wait in the queue */
    size_t max_queue;              /**< --max-queue: requests waiting for a slot (1024) */
    uint64_t queue_timeout_ms;     /**< --queue-timeout-ms: longest wait in the queue (30000) */

    const char *host;              /**< --host (127.0.0.1); file: listen.host */
    int port;                      /**< --port (8000); file: listen.port */
    const char *admin_host;        /**< --admin-host (127.0.0.1); file: admin.host */
    int admin_port;                /**< --admin-port (0 = off); file: admin.port */
    const char *admin_token_file;  /**< --admin-token-file (NULL = no auth); file:
                                        admin.token_file */
    uint64_t drain_timeout_s;      /**< --drain-timeout, seconds (30) */
    uint64_t shutdown_delay_ms;    /**< --shutdown-delay-ms (5000): on SIGTERM /readyz turns
                                        503 at once and kvroute keeps serving (new connections
                                        too) this long before it drains, so endpoints
                                        controllers and load balancers stop sending first
                                        (Kubernetes' Pod termination; 0 = drain at once) */
    uint64_t health_interval_ms;   /**< --health-interval-ms (2000; 0 = off) */
    uint32_t unhealthy_threshold;  /**< --unhealthy-threshold: failed checks in a row that make
                                        a worker unhealthy (2) */
    uint32_t healthy_threshold;    /**< --healthy-threshold: passed checks in a row that make
                                        it healthy again (2) */
    uint64_t forget_after_ms;      /**< --forget-after-ms: a worker down (unhealthy or
                                        unreachable) this long loses what was learned about
                                        it (30000); a restart (process_start_time_seconds
                                        changed) loses it at once */
    kvr_breaker_cfg breaker;       /**< --breaker-failures (5), --breaker-cooldown-ms (5000),
                                        --breaker-max-cooldown-ms (60000) */
    uint32_t max_retries;          /**< --max-retries: further attempts on untried workers (2) */
    double retry_budget;           /**< --retry-budget: retries may add this share of a route's
                                        requests over the last 10 s, plus 3 per second (0.2) */
    const char *health_path;       /**< --health-path (/health, vLLM's) */
    uint64_t scrape_interval_s;    /**< --scrape-interval, seconds (5; 0 = off) */
    uint64_t lmcache_interval_ms;  /**< --lmcache-interval-ms: period of the workers' LMCache
                                        status polls (1000) */
    uint64_t retry_after_s;        /**< --retry-after, seconds in 503 Retry-After (1) */
    const char *log_level;         /**< --log-level (info) */
    uint64_t seed;                 /**< --seed for tie-breaks (0 = from the clock) */
    kvr_http_limits http;          /**< --max-body-bytes, --max-header-bytes, --max-headers,
                                        --header-timeout-ms, --body-timeout-ms,
                                        --idle-timeout-ms, --write-buffer-bytes,
                                        --max-connections, --max-connections-per-ip */
    kvr_upstream_opts upstream;    /**< --connect-timeout-ms, --first-byte-timeout-ms,
                                        --stream-idle-timeout-ms, --max-worker-connections,
                                        --upstream-client, --upstream-max-idle,
                                        --upstream-idle-timeout-ms,
                                        --upstream-max-requests-per-connection */
    size_t max_routing_text_bytes; /**< --max-routing-text-bytes: routing text kept per request
                                        (32 MiB); longer texts are cut, which keeps the prefix
                                        property */
    size_t routing_text_cache_bytes; /**< --routing-text-cache-bytes: memory for the routing
                                        texts of recent messages (64 MiB; 0 = none), keyed by
                                        their raw bytes (routing/text_scan.h) */
    const char *session_keys;      /**< --session-keys: where session ids come from, as
                                        `header:NAME`/`body:PATH` list (DESIGN §5 default) */
    size_t max_usage_bytes;        /**< --max-usage-scan-bytes: JSON response bytes kept to read
                                        `usage` (1 MiB); larger bodies are relayed, not counted */
    size_t pd_max_prefill_bytes;   /**< --pd-max-prefill-bytes: a prefill worker's answer is
                                        read whole up to this size (4 MiB) for its
                                        kv_transfer_params and usage; a longer one is a
                                        prefill failure */
    uint64_t pd_prefill_timeout_ms; /**< --pd-prefill-timeout-ms: a prefill call (one token
                                         to generate) must be answered whole within this
                                         (60000; 0 = only the upstream deadlines), else it is
                                         a prefill failure: a stopped or stalled prefill
                                         worker does not hold requests for the 10-minute
                                         first-byte timeout */
    size_t teach_completion_max_bytes; /**< --teach-completion-max-bytes: a 2xx reply up to this
                                        size is taught with its prompt (262144; 0 = off) */
    kvr_kv_events_cfg kv;          /**< --max-kv-blocks, --kv-events-stale-ms,
                                        --kv-speculative-ms, --kv-events-queue,
                                        --kv-events-max-bytes */
    kvr_tokenize_cfg tokenize;     /**< --tokenize-timeout-ms, --tokenize-cache-entries */
    kvr_otlp_cfg otlp;             /**< --otlp-endpoint, --otlp-sample-ratio,
                                        --otlp-service-name, --otlp-batch-size,
                                        --otlp-flush-ms, --otlp-max-queue, --otlp-timeout-ms */
    const char *access_log;        /**< --access-log FILE or "-" (stdout); NULL = off */
    size_t access_log_buffer_bytes; /**< --access-log-buffer-bytes: access-log bytes held
                                        before written (1 MiB); lines past it are dropped */
    size_t status_ttft_samples;    /**< --status-ttft-samples: recent TTFTs behind /status's
                                        ttft_ms p50/p99 (1024) */
    kvr_k8s_cfg k8s;               /**< --k8s-service (repeatable), --k8s-namespace,
                                        --k8s-port, --k8s-api-url, --k8s-token-file,
                                        --k8s-ca-file, --k8s-kv-events-port,
                                        --k8s-kv-replay-port, --k8s-kv-topic,
                                        --k8s-watch-timeout-s,
                                        --k8s-backoff-max-ms, --k8s-max-event-bytes,
                                        --k8s-max-list-bytes, --k8s-max-endpoints; file:
                                        discovery.kubernetes {service, namespace, port,
                                        kv_events_port, kv_replay_port, kv_topic}.
                                        With a service, workers are optional */
    kvr_cluster_cfg cluster;       /**< --redis, --redis-key-prefix, --redis-password-file,
                                        --replica-id and the other --redis-* flags; file:
                                        redis {url, key_prefix, password_file} */
    const char **kv_events_args;   /**< each --kv-events WORKER_URL=ENDPOINT[,REPLAY] as given,
                                        applied over the workers' own kv_events at load */
    size_t nkv_events_args;
    size_t scorer_args;            /**< --scorer flags read so far (the first replaces the
                                        default scorer weights, later ones add to it) */
    void *arena;                   /**< owned allocations (strings, arrays); kvr_config_free */
} kvr_config;

/** Fills the defaults (no workers, no routes, empty arena). */
void kvr_config_default(kvr_config *c);

/** Builds the configuration: defaults, then the file named by --config (when given), then
 *  every flag of argv (argv[0] skipped), then each route's own settings over the defaults.
 *  Returns 0; 1 when --help was printed (exit 0); -1 with every problem in `errs`, one line
 *  each (`FILE:LINE:COL: message` for the file's, "--flag ..." for the command line's). The
 *  config must be freed with kvr_config_free() whatever the result. */
int kvr_config_load(kvr_config *c, int argc, char **argv, kvr_errlist *errs);

/** Frees what the config owns (its arena); strings from argv are not freed. */
void kvr_config_free(kvr_config *c);

/** One-line summary for --check: "ok: FILE: N routes, M workers, K targets" (or "command
 *  line" for FILE). Written into `out` (cap bytes). */
void kvr_config_summary(const kvr_config *c, char *out, size_t cap);

/** 1 when `name` ends in `#N` (a '#' then digits): the names of a data-parallel worker's ranks
 *  ("NAME#r"), which no configured or added worker may take. */
int kvr_config_rank_name(const char *name);
/** 1 when `u` is a worker's base URL: kvr_config_url_ok() and no query (the API paths are
 *  appended to it). */
int kvr_config_worker_url_ok(const char *u);
/** 1 when `u` is a worker base URL kvroute can use: http:// with a host and, if any, a port
 *  in 1..65535, no blanks or control bytes (the upstream client serves no other scheme), no
 *  fragment (never sent; `URL#r` is the name of a data-parallel rank). */
int kvr_config_url_ok(const char *u);
/** Splits --worker's argument "URL[@N]": `*url_len` = the URL's length, `*size` = N (0 when
 *  there is no suffix). Only a trailing '@' followed by digits is a suffix, so an '@' of the
 *  URL's userinfo ("http://u:p@h:9001") is part of the URL. Returns 0, or -1 when N is
 *  outside 1..KVR_MAX_DP_SIZE. */
int kvr_config_split_dp(const char *arg, size_t *url_len, uint32_t *size);
/** 1 when URLs `a` and `b` differ at most by trailing slashes: the same worker. */
int kvr_config_same_url(const char *a, const char *b);

/** Prints the flag reference (name, default, help) to `f` (a FILE *). */
void kvr_config_usage(void *file);

/** The global flag table (for the file loader: a top-level key k is the flag with k's '_'
 *  written '-'), and the per-route table (offsets into kvr_route_cfg). */
const kvr_flag *kvr_config_flags(size_t *n);
const kvr_flag *kvr_config_route_flags(size_t *n);

/** Arena helpers for the file loader: a copy of `s` (n bytes, NUL added) / zeroed `size`
 *  bytes, owned by `c` and freed by kvr_config_free. Abort on out of memory (config load). */
char *kvr_config_strndup(kvr_config *c, const char *s, size_t n);
void *kvr_config_alloc(kvr_config *c, size_t size);

/** Reads the YAML file `path` into `c` (src/config/file.c): top-level global keys through
 *  the global flag table, `listen` {host, port}, `admin` {host, port, token_file}, `auth`
 *  {api_keys_file} (→ c->api_key_file), `egress` {allow: [..], deny: [..]} (lists of scalars,
 *  kept as written with the section's position), `discovery` {kubernetes: {service,
 *  namespace, port, kv_events_port, kv_replay_port, kv_topic}} (the --k8s-* flags),
 *  `rate_limits` {NAME: {requests_per_minute,
 *  tokens_per_minute}} (non-negative integers), `defaults`
 *  (per-route keys, into c->route), `workers` (a list of {url, name, weight, api_key_file,
 *  api_key_env, max_inflight, kv_events, lmcache} maps or plain URL strings, appended to
 *  c->workers with their positions), `discovery` {kubernetes: {service, namespace, port,
 *  kv_events_port, kv_replay_port, kv_topic}} (the --k8s-* flags) and `routes` (a list of
 *  {name or model, aliases, targets, service (a Kubernetes Service feeding it), per-route
 *  keys}; targets are {worker, model, weight} maps or plain worker names;
 *  per-route keys are checked against the route table's types and bounds and
 *  kept as written in `settings`). Every other global flag but config, check and worker is a
 *  top-level key too (the last one written wins over `listen`/`admin`/`defaults`). At most
 *  KVR_MAX_WORKERS workers and targets per route. An entry missing its required key (url,
 *  worker, name) is reported and not kept, so every kept string is non-NULL. A value reused
 *  through a YAML anchor reports the anchor's position. `kvr_route_spec.cfg` is left for
 *  kvr_config_load. Checks syntax, types, bounds and unknown keys only; the
 *  cross-checks (duplicates, targets naming unknown workers, URLs) are kvr_config_load's, on
 *  the positions kept here. Every problem is added to `errs` as `PATH:LINE:COL: message` (an
 *  unknown key's did-you-mean on the same line); returns 0 when none was found, -1 otherwise
 *  (including a file that cannot be read: `PATH:0:0: cannot read: REASON`). */
int kvr_config_file_load(kvr_config *c, const char *path, kvr_errlist *errs);

#endif
