/* kvroute-sim in a disaggregated (prefill/decode) fleet: --role, the emulated NixlConnector
 * (vLLM) and bootstrap handshake (SGLang). docs/sim.md, "Prefill/decode", tells the story; in
 * short:
 *
 * - Prefill side (role prefill or both, a request with kv_transfer_params.do_remote_decode;
 *   or role prefill and a bootstrap_room; or role both and a bootstrap_port that is its own
 *   --bootstrap-port): once the prompt is computed (first token) the
 *   prompt's full blocks are held (kvhold.h) under the response id (vLLM) or the room
 *   (SGLang), and a vLLM-mode JSON answer carries kv_transfer_params {do_remote_prefill: true,
 *   do_remote_decode: false, remote_engine_id, remote_block_ids, remote_host, remote_port,
 *   remote_request_id, tp_size: 1}, remote_host/port naming this sim's HTTP port.
 * - Transfer: GET /sim/kv_transfer/<remote_request_id> or /sim/bootstrap/<room> (kvxfer.h),
 *   answered from the hold (which then ends), or, with ?wait_ms=N, as soon as it exists
 *   within N ms (SGLang's decode asks before its prefill has finished); 404 otherwise.
 * - Decode side (role decode or both and do_remote_prefill; or role decode, or both with
 *   another bootstrap_port, and a bootstrap_room): before the request enters the scheduler the sim fetches the blocks over
 *   loopback HTTP (async on the loop, bounded by --kv-transfer-timeout-ms), checks they are
 *   its prompt's, caches them as computed blocks of the serving rank (BlockStored events go
 *   out as for any computed block) and holds them until the request ends, then waits
 *   blocks × --kv-transfer-us-per-block × --time-scale (the transfer time) and lets the
 *   request in: the scheduler finds them as a prefix hit, so usage.cached_tokens counts them
 *   and only the rest is prefilled. Any failure (no answer, HTTP error, timeout, wrong
 *   content, no free blocks, the fault) makes the request recompute its prompt, as vLLM's
 *   kv_load_failure_policy "recompute" does; the log and the metrics say so.
 * - Faults (faults.h): kv_params_drop_rate (a prefill answers without kv_transfer_params and
 *   holds nothing), kv_transfer_fail_rate (a decode's fetch fails without being sent; a
 *   prefill answers a fetch with 500 and ends the hold).
 *
 * Metrics (on the sim's registry): kvroute_sim:kv_transfer_blocks_total{result="fetched"|
 * "failed"}, kvroute_sim:kv_transfers_total{result}, kvroute_sim:kv_recomputed_requests_total
 * (decode side); kvroute_sim:kv_held_blocks, kvroute_sim:kv_held_requests,
 * kvroute_sim:kv_holds_total{outcome="fetched"|"expired"|"evicted"|"failed"},
 * kvroute_sim:kv_params_dropped_total (prefill side).
 * Single-threaded (the loop thread). */
#ifndef KVR_SIM_PD_H
#define KVR_SIM_PD_H
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "engine.h"
#include "faults.h"
#include "http/server.h"
#include "kvxfer.h"
#include "obs/metrics.h"
#include "util/buf.h"

/** --role: which side of a disaggregated pair this sim plays. */
typedef enum { KVR_SIM_ROLE_BOTH = 0, KVR_SIM_ROLE_PREFILL, KVR_SIM_ROLE_DECODE } kvr_sim_role;
/** "both", "prefill", "decode". */
const char *kvr_sim_role_name(kvr_sim_role r);

/** Settings (flags of the same names). */
typedef struct kvr_sim_pd_cfg {
    kvr_sim_role role;            /**< both (vLLM's kv_both) */
    uint64_t hold_ms;             /**< --kv-hold-ms: a prefill's hold lapses after (480000,
                                       vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT) */
    size_t hold_max;              /**< --kv-hold-max-requests: holds at most (oldest ends) */
    double transfer_us_per_block; /**< --kv-transfer-us-per-block: model µs per block */
    double time_scale;            /**< wall = model × scale */
    uint64_t transfer_timeout_ms; /**< --kv-transfer-timeout-ms: a fetch, waiting included */
    const char *host;             /**< this sim's HTTP address (remote_host; a wildcard
                                       address is answered as 127.0.0.1) */
    uint32_t max_blocks;          /**< blocks a transfer may carry (the longest prompt's) */
    int bootstrap_port;           /**< --bootstrap-port (0 = none): a `both` sim given
                                       bootstrap fields naming it is the prefill */
} kvr_sim_pd_cfg;

