/* kvroute-sim's /metrics under vLLM's names (vllm/v1/metrics/loggers.py;
 * ../shared/reference/vllm-kv-events.md §3), on the shared registry (src/obs/metrics.h).
 * Labels are vLLM's: model_name and engine (the data-parallel rank, "0" without data
 * parallelism: one instance per rank, as vLLM's PrometheusStatLogger labels each engine
 * index), plus finished_reason where vLLM has it.
 *
 *   gauges     vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc
 *   counters   vllm:prefix_cache_queries_total, vllm:prefix_cache_hits_total (tokens, once per
 *              request at admission), vllm:prompt_tokens_total (at the first token, as vLLM),
 *              vllm:generation_tokens_total, vllm:num_preemptions_total,
 *              vllm:request_success_total{finished_reason}
 *   histograms vllm:time_to_first_token_seconds, vllm:inter_token_latency_seconds,
 *              vllm:e2e_request_latency_seconds, vllm:request_queue_time_seconds
 *              (vLLM's buckets; wall-clock seconds, so with --time-scale they are scaled too)
 *   info       vllm:cache_config_info{block_size, num_gpu_blocks, …} = 1
 *
 * Totals are kept as integers on the hot path and mirrored into the registry when /metrics
 * is rendered, so a request costs no label lookups for them. */
#ifndef KVR_SIM_VMETRICS_H
#define KVR_SIM_VMETRICS_H
#include <stddef.h>
#include <stdint.h>

#include "kvcache.h"
#include "obs/metrics.h"
#include "scheduler.h"

typedef struct kvr_sim_vmetrics kvr_sim_vmetrics;

/** Registers the families on `reg` (not owned; registering again for another rank reuses
 *  them) for `model` and the series of engine `engine` (its rank); reads gauges and cache
 *  counters from `sched` and `kv` at each render. NULL on OOM. */
kvr_sim_vmetrics *kvr_sim_vmetrics_new(kvr_metrics *reg, const char *model, int engine,
                                       kvr_sim_sched *sched, kvr_sim_kv *kv);
/** Frees `vm` (NULL is fine); call after the registry has rendered for the last time, since
 *  the render hook points at it. */
void kvr_sim_vmetrics_free(kvr_sim_vmetrics *vm);

/** A request produced its first token: TTFT and queue time in seconds, its prompt length
 *  (counts one generation token too). */
void kvr_sim_vmetrics_first_token(kvr_sim_vmetrics *vm, double ttft_s, double queue_s,
                                  size_t prompt_tokens);
/** A token other than the first was produced, `itl_s` seconds after the previous one. */
void kvr_sim_vmetrics_token(kvr_sim_vmetrics *vm, double itl_s);
/** A request finished normally after `e2e_s` seconds (finished_reason "length"). */
void kvr_sim_vmetrics_finished(kvr_sim_vmetrics *vm, double e2e_s);
/** Generation tokens counted so far. */
uint64_t kvr_sim_vmetrics_generation_tokens(const kvr_sim_vmetrics *vm);

#endif
