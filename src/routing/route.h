/* Routes: the unit of routing (DESIGN §3a). A route is what a client names in `model`: a
 * public name and aliases, a policy instance with its learned state (session map, prefix
 * index, Responses API pins) and targets (worker, upstream model name, weight). Nothing
 * learned for one route decides for another; a worker may be a target of several routes.
 *
 * The proxy reaches routing only through this interface: pick (with workers to exclude, for
 * retries), teach, pin, explain. Eligibility lives here: a target is eligible when its worker
 * is (kvr_worker_eligible: healthy, not draining, not removed).
 *
 * Lifetime: routes are refcounted. The route table (kvr_route_table) holds one reference per
 * route; every request in progress holds one on the route it started with, so a reload can
 * swap the table while running requests finish on what they started with. A route holds a
 * reference on each target's worker (kvr_worker_ref), so a worker removed by a reload lives
 * until its last request ends. All on the loop thread. */
#ifndef KVR_ROUTING_ROUTE_H
#define KVR_ROUTING_ROUTE_H
#include <stddef.h>
#include <stdint.h>

#include "routing/policy.h"
#include "workers/worker.h"

/** One target: where the route may send a request. */
typedef struct kvr_route_target {
    kvr_worker *worker;   /**< referenced (kvr_worker_ref) while the route lives */
    char *model;          /**< the model name the worker knows (owned); the client's body is
                               rewritten to it when it differs */
    double weight;        /**< > 0 */
} kvr_route_target;

typedef struct kvr_route_state kvr_route_state;

/** How a disaggregated route splits a request between its prefill and decode workers. */
typedef enum kvr_pd_mode {
    KVR_PD_VLLM = 0, /**< vLLM's NixlConnector (the vllm-project/router's two stages): the
                          prefill worker gets a max_tokens 1 copy with kv_transfer_params,
                          then the decode worker the request plus the prefill's answer's
                          kv_transfer_params */
    KVR_PD_SGLANG,   /**< SGLang's bootstrap: both get the request with bootstrap_host,
                          bootstrap_port and bootstrap_room, at the same time */
} kvr_pd_mode;

/** "vllm" or "sglang", as the configuration spells them. */
const char *kvr_pd_mode_name(kvr_pd_mode m);

/** Prefill/decode disaggregation of a route (its targets include prefill-role workers and
 *  decode- or both-role ones). The route itself is the prefill side: its policy
 *  (prefill_policy) owns sessions, the prefix index, KV events and completion teaching, and
 *  picks among its prefill-role targets (callers exclude the others,
 *  kvr_route_role_exclude); `decode` is a route of its own over the decode and both
 *  targets with decode_policy and its own state. */
typedef struct kvr_route_pd {
    kvr_pd_mode mode;
    struct kvr_route *decode; /**< owned reference */
} kvr_route_pd;

/** A route. Read-only after creation except through the functions below. */
typedef struct kvr_route {
    int refs;
    char *name;                    /**< public name: the `model` metric label (owned) */
    char **aliases;                /**< other public names (owned) */
    size_t naliases;
    const kvr_policy_ops *ops;     /**< its policy */
    kvr_policy_cfg cfg;            /**< the policy's tunables */
    kvr_route_target *targets;     /**< owned array */
    size_t ntargets;
    kvr_route_state *state;        /**< policy instance + pins; shared with the route of the
                                        same name after a reload that keeps it */
    kvr_worker **scratch;          /**< ntargets slots: eligible-set building */
    double *scratch_weights;       /**< ntargets slots: their target weights (policies get
                                        them as kvr_route_keys.weights) */
    kvr_explain_row *rows;         /**< ntargets slots: explain */
    kvr_route_pd *pd;              /**< disaggregation (owned), NULL for an ordinary route */
} kvr_route;

