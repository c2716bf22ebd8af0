/* kvroute-sim process: its configuration (filled from flags by sim/main.c) and the run loop
 * that wires the HTTP server, the API, the engine, the KV pool, KV events and metrics on one
 * libuv loop. */
#ifndef KVR_SIM_SIM_H
#define KVR_SIM_SIM_H
#include <stddef.h>
#include <stdint.h>

#include "faults.h"
#include "kvevents.h"

/** Every setting of the simulator; see docs/sim.md for the flags and defaults. The defaults
 *  resemble Llama-3.1-8B on one H100 80 GB under vLLM. */
typedef struct kvr_sim_config {
    const char *host;                /**< HTTP bind address (127.0.0.1) */
    int port;                        /**< HTTP port (9001; 0 = ephemeral, logged) */
    const char *model;               /**< served model name */
    uint32_t kv_blocks;              /**< KV blocks (28000 ≈ 448K tokens of 128 KiB each) */
    uint32_t block_size;             /**< tokens per block (16, vLLM's CUDA default) */
    uint32_t max_num_seqs;           /**< running sequences (256) */
    uint32_t max_num_batched_tokens; /**< tokens per step (8192) */
    uint32_t max_model_len;          /**< prompt + output tokens (131072) */
    uint32_t default_max_tokens;     /**< output tokens when unset (16) */
    double prefill_us_per_token;     /**< µs (25) */
    double decode_us_per_token;      /**< µs per decoding sequence per step (80) */
    double step_overhead_us;         /**< µs per step (6000) */
    double decode_us_per_kv_token;   /**< µs per context token of a decoding sequence (0) */
    const char *profile;             /**< timing profile applied (profile.h), NULL = none */
    double time_scale;               /**< wall = model × scale (1; 0 = no sleeping) */
    const char *kv_events_endpoint;  /**< NULL = no KV events */
    const char *kv_events_replay_endpoint;
    const char *kv_events_topic;     /**< "" */
    int kv_events_map;               /**< map encoding (0 = array) */
    kvr_sim_ev_bind kv_events_bind;  /**< auto (vLLM's rule) */
    int kv_events_hwm;               /**< 100000 (vLLM) */
    size_t kv_events_buffer_steps;   /**< 10000 (vLLM) */
    size_t kv_events_buffer_bytes;   /**< 64 MiB */
    size_t kv_events_max_batch_bytes;/**< 16 MiB */
    uint64_t seed;                   /**< faults, output text, ids and the root block hash */
    size_t max_waiting;              /**< queued requests before 503 (10000) */
    size_t max_body_bytes;           /**< request body cap (32 MiB) */
    uint64_t close_after_requests;   /**< close each keep-alive connection after this many
                                          responses, unannounced (0 = never) */
    size_t detokenize_cache_entries; /**< pieces remembered for /detokenize (65536; 0 = none) */
    size_t max_stored_responses;     /**< /v1/responses kept for previous_response_id (10000) */
    uint32_t data_parallel_size;     /**< engine ranks behind the one port, each with its own
                                          --kv-blocks pool and scheduler (1; engine.h) */
    int kv_events_dp_shared;         /**< with several ranks: all publish on the one endpoint
                                          (1) rather than on endpoint port + rank (0) */
    int role;                        /**< kvr_sim_role (pd.h): both (0), prefill, decode */
    uint64_t kv_hold_ms;             /**< a prefill holds a request's blocks this long at most
                                          (480000, vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT) */
    size_t kv_hold_max_requests;     /**< holds at most (10000; the oldest ends first) */
    double kv_transfer_us_per_block; /**< model µs to transfer one block (80) */
    uint64_t kv_transfer_timeout_ms; /**< a decode's fetch, waiting included (30000) */
    int bootstrap_port;              /**< SGLang bootstrap server port (0 = none) */
    size_t request_log_size;         /**< requests GET /sim/requests keeps (1000) */
    kvr_sim_faults faults;           /**< initial fault settings */
} kvr_sim_config;

/** Fills `c` with the defaults. */
void kvr_sim_config_default(kvr_sim_config *c);
/** Sets the fields a profile defines (model, KV blocks, block size 16, batching limits,
 *  max_model_len, step costs) from the profile named `name` and records the name. Returns 0,
 *  or -1 (nothing changed) for an unknown name. */
int kvr_sim_config_apply_profile(kvr_sim_config *c, const char *name);
/** Runs the simulator until SIGINT/SIGTERM. Returns the process exit status (0, or 1 when a
 *  socket cannot be bound or memory runs out at start). */
int kvr_sim_run(const kvr_sim_config *c);

#endif
