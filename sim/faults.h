/* kvroute-sim fault injection, for tests of kvroute's retries, breakers and timeouts. Every
 * setting is a flag and can be changed at run time with POST /sim/faults (JSON object with the
 * same field names, partial updates allowed); GET /sim/faults shows them. Random failures draw
 * from util/rand seeded with --seed, so a given request order fails the same way every run. */
#ifndef KVR_SIM_FAULTS_H
#define KVR_SIM_FAULTS_H
#include <jansson.h>
#include <stdint.h>

/** Current fault settings. Negative event counts mean "off". */
typedef struct kvr_sim_faults {
    double fail_rate;         /**< probability in [0, 1] that a completion request fails */
    int fail_status;          /**< status of such a failure (500; 4xx/5xx) */
    uint64_t delay_ms;        /**< delay before a completion request is admitted, so before
                                   its response headers, ms */
    long stall_after_events;  /**< stop writing after this many SSE events (the connection
                                   stays open until the client leaves); non-streaming: 0
                                   means no response at all */
    long drop_after_events;   /**< close the connection after this many SSE events, without
                                   the terminating chunk; non-streaming: 0 means close before
                                   any byte */
    int health_status;        /**< status of GET /health (200) */
    long drop_event_batches;  /**< the next N KV-event batches are not sent on the PUB socket
                                   but still take their sequence number and go into the
                                   replay buffer (a subscriber sees a gap it can replay);
                                   counts down as batches are withheld (0) */
    int replay_silent;        /**< the replay ROUTER reads and ignores every request (0) */
    double kv_params_drop_rate;   /**< probability a prefill (pd.h) answers without
                                       kv_transfer_params and holds nothing (0) */
    double kv_transfer_fail_rate; /**< probability a KV transfer fails: a decode's fetch is
                                       not sent, a prefill answers a fetch with 500 (0) */
} kvr_sim_faults;

/** Defaults: no faults, fail_status 500, health 200. The KV-event faults are read by the
 *  publisher (kvevents.h) through the same struct. */
void kvr_sim_faults_default(kvr_sim_faults *f);
/** Draws whether the next completion request fails (one draw per request, in arrival order).*/
int kvr_sim_faults_should_fail(const kvr_sim_faults *f);
/** One draw that is true with probability `rate` (no draw, false, when rate <= 0). */
int kvr_sim_faults_draw(double rate);
/** Applies the fields present in `obj`. Returns 0, or -1 with `*err` set (nothing changed)
 *  when a field has the wrong type or range. */
int kvr_sim_faults_update(kvr_sim_faults *f, const json_t *obj, const char **err);
/** The settings as a new JSON object (caller decrefs). */
json_t *kvr_sim_faults_json(const kvr_sim_faults *f);

#endif