/** What a new route is made of. Strings and arrays are copied. */
typedef struct kvr_route_def {
    const char *name;
    const char *const *aliases;
    size_t naliases;
    const kvr_policy_ops *ops;
    const kvr_policy_cfg *cfg;
    const kvr_route_target *targets; /**< worker (referenced by the new route), model (copied;
                                          NULL = the route's name), weight (<= 0 → 1) */
    size_t ntargets;
    size_t response_pins;            /**< capacity of the Responses API pin map */
    uint64_t response_pin_ttl_ms;    /**< its TTL */
    const kvr_policy_ops *decode_ops; /**< the decode side's policy: with it, a route whose
                                          targets include prefill-role workers and others is
                                          disaggregated (`ops` is then its prefill side's);
                                          NULL = never */
    kvr_pd_mode pd_mode;             /**< with decode_ops */
} kvr_route_def;

/** Makes a route (refs = 1). When `prev` (the route of the same name in the table being
 *  replaced, may be NULL) has the same policy and compatible tunables (its `retune` accepts
 *  them, or they are equal), the new route shares prev's learned state, minus every worker
 *  that is not a target any more (forgotten at once). Returns NULL when memory ran out or the
 *  policy could not be created. */
kvr_route *kvr_route_new(const kvr_route_def *def, kvr_route *prev);
/** Reference counting; the last unref frees the route (and its state when unshared). */
void kvr_route_ref(kvr_route *r);
void kvr_route_unref(kvr_route *r);

/** Fills `out` (room for r->ntargets) with the eligible workers, in target order; returns
 *  how many. */
size_t kvr_route_eligible(kvr_route *r, kvr_worker **out);
/** How many of the route's workers wait for their breaker's trial (kvr_worker_on_trial). */
size_t kvr_route_on_trial(const kvr_route *r);

/** Picks a worker for a request with keys `k` among the eligible targets whose worker id is
 *  not in `exclude` (nex ids: workers already tried). A Responses API request continuing a
 *  stored response (`pin`, pin_len bytes: its previous_response_id, NULL if none) goes to the
 *  worker that produced it when that worker is eligible and not excluded (decision
 *  "session_id_match", match -1). Returns 0 with `out` and `*target` filled, or -1 when no
 *  target can take it. Learns nothing. */
int kvr_route_pick(kvr_route *r, const size_t *exclude, size_t nex, const kvr_route_keys *k,
                   const char *pin, size_t pin_len, kvr_pick *out,
                   const kvr_route_target **target);

/** As kvr_route_pick over every eligible target whose worker id is not in `exclude` (nex
 *  ids), also describing each one (its target weight included): `*rows` points to r->rows
 *  (valid until the next call on `r`), `*nrows` eligible rows.
 *  Returns 0, or -1 when no target is eligible. */
int kvr_route_explain(kvr_route *r, const size_t *exclude, size_t nex, const kvr_route_keys *k,
                      const char *pin, size_t pin_len, kvr_pick *out,
                      const kvr_explain_row **rows, size_t *nrows);

/** Appends to `ex` (n ids there, room for cap) the worker ids of `r`'s targets that are not
 *  on one side of a disaggregated route: with `prefill`, those whose role is not prefill
 *  (what a prefill pick excludes); without, the prefill-role ones (what a decode or local
 *  prefill pick excludes). Returns the new count (nothing added for an ordinary route). */
size_t kvr_route_role_exclude(const kvr_route *r, int prefill, size_t *ex, size_t n, size_t cap);

/** The target of `w` in `r`, or NULL when `w` is not one. */
const kvr_route_target *kvr_route_target_of(const kvr_route *r, const kvr_worker *w);

/** Worker `w` answered 2xx headers for a request with keys `k`: learn it (nothing for a
 *  worker that was removed meanwhile). */
void kvr_route_teach(kvr_route *r, kvr_worker *w, const kvr_route_keys *k);
/** Another replica taught `w` (the shared routing log): the policy learns it as it would
 *  have from kvr_route_teach. Nothing when `w` is not a target of `r`, was removed, or the
 *  policy learns nothing. */
