/* vLLM-named Prometheus metrics of kvroute-sim. */
#include "vmetrics.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* vLLM's bucket lists (vllm/v1/metrics/loggers.py). */
static const double ttft_buckets[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
                                      0.25,  0.5,   0.75, 1.0,  2.5,  5.0,  7.5,  10.0,
                                      20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
static const double itl_buckets[] = {0.01, 0.025, 0.05, 0.075, 0.1,  0.15, 0.2,
                                     0.3,  0.4,   0.5,  0.75,  1.0,  2.5,  5.0,
                                     7.5,  10.0,  20.0, 40.0,  80.0};
static const double latency_buckets[] = {0.3,  0.5,  0.8,  1.0,   1.5,   2.0,   2.5,
                                         5.0,  10.0, 15.0, 20.0,  30.0,  40.0,  50.0,
                                         60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

#define N(a) (sizeof(a) / sizeof(*(a)))

struct kvr_sim_vmetrics {
    kvr_sim_sched *sched;
    kvr_sim_kv *kv;
    char *model;
    char engine[16];
    const char *lv[2]; /* model_name, engine */
    kvr_metric *running, *waiting, *usage, *queries, *hits, *prompt, *gen, *preempt, *success;
    kvr_metric *ttft, *itl, *e2e, *queue;
    uint64_t prompt_total, gen_total, success_total;
};

static void on_render(void *ud)
{
    kvr_sim_vmetrics *vm = ud;
    kvr_metric_set(vm->running, vm->lv, (double)kvr_sim_sched_num_running(vm->sched));
    kvr_metric_set(vm->waiting, vm->lv, (double)kvr_sim_sched_num_waiting(vm->sched));
    kvr_metric_set(vm->usage, vm->lv, kvr_sim_kv_usage(vm->kv));
    kvr_metric_set(vm->queries, vm->lv, (double)kvr_sim_sched_cache_queries(vm->sched));
    kvr_metric_set(vm->hits, vm->lv, (double)kvr_sim_sched_cache_hits(vm->sched));
    kvr_metric_set(vm->preempt, vm->lv, (double)kvr_sim_sched_preemptions(vm->sched));
    kvr_metric_set(vm->prompt, vm->lv, (double)vm->prompt_total);
    kvr_metric_set(vm->gen, vm->lv, (double)vm->gen_total);
    const char *sv[3] = {vm->lv[0], vm->lv[1], "length"};
    kvr_metric_set(vm->success, sv, (double)vm->success_total);
}

kvr_sim_vmetrics *kvr_sim_vmetrics_new(kvr_metrics *reg, const char *model, int engine,
                                       kvr_sim_sched *sched, kvr_sim_kv *kv)
{
    kvr_sim_vmetrics *vm = calloc(1, sizeof(*vm));
    if (!vm)
        return NULL;
    vm->model = strdup(model);
    if (!vm->model) {
        free(vm);
        return NULL;
    }
    vm->sched = sched;
    vm->kv = kv;
    vm->lv[0] = vm->model;
    snprintf(vm->engine, sizeof(vm->engine), "%d", engine);
    vm->lv[1] = vm->engine;
    static const char *const l2[] = {"model_name", "engine"};
    static const char *const l3[] = {"model_name", "engine", "finished_reason"};
    vm->running = kvr_metrics_gauge(reg, "vllm:num_requests_running",
                                    "Number of requests in model execution batches.", 2, l2);
    vm->waiting = kvr_metrics_gauge(reg, "vllm:num_requests_waiting",
                                    "Number of requests waiting to be processed.", 2, l2);
    vm->usage = kvr_metrics_gauge(reg, "vllm:kv_cache_usage_perc",
                                  "KV-cache usage. 1 means 100 percent usage.", 2, l2);
    vm->queries = kvr_metrics_counter(reg, "vllm:prefix_cache_queries_total",
                                      "Prefix cache queries, in terms of number of queried "
                                      "tokens.",
                                      2, l2);
    vm->hits = kvr_metrics_counter(reg, "vllm:prefix_cache_hits_total",
                                   "Prefix cache hits, in terms of number of cached tokens.", 2,
                                   l2);
    vm->prompt = kvr_metrics_counter(reg, "vllm:prompt_tokens_total",
                                     "Number of prefill tokens processed.", 2, l2);
    vm->gen = kvr_metrics_counter(reg, "vllm:generation_tokens_total",
                                  "Number of generation tokens processed.", 2, l2);
    vm->preempt = kvr_metrics_counter(reg, "vllm:num_preemptions_total",
                                      "Cumulative number of preemption from the engine.", 2, l2);
    vm->success = kvr_metrics_counter(reg, "vllm:request_success_total",
                                      "Count of successfully processed requests.", 3, l3);
    vm->ttft = kvr_metrics_histogram(reg, "vllm:time_to_first_token_seconds",
                                     "Histogram of time to first token in seconds.", 2, l2,
                                     ttft_buckets, N(ttft_buckets));
    vm->itl = kvr_metrics_histogram(reg, "vllm:inter_token_latency_seconds",
                                    "Histogram of inter-token latency in seconds.", 2, l2,
                                    itl_buckets, N(itl_buckets));
    vm->e2e = kvr_metrics_histogram(reg, "vllm:e2e_request_latency_seconds",
                                    "Histogram of e2e request latency in seconds.", 2, l2,
                                    latency_buckets, N(latency_buckets));
    vm->queue = kvr_metrics_histogram(reg, "vllm:request_queue_time_seconds",
                                      "Histogram of time spent in WAITING phase for request.", 2,
                                      l2, latency_buckets, N(latency_buckets));
    /* vllm:cache_config_info: an info gauge whose labels are CacheConfig fields (vLLM adds
     * `engine`; we add model_name too so every sim series carries it). */
    static const char *const ci[] = {"model_name",        "engine",       "block_size",
                                     "num_gpu_blocks",    "cache_dtype",  "enable_prefix_caching",
                                     "gpu_memory_utilization", "prefix_caching_hash_algo"};
    kvr_metric *info = kvr_metrics_gauge(reg, "vllm:cache_config_info",
                                         "Information of the LLMEngine CacheConfig", N(ci), ci);
    char bs[16], nb[16];
    snprintf(bs, sizeof(bs), "%u", kvr_sim_kv_block_size(kv));
    snprintf(nb, sizeof(nb), "%u", kvr_sim_kv_num_blocks(kv));
    const char *cv[] = {vm->model, vm->engine, bs, nb, "auto", "True", "0.9", "xxh3_64"};
    kvr_metric_set(info, cv, 1);
    /* create the labelled series now so a fresh worker shows zeros, as vLLM does */
    on_render(vm);
    kvr_metrics_on_render(reg, on_render, vm);
    return vm;
}

void kvr_sim_vmetrics_free(kvr_sim_vmetrics *vm)
{
    if (!vm)
        return;
    free(vm->model);
    free(vm);
}

void kvr_sim_vmetrics_first_token(kvr_sim_vmetrics *vm, double ttft_s, double queue_s,
                                  size_t prompt_tokens)
{
    kvr_metric_observe(vm->ttft, vm->lv, ttft_s);
    kvr_metric_observe(vm->queue, vm->lv, queue_s);
    vm->prompt_total += prompt_tokens;
    vm->gen_total++;
}

void kvr_sim_vmetrics_token(kvr_sim_vmetrics *vm, double itl_s)
{
    kvr_metric_observe(vm->itl, vm->lv, itl_s);
    vm->gen_total++;
}

void kvr_sim_vmetrics_finished(kvr_sim_vmetrics *vm, double e2e_s)
{
    kvr_metric_observe(vm->e2e, vm->lv, e2e_s);
    vm->success_total++;
}

uint64_t kvr_sim_vmetrics_generation_tokens(const kvr_sim_vmetrics *vm)
{
    return vm->gen_total;
}
