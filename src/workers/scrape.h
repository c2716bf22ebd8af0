/* Worker metrics scraping: every --scrape-interval seconds kvroute reads each worker's
 * /metrics (vLLM's Prometheus names, vllm/v1/metrics/loggers.py) without blocking the loop. */
#ifndef KVR_WORKERS_SCRAPE_H
#define KVR_WORKERS_SCRAPE_H
#include "workers/ctx.h"

/** What one scrape found; fields are -1 when the worker did not publish them. */
typedef struct kvr_scrape_result {
    double running;   /**< Σ vllm:num_requests_running */
    double waiting;   /**< Σ vllm:num_requests_waiting */
    double kv_usage;  /**< max vllm:kv_cache_usage_perc (older: vllm:gpu_cache_usage_perc), 0..1 */
    double kv_tokens; /**< num_gpu_blocks × block_size from vllm:cache_config_info labels */
    double block_size; /**< its block_size label (0 when absent) */
    double start_time; /**< process_start_time_seconds (Prometheus client convention, which
                            vLLM's server exports): a change means the engine restarted */
} kvr_scrape_result;

/** Parses a vLLM /metrics text into `out`. Pure; used by the scraper and its tests. */
void kvr_scrape_parse(const char *text, size_t len, kvr_scrape_result *out);
/** The figures of data-parallel rank `rank` of `ranks` in an engine's /metrics text: vLLM
 *  labels each rank's series `engine="r"`, so samples labelled with another engine are left
 *  out. When no sample carries an `engine` label (one set of figures for the whole engine),
 *  running and waiting are shared evenly (÷ ranks) and the rest applies to every rank as it
 *  is. Pure. */
void kvr_scrape_parse_rank(const char *text, size_t len, int rank, int ranks,
                           kvr_scrape_result *out);

/** Starts the periodic scrape (no-op when cfg.scrape_interval_s is 0): one read per engine
 *  (a data-parallel engine's ranks take their figures from rank 0's read,
 *  kvr_scrape_parse_rank). Results go into each worker's queue/running/kv_usage/kv_tokens, the gauges ctx->queue and ctx->kv_usage; a
 *  changed process_start_time_seconds calls ctx->on_forget (the engine restarted empty);
 *  cache_aware takes a worker's index cap from kv_tokens when it next teaches it. */
void kvr_scrape_start(kvr_workers_ctx *ctx);
/** Stops the timer. */
void kvr_scrape_stop(void);

#endif
