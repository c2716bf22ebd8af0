/* kvroute's configuration: every flag, its default and its bounds, parsed from argv by one
 * declarative table (src/config/config.c). */
#ifndef KVR_CONFIG_CONFIG_H
#define KVR_CONFIG_CONFIG_H
#include <stddef.h>
#include <stdint.h>

#include "http/server.h"
#include "routing/policy.h"
#include "upstream/upstream.h"

#define KVR_MAX_WORKERS 256

/** Everything the daemon is configured with. Strings point into argv (not freed). */
typedef struct kvr_config {
    const char *workers[KVR_MAX_WORKERS]; /**< --worker URL (repeatable), as given */
    size_t nworkers;
    const char *model;             /**< --model; NULL = discover from workers' /v1/models */
    const char *policy;            /**< --policy (default cache_aware when available) */
    const char *host;              /**< --host (127.0.0.1) */
    int port;                      /**< --port (8000) */
    const char *admin_host;        /**< --admin-host (127.0.0.1) */
    int admin_port;                /**< --admin-port (0 = off) */
    const char *admin_token_file;  /**< --admin-token-file (NULL = no auth) */
    uint64_t drain_timeout_s;      /**< --drain-timeout, seconds (30) */
    uint64_t health_interval_ms;   /**< --health-interval-ms (2000; 0 = off) */
    const char *health_path;       /**< --health-path (/health, vLLM's) */
    uint64_t scrape_interval_s;    /**< --scrape-interval, seconds (5; 0 = off) */
    uint64_t retry_after_s;        /**< --retry-after, seconds in 503 Retry-After (1) */
    const char *log_level;         /**< --log-level (info) */
    uint64_t seed;                 /**< --seed for tie-breaks (0 = from the clock) */
    kvr_http_limits http;          /**< --max-body-bytes, --max-header-bytes, --max-headers,
                                        --header-timeout-ms, --body-timeout-ms,
                                        --idle-timeout-ms, --write-buffer-bytes,
                                        --max-connections */
    kvr_upstream_opts upstream;    /**< --connect-timeout-ms, --first-byte-timeout-ms,
                                        --stream-idle-timeout-ms, --max-worker-connections */
    kvr_policy_cfg policy_cfg;     /**< --cache-threshold, --balance-abs-threshold,
                                        --balance-rel-threshold, --session-ttl, --max-sessions,
                                        --block-bytes, --max-index-blocks,
                                        --worker-index-blocks */
    size_t max_routing_text_bytes; /**< --max-routing-text-bytes: routing text kept per request
                                        (32 MiB); longer texts are cut, which keeps the prefix
                                        property */
    const char *session_keys;      /**< --session-keys: where session ids come from, as
                                        `header:NAME`/`body:PATH` list (DESIGN §5 default) */
    size_t max_usage_bytes;        /**< --max-usage-scan-bytes: JSON response bytes kept to read
                                        `usage` (1 MiB); larger bodies are relayed, not counted */
} kvr_config;

/** Fills the defaults. */
void kvr_config_default(kvr_config *c);
/** Parses argv (argv[0] skipped). Returns 0; 1 when --help/--version was printed (exit 0);
 *  -1 with a message in `err` (cap bytes) on a bad flag or value. */
int kvr_config_parse(kvr_config *c, int argc, char **argv, char *err, size_t cap);
/** Prints the flag reference (name, default, help) to `f`. */
void kvr_config_usage(void *file);

#endif