typedef struct kvr_sim_pd kvr_sim_pd;

/** Creates the P/D state on `loop` with its metrics on `reg`; `faults` is shared. NULL on
 *  OOM. */
kvr_sim_pd *kvr_sim_pd_new(uv_loop_t *loop, const kvr_sim_pd_cfg *cfg, kvr_metrics *reg,
                           kvr_sim_faults *faults);
/** The role this sim plays (--role). */
kvr_sim_role kvr_sim_pd_role(const kvr_sim_pd *pd);
/** The HTTP port this sim answers on (remote_port), once bound. */
void kvr_sim_pd_set_port(kvr_sim_pd *pd, int port);
/** Shutdown while the loop runs: ends fetches in flight (their requests must have been
 *  cancelled already), answers waiting transfers with 503 and closes handles. */
void kvr_sim_pd_close(kvr_sim_pd *pd);
/** Frees after the loop ended, releasing every hold (the engines must still exist). */
void kvr_sim_pd_free(kvr_sim_pd *pd);

/** Which part of a transfer request `p` asks this sim to play. */
typedef enum { KVR_SIM_PD_NONE, KVR_SIM_PD_PREFILL, KVR_SIM_PD_DECODE } kvr_sim_pd_part;
kvr_sim_pd_part kvr_sim_pd_part_of(const kvr_sim_pd *pd, const kvr_sim_xfer_params *p);

/** Prefill side, once the prompt (`ntok` ids) is computed on rank `e`: holds its full blocks
 *  under `request_id` (vLLM) or the room (SGLang, `p` has a room and no do_remote_decode),
 *  answers fetches already waiting for them, and for vLLM mode appends the response's
 *  kv_transfer_params object to `params_out`. Returns the blocks held (>= 0), -2 when the
 *  kv_params_drop_rate fault dropped them (nothing held or appended), -1 on OOM. */
long kvr_sim_pd_hold(kvr_sim_pd *pd, const kvr_sim_xfer_params *p, const char *request_id,
                     const kvr_sim_engine *e, const uint32_t *prompt, size_t ntok,
                     kvr_buf *params_out);

/** Serves GET /sim/kv_transfer/<segment> (`bootstrap` 0) or /sim/bootstrap/<segment> (1)
 *  with the request target's optional ?wait_ms=N (capped at --kv-transfer-timeout-ms). */
void kvr_sim_pd_serve(kvr_sim_pd *pd, kvr_http_req *req, const char *segment, int bootstrap);

/** How a decode's fetch ended. */
typedef struct kvr_sim_pd_result {
    int fetched;         /**< 1: the blocks are cached and held for the request */
    size_t blocks;       /**< blocks fetched, or announced but not obtained */
    const char *reason;  /**< why it failed (NULL when fetched) */
} kvr_sim_pd_result;

typedef struct kvr_sim_pd_fetch kvr_sim_pd_fetch;
/** Called once, from the loop, never from inside kvr_sim_pd_fetch_start(). */
typedef void (*kvr_sim_pd_done)(void *ud, const kvr_sim_pd_result *res);

/** Decode side: fetches the prompt's blocks for rank `e` as `p` says (prompt copied);
 *  `request_id` names the request in the log. Returns the fetch (never NULL except on OOM);
 *  `done` follows, after the transfer time when fetched. */
kvr_sim_pd_fetch *kvr_sim_pd_fetch_start(kvr_sim_pd *pd, const kvr_sim_xfer_params *p,
                                         const char *request_id, kvr_sim_engine *e,
                                         const uint32_t *prompt, size_t ntok,
                                         kvr_sim_pd_done done, void *ud);
/** Ends a fetch: before `done` it is cancelled (no callback); after, the blocks it held for
 *  the request are released. Frees it (asynchronously). */
void kvr_sim_pd_fetch_end(kvr_sim_pd_fetch *f);

#endif
