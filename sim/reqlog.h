/* kvroute-sim's log of the generation requests it received, for tests: GET /sim/requests
 * answers the last --request-log-size of them, oldest first, as a JSON array. Each entry is a
 * JSON object the API fills as the request goes (docs/sim.md lists the fields): what arrived
 * (path, x-request-id, X-data-parallel-rank, max_tokens, stream, kv_transfer_params,
 * bootstrap fields), where it ran (rank), what the transfer did and the final usage.
 * Single-threaded. */
#ifndef KVR_SIM_REQLOG_H
#define KVR_SIM_REQLOG_H
#include <jansson.h>
#include <stddef.h>

typedef struct kvr_sim_reqlog kvr_sim_reqlog;

/** A log of at most `max` entries (0: nothing is kept). NULL on OOM. */
kvr_sim_reqlog *kvr_sim_reqlog_new(size_t max);
void kvr_sim_reqlog_free(kvr_sim_reqlog *l);
/** Appends `entry` (a reference is taken), dropping the oldest past the cap. The caller may
 *  keep updating the object it holds; updates show in later listings while it is kept. */
void kvr_sim_reqlog_add(kvr_sim_reqlog *l, json_t *entry);
/** The entries, oldest first, as a new array (caller decrefs); NULL on OOM. */
json_t *kvr_sim_reqlog_list(const kvr_sim_reqlog *l);
/** Forgets every entry. */
void kvr_sim_reqlog_clear(kvr_sim_reqlog *l);

#endif
