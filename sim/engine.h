/* kvroute-sim's engine ranks. A vLLM engine started with --data-parallel-size N runs N engine
 * cores behind one API server; each rank has its own KV cache (as big as a single engine's:
 * every rank is a full model replica on its own GPUs), its own scheduler, its own metrics
 * series (label engine="<rank>") and its own KV-event publisher (port + rank), its batches
 * carrying data_parallel_rank = rank. The sim builds one kvr_sim_engine per rank on the one
 * loop; with N = 1 it is exactly the single engine it always was.
 *
 * KV events with N > 1 (--kv-events-dp): `per-rank` (default, vLLM's layout) binds or
 * connects rank r's PUB at the endpoint offset by r (kvevents.h:
 * kvr_sim_events_offset_endpoint), the replay ROUTER too, each with its own sequence;
 * `shared` puts every rank on the one endpoint given, with one sequence and one replay buffer,
 * ranks told apart only by data_parallel_rank (a deployment whose ranks publish to one
 * collector). */
#ifndef KVR_SIM_ENGINE_H
#define KVR_SIM_ENGINE_H
#include <stddef.h>
#include <uv.h>

#include "faults.h"
#include "kvcache.h"
#include "kvevents.h"
#include "obs/metrics.h"
#include "scheduler.h"
#include "sim.h"
#include "vmetrics.h"

/** One data-parallel rank. Its members are owned by the set it belongs to. */
typedef struct kvr_sim_engine {
    int rank;                /**< 0 .. N-1 */
    kvr_sim_kv *kv;          /**< its own pool of --kv-blocks blocks */
    kvr_sim_sched *sched;    /**< its own scheduler */
    kvr_sim_vmetrics *vm;    /**< its engine="<rank>" series */
    kvr_sim_events *events;  /**< the publisher its pool's events go to (NULL: none); shared
                                  by every rank with --kv-events-dp shared */
    size_t ev_idx;           /**< its batch index in `events` */
    int owns_events;         /**< 1 when this rank closes `events` */
} kvr_sim_engine;

/** Creates c->data_parallel_size ranks on `loop`, their metrics on `reg` and (with
 *  c->kv_events_endpoint) their publishers; `faults` is shared (not owned). Returns the array
 *  (kvr_sim_engines_free), or NULL with a message in `err` (an endpoint that cannot be bound
 *  or offset, out of memory); nothing is left open then. */
kvr_sim_engine *kvr_sim_engines_new(uv_loop_t *loop, const kvr_sim_config *c, kvr_metrics *reg,
                                    kvr_sim_faults *faults, char *err, size_t cap);
/** Aborts every rank's sequences and closes schedulers and publishers (the loop must run to
 *  finish closing). */
void kvr_sim_engines_close(kvr_sim_engine *e, size_t n);
/** Frees the array once the loop has ended (metrics and pools; NULL is fine). */
void kvr_sim_engines_free(kvr_sim_engine *e, size_t n);

#endif