void kvr_route_learn(kvr_route *r, kvr_worker *w, const kvr_learned *l);
/** Worker `w`, chosen by `pick` (approximate index), reported `cached` of `prompt` prompt
 *  tokens cached, off the prediction by more than one block: the policy corrects what it
 *  learned (cache_aware and precise: self-correcting index, policy_cache_aware.h) and, when it
 *  did, `k` (the request's keys as routed) is taught again, since `w` has just cached that
 *  prompt. Returns 1 when a correction was made, 0 otherwise (a removed worker, a policy
 *  without `correct`, nothing to correct). */
int kvr_route_correct(kvr_route *r, kvr_worker *w, const kvr_route_keys *k, const kvr_pick *pick,
                      int64_t cached, int64_t prompt);
/** An attempt with keys `k` was just sent to `w` (policies that predict residency record it). */
void kvr_route_sent(kvr_route *r, kvr_worker *w, const kvr_route_keys *k);
/** cost's prefill accounting of one attempt (kvr_policy_ops.prefill_start / prefill_end): the
 *  attempt just sent to `w` predicts `tokens` uncached prompt tokens (its pick's
 *  prefill_tokens); returns what was outstanding there before it (0 for other policies). */
double kvr_route_prefill_start(kvr_route *r, kvr_worker *w, double tokens);
/** ... and its prefill is over: first token after `ms`, or `ms` < 0 (ended without one, or a
 *  first byte that says nothing about prefill). Once per kvr_route_prefill_start. */
void kvr_route_prefill_end(kvr_route *r, kvr_worker *w, double tokens, double ahead, double ms);
/** Worker `w` produced the stored response `id` (len bytes): later requests continuing it
 *  go there. */
void kvr_route_pin_response(kvr_route *r, const char *id, size_t len, kvr_worker *w);
/** The stored response `id` (len bytes) was deleted: its pin goes (a later request naming it
 *  is answered 404 by kvroute, as for any unknown id). */
void kvr_route_unpin_response(kvr_route *r, const char *id, size_t len);
/** The worker id holding response `id`, looked up without touching it: 1 and `*worker_id`,
 *  or 0 when unknown or expired. */
int kvr_route_find_response(kvr_route *r, const char *id, size_t len, size_t *worker_id);
/** Forgets everything learned about `w` (it left, restarted or lost its cache). */
void kvr_route_forget_worker(kvr_route *r, kvr_worker *w);
/** Drops up to `max` expired sessions and pins. */
void kvr_route_sweep(kvr_route *r, size_t max);
/** The policy's counters (zeros for policies that learn nothing). */
void kvr_route_stats(kvr_route *r, kvr_policy_stats *out);
/** What the route learned about `w` (zeros when nothing). */
void kvr_route_worker_stats(kvr_route *r, const kvr_worker *w, kvr_policy_worker_stats *out);

/** Retry budget (DESIGN §11: retries stop storms). Counts one client request of the route. */
void kvr_route_count_request(kvr_route *r, uint64_t now_ms);
/** 1 when one more retry fits: retries over the last 10 s stay below `share` × the route's
 *  requests over the same 10 s, plus 3 per second (30); the retry is then counted. */
int kvr_route_retry_allowed(kvr_route *r, double share, uint64_t now_ms);

/** A set of routes looked up by public name or alias. */
typedef struct kvr_route_table {
    kvr_route **routes;  /**< one reference each */
    size_t n;
} kvr_route_table;

/** An empty table (never NULL; aborts on out of memory). */
kvr_route_table *kvr_route_table_new(void);
/** Adds `r`, taking over the caller's reference. */
void kvr_route_table_add(kvr_route_table *t, kvr_route *r);
/** The route named `model` (name or alias, exact), or NULL. Borrowed. */
kvr_route *kvr_route_table_find(const kvr_route_table *t, const char *model);
/** Drops the table's references and frees it. NULL is fine. */
void kvr_route_table_free(kvr_route_table *t);

#endif
