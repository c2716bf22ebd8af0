/* The prefill stage of a request on a disaggregated route (routing/route.h kvr_route_pd;
 * issue 21). The proxy runs a request there as stages: this prefill call, then (vLLM) the
 * decode attempt(s) relayed as any other request's, or (SGLang) both at once.
 *
 * A prefill call picks a prefill-role worker with the route's own policy (the prefill side:
 * sessions, prefix index, KV events and completion teaching live there), sends the body of
 * proxy/pd_body.h, reads the whole answer (at most --pd-max-prefill-bytes) and, for vLLM, its
 * `kv_transfer_params`. A failed attempt (no response, 5xx, an answer without
 * kv_transfer_params or over the limit) is retried on another eligible prefill worker, as
 * the failures issue's rules say for any attempt (--max-retries, the retry budget, workers
 * already tried excluded, never after a 4xx); when none is left the caller prefills locally
 * on a decode worker (decision pd_local_prefill). Each attempt holds one in-flight unit on its
 * worker (the proxy's slots, lent through kvr_pd_hooks), gives its breaker verdict and counts
 * kvroute_worker_requests_total, kvroute_upstream_errors_total and the prefill's usage
 * (kvroute_prompt_tokens_total / kvroute_cached_tokens_total under the prefill worker). The
 * prefill worker is taught the request's keys when its 2xx headers arrive (DESIGN §10). All on
 * the loop thread. */
#ifndef KVR_PROXY_PD_H
#define KVR_PROXY_PD_H
#include <stddef.h>

#include "app/app.h"
#include "proxy/pd_body.h"
#include "routing/keys.h"
#include "routing/route.h"

/** The proxy's accounting of attempts in flight (one unit per attempt, DESIGN §4 step 6). */
typedef struct kvr_pd_hooks {
    void (*slot_take)(kvr_worker *w);               /**< an attempt starts on `w` */
    void (*slot_give)(kvr_app *app, kvr_worker *w); /**< ... could not start after all */
    /** ... ended with status `code` (0 = no response): counted in
     *  kvroute_worker_requests_total{worker,code}, its slot given back. */
    void (*attempt_count)(kvr_app *app, kvr_worker *w, int code);
} kvr_pd_hooks;

/** What a prefill call is made of. Everything is borrowed until the call ends (its callback
 *  ran, or it was cancelled). */
typedef struct kvr_pd_request {
    kvr_app *app;
    kvr_route *route;             /**< a disaggregated route (route->pd set) */
    kvr_endpoint ep;              /**< chat or completions */
    const char *body;             /**< the client's JSON body, as validated */
    size_t len;
    const char *client_model;     /**< `model` as the client sent it (NULL: none) */
    const char *model;            /**< the route's public name: the `model` label */
    const kvr_http_header *hdrs;  /**< headers of every attempt (x-request-id included; the
                                       worker's own Authorization is added per attempt) */
    size_t nhdrs;
    const kvr_route_keys *keys;   /**< the request's routing keys */
    const kvr_pd_hooks *hooks;
    const size_t *exclude;        /**< prefill worker ids already tried for this request (an
                                       SGLang pair started again); they count in its attempts */
    size_t nexclude;
} kvr_pd_request;

/** How a prefill call ended. */
typedef struct kvr_pd_result {
    int ok;                /**< the prefill worker answered 2xx (vLLM: with kv_transfer_params) */
    char *kvtp;            /**< vLLM: its kv_transfer_params as compact JSON; the callback
                                takes it over (free()) */
    kvr_worker *worker;    /**< the worker of the last attempt (the one that prefilled when ok) */
    kvr_pick pick;         /**< its pick (decision, match) */
    const char *reason;    /**< !ok: the last failure ("no_prefill_worker", "connect",
                                "http_503", "no_kv_transfer_params", "too_large", ...) */
    int client_error;      /**< !ok: it was a 4xx (not retried elsewhere) */
    size_t attempts;       /**< prefill attempts this call started */
} kvr_pd_result;

typedef struct kvr_pd_call kvr_pd_call;
typedef void (*kvr_pd_done_fn)(void *ud, kvr_pd_result *res);

/** Starts the prefill stage of `rq`'s request in the route's mode. Returns the call, whose
 *  `done` runs once, later (never from inside this function), unless it is cancelled first;
 *  or NULL when no attempt could start, with `*now` saying why (its reason
 *  "no_prefill_worker" when no prefill worker was eligible). SGLang: one attempt, no retry
 *  here (the decode worker waits for that prefill's bootstrap room: the caller starts the
 *  pair again, naming the failed worker in `exclude`); its bootstrap is
 *  kvr_pd_call_bootstrap()'s. */
kvr_pd_call *kvr_pd_call_start(const kvr_pd_request *rq, kvr_pd_done_fn done, void *ud,
                               kvr_pd_result *now);
/** The current attempt's worker and pick (SGLang: the decode body needs its bootstrap). */
kvr_worker *kvr_pd_call_worker(const kvr_pd_call *c);
const kvr_pick *kvr_pd_call_pick(const kvr_pd_call *c);
/** SGLang: the bootstrap host, port and room both calls carry. */
const kvr_pd_bootstrap *kvr_pd_call_bootstrap(const kvr_pd_call *c);
/** Ends the call without its callback: the attempt in flight is cancelled (no breaker
 *  verdict). NULL is fine. */
void kvr_pd_call_cancel(kvr_pd_call *c);
/** Its request ended with the decode worker's whole answer while the prefill attempt is still
 *  in flight (SGLang: the decode may finish before the prefill's own answer arrives): the call
 *  goes on alone, without its callback or retries, so its worker still learns the prompt,
 *  counts its usage and gets its breaker verdict, and the engine is not told to abort a
 *  finished request. It frees itself when the attempt ends (--pd-prefill-timeout-ms bounds
 *  it). Copies what it still reads (the model label; the keys, when its headers have not
 *  arrived: the prefix index's kept block keys are not copied, the text is hashed again).
 *  Out of memory, or no attempt in flight, it is cancelled instead. NULL is fine. */
void kvr_pd_call_detach(kvr_pd_call *c);
/** Shutdown: cancels every detached call still in flight (before the upstream closes). */
void kvr_pd_detached_cancel_all(void);

#endif
