/* Routes and the route table (see route.h). */
#include "routing/route.h"

#include <stdlib.h>
#include <string.h>

#include "index/session_map.h"
#include "util/time.h"
#include "workers/registry.h"

#define BUDGET_SLOTS 10      /* one-second slots: the retry budget's 10 s window */
#define BUDGET_FREE_PER_S 3  /* retries always allowed per second, whatever the traffic */

/* What a route learned, shared by the successive versions of one route across reloads. */
struct kvr_route_state {
    int refs;
    uint64_t slot_sec[BUDGET_SLOTS]; /* which second each slot counts */
    uint32_t slot_requests[BUDGET_SLOTS];
    uint32_t slot_retries[BUDGET_SLOTS];
    const kvr_policy_ops *ops;
    void *policy;
    kvr_policy_cfg cfg;
    kvr_session_map *pins;   /* Responses API response id → worker id */
};

static void state_unref(kvr_route_state *s)
{
    if (!s || --s->refs > 0)
        return;
    if (s->policy)
        s->ops->destroy(s->policy);
    kvr_session_map_destroy(s->pins);
    free(s);
}

static kvr_route_state *state_new(const kvr_route_def *d)
{
    kvr_route_state *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->refs = 1;
    s->ops = d->ops;
    s->cfg = *d->cfg;
    s->policy = d->ops->create(d->cfg, d->name);
    s->pins = kvr_session_map_create(d->response_pin_ttl_ms ? d->response_pin_ttl_ms : 3600000,
                                     d->response_pins ? d->response_pins : 1000000);
    if (!s->policy || !s->pins) {
        state_unref(s);
        return NULL;
    }
    return s;
}

/* prev's state when the new definition can keep it: same policy, tunables it accepts. */
static kvr_route_state *reuse_state(const kvr_route_def *d, kvr_route *prev)
{
    if (!prev || prev->ops != d->ops)
        return NULL;
    kvr_route_state *s = prev->state;
    int same = memcmp(&s->cfg, d->cfg, sizeof(*d->cfg)) == 0;
    if (!same && (!s->ops->retune || s->ops->retune(s->policy, d->cfg) < 0))
        return NULL;
    s->cfg = *d->cfg;
    s->refs++;
    return s;
}

static void route_free(kvr_route *r)
{
    for (size_t i = 0; i < r->ntargets; i++) {
        kvr_worker_unref(r->targets[i].worker);
        free(r->targets[i].model);
    }
    for (size_t i = 0; i < r->naliases; i++)
        free(r->aliases[i]);
    free(r->aliases);
    free(r->targets);
    free(r->scratch);
    free(r->scratch_weights);
    free(r->rows);
    free(r->name);
    state_unref(r->state);
    if (r->pd)
        kvr_route_unref(r->pd->decode);
    free(r->pd);
    free(r);
}

const char *kvr_pd_mode_name(kvr_pd_mode m)
{
    return m == KVR_PD_SGLANG ? "sglang" : "vllm";
}

/* A route disaggregates when its definition names a decode policy and its targets hold both
 * prefill-role workers and others. */
static int disaggregated(const kvr_route_def *d)
{
    int prefill = 0, other = 0;
    for (size_t i = 0; i < d->ntargets; i++) {
        if (d->targets[i].worker->role == KVR_ROLE_PREFILL)
            prefill = 1;
        else
            other = 1;
    }
    return d->decode_ops && prefill && other;
}

/* The decode side of `d`: a route of the same name over its decode and both targets. */
static kvr_route_pd *pd_new(const kvr_route_def *d, kvr_route *prev)
{
    kvr_route_pd *pd = calloc(1, sizeof(*pd));
    kvr_route_target *tg = calloc(d->ntargets, sizeof(*tg));
    if (!pd || !tg) {
        free(pd);
        free(tg);
        return NULL;
    }
    size_t n = 0;
    for (size_t i = 0; i < d->ntargets; i++)
        if (d->targets[i].worker->role != KVR_ROLE_PREFILL)
            tg[n++] = d->targets[i];
    kvr_route_def dd = *d;
    dd.ops = d->decode_ops;
    dd.decode_ops = NULL;
    dd.targets = tg;
    dd.ntargets = n;
    dd.naliases = 0;
    pd->mode = d->pd_mode;
    pd->decode = kvr_route_new(&dd, prev && prev->pd ? prev->pd->decode : NULL);
    free(tg);
    if (!pd->decode) {
        free(pd);
        return NULL;
    }
    return pd;
}

kvr_route *kvr_route_new(const kvr_route_def *d, kvr_route *prev)
{
    kvr_route *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    r->refs = 1;
    r->ops = d->ops;
    r->cfg = *d->cfg;
    size_t nt = d->ntargets ? d->ntargets : 1;
    r->name = strdup(d->name);
    r->aliases = calloc(d->naliases ? d->naliases : 1, sizeof(*r->aliases));
    r->targets = calloc(nt, sizeof(*r->targets));
    r->scratch = calloc(nt, sizeof(*r->scratch));
    r->scratch_weights = calloc(nt, sizeof(*r->scratch_weights));
    r->rows = calloc(nt, sizeof(*r->rows));
    int ok = r->name && r->aliases && r->targets && r->scratch && r->scratch_weights && r->rows;
    for (size_t i = 0; ok && i < d->naliases; i++)
        ok = (r->aliases[r->naliases++] = strdup(d->aliases[i])) != NULL;
    for (size_t i = 0; ok && i < d->ntargets; i++) {
        const kvr_route_target *t = &d->targets[i];
        kvr_route_target *o = &r->targets[r->ntargets];
        o->model = strdup(t->model ? t->model : d->name);
        if (!(ok = o->model != NULL))
            break;
        o->worker = t->worker;
        o->weight = t->weight > 0 ? t->weight : 1;
        kvr_worker_ref(o->worker);
        r->ntargets++;
    }
    if (ok && disaggregated(d))
        ok = (r->pd = pd_new(d, prev)) != NULL;
    if (ok) {
        r->state = reuse_state(d, prev);
        if (r->state) {
            /* Workers that are no longer targets: what was learned about them here goes. */
            for (size_t i = 0; i < prev->ntargets; i++)
                if (!kvr_route_target_of(r, prev->targets[i].worker))
                    kvr_route_forget_worker(r, prev->targets[i].worker);
        } else {
            r->state = state_new(d);
        }
        ok = r->state != NULL;
    }
    if (!ok) {
        route_free(r);
        return NULL;
    }
    return r;
}

void kvr_route_ref(kvr_route *r)
{
    r->refs++;
}

void kvr_route_unref(kvr_route *r)
{
    if (r && --r->refs == 0)
        route_free(r);
}

size_t kvr_route_eligible(kvr_route *r, kvr_worker **out)
{
    size_t k = 0;
    for (size_t i = 0; i < r->ntargets; i++)
        if (kvr_worker_eligible(r->targets[i].worker))
            out[k++] = r->targets[i].worker;
    return k;
}

size_t kvr_route_on_trial(const kvr_route *r)
{
    size_t k = 0;
    for (size_t i = 0; i < r->ntargets; i++)
        k += kvr_worker_on_trial(r->targets[i].worker) != 0;
    return k;
}

const kvr_route_target *kvr_route_target_of(const kvr_route *r, const kvr_worker *w)
{
    for (size_t i = 0; i < r->ntargets; i++)
        if (r->targets[i].worker == w)
            return &r->targets[i];
    return NULL;
}

static int excluded(const kvr_worker *w, const size_t *ex, size_t nex)
{
    for (size_t i = 0; i < nex; i++)
        if (ex[i] == w->id)
            return 1;
    return 0;
}

/* The eligible, non-excluded workers into r->scratch and their weights into
 * r->scratch_weights; returns how many. */
static size_t candidates(kvr_route *r, const size_t *ex, size_t nex)
{
    size_t k = 0;
    for (size_t i = 0; i < r->ntargets; i++) {
        kvr_worker *w = r->targets[i].worker;
        if (kvr_worker_eligible(w) && !excluded(w, ex, nex)) {
            r->scratch_weights[k] = r->targets[i].weight;
            r->scratch[k++] = w;
        }
    }
    return k;
}

/* The policy's view of the keys: the request's, plus the candidates' weights. */
static kvr_route_keys with_weights(const kvr_route *r, const kvr_route_keys *k)
{
    kvr_route_keys kw = k ? *k : (kvr_route_keys){0};
    kw.weights = r->scratch_weights;
    return kw;
}

/* A Responses API continuation goes where its stored response lives (exact identity). */
static int pinned(kvr_route *r, size_t n, const char *pin, size_t pin_len, kvr_pick *out)
{
    size_t wid;
    if (!pin || !pin_len ||
        kvr_session_map_get(r->state->pins, pin, pin_len, kvr_now_ms(), &wid) != 1)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (r->scratch[i]->id == wid) {
            out->worker = r->scratch[i];
            out->decision = "session_id_match";
            out->match = -1;
            return 1;
        }
    return 0;
}

int kvr_route_pick(kvr_route *r, const size_t *exclude, size_t nex, const kvr_route_keys *k,
                   const char *pin, size_t pin_len, kvr_pick *out,
                   const kvr_route_target **target)
{
    size_t n = candidates(r, exclude, nex);
    if (n == 0)
        return -1;
    *out = (kvr_pick){.match = -1, .chosen_match = -1, .predicted_tokens = -1};
    kvr_route_keys kw = with_weights(r, k);
    if (!pinned(r, n, pin, pin_len, out) &&
        r->ops->pick(r->state->policy, r->scratch, n, &kw, out) < 0)
        return -1;
    *target = kvr_route_target_of(r, out->worker);
    return *target ? 0 : -1;
}

int kvr_route_explain(kvr_route *r, const size_t *exclude, size_t nex, const kvr_route_keys *k,
                      const char *pin, size_t pin_len, kvr_pick *out,
                      const kvr_explain_row **rows, size_t *nrows)
{
    size_t n = candidates(r, exclude, nex);
    *rows = r->rows;
    *nrows = n;
    if (n == 0)
        return -1;
    *out = (kvr_pick){.match = -1, .chosen_match = -1, .predicted_tokens = -1};
    int rc;
    kvr_route_keys kw = with_weights(r, k);
    if (r->ops->explain) {
        rc = r->ops->explain(r->state->policy, r->scratch, n, &kw, r->rows, out);
    } else {
        rc = r->ops->pick(r->state->policy, r->scratch, n, &kw, out);
        for (size_t i = 0; i < n; i++)
            r->rows[i] = (kvr_explain_row){.worker = r->scratch[i], .match = -1,
                                           .inflight = kvr_worker_load(r->scratch[i])};
    }
    for (size_t i = 0; rc == 0 && i < n; i++) {
        const kvr_route_target *t = kvr_route_target_of(r, r->rows[i].worker);
        r->rows[i].weight = t ? t->weight : 1;
    }
    kvr_pick pin_pick = {.match = -1, .chosen_match = -1, .predicted_tokens = -1};
    if (rc == 0 && pinned(r, n, pin, pin_len, &pin_pick))
        *out = pin_pick;
    return rc;
}

size_t kvr_route_role_exclude(const kvr_route *r, int prefill, size_t *ex, size_t n, size_t cap)
{
    for (size_t i = 0; r->pd && i < r->ntargets && n < cap; i++)
        if ((r->targets[i].worker->role == KVR_ROLE_PREFILL) != (prefill != 0))
            ex[n++] = r->targets[i].worker->id;
    return n;
}

void kvr_route_teach(kvr_route *r, kvr_worker *w, const kvr_route_keys *k)
{
    if (!w->removed && r->ops->teach)
        r->ops->teach(r->state->policy, w, k);
}

void kvr_route_learn(kvr_route *r, kvr_worker *w, const kvr_learned *l)
{
    if (!w->removed && r->ops->learn && kvr_route_target_of(r, w))
        r->ops->learn(r->state->policy, w, l);
}

int kvr_route_correct(kvr_route *r, kvr_worker *w, const kvr_route_keys *k, const kvr_pick *pick,
                      int64_t cached, int64_t prompt)
{
    if (w->removed || !r->ops->correct ||
        !r->ops->correct(r->state->policy, w, k, pick, cached, prompt))
        return 0;
    kvr_route_teach(r, w, k);
    return 1;
}

void kvr_route_sent(kvr_route *r, kvr_worker *w, const kvr_route_keys *k)
{
    if (r->ops->sent)
        r->ops->sent(r->state->policy, w, k);
}

double kvr_route_prefill_start(kvr_route *r, kvr_worker *w, double tokens)
{
    return r->ops->prefill_start ? r->ops->prefill_start(r->state->policy, w, tokens) : 0;
}

void kvr_route_prefill_end(kvr_route *r, kvr_worker *w, double tokens, double ahead, double ms)
{
    if (r->ops->prefill_end)
        r->ops->prefill_end(r->state->policy, w, tokens, ahead, ms);
}

void kvr_route_pin_response(kvr_route *r, const char *id, size_t len, kvr_worker *w)
{
    if (!w->removed)
        kvr_session_map_bind(r->state->pins, id, len, w->id, kvr_now_ms());
}

void kvr_route_unpin_response(kvr_route *r, const char *id, size_t len)
{
    kvr_session_map_remove(r->state->pins, id, len);
}

int kvr_route_find_response(kvr_route *r, const char *id, size_t len, size_t *worker_id)
{
    return kvr_session_map_get(r->state->pins, id, len, kvr_now_ms(), worker_id) == 1;
}

void kvr_route_forget_worker(kvr_route *r, kvr_worker *w)
{
    if (r->ops->forget_worker)
        r->ops->forget_worker(r->state->policy, w);
    kvr_session_map_forget_worker(r->state->pins, w->id);
    if (r->pd)
        kvr_route_forget_worker(r->pd->decode, w);
}

void kvr_route_sweep(kvr_route *r, size_t max)
{
    if (r->ops->sweep)
        r->ops->sweep(r->state->policy, max);
    kvr_session_map_sweep(r->state->pins, kvr_now_ms(), max);
    if (r->pd)
        kvr_route_sweep(r->pd->decode, max);
}

void kvr_route_stats(kvr_route *r, kvr_policy_stats *out)
{
    memset(out, 0, sizeof(*out));
    if (r->ops->stats)
        r->ops->stats(r->state->policy, out);
}

void kvr_route_worker_stats(kvr_route *r, const kvr_worker *w, kvr_policy_worker_stats *out)
{
    memset(out, 0, sizeof(*out));
    if (r->ops->worker_stats)
        r->ops->worker_stats(r->state->policy, w->id, out);
}

static size_t budget_slot(kvr_route_state *s, uint64_t now_ms)
{
    uint64_t sec = now_ms / 1000;
    size_t i = (size_t)(sec % BUDGET_SLOTS);
    if (s->slot_sec[i] != sec) {
        s->slot_sec[i] = sec;
        s->slot_requests[i] = s->slot_retries[i] = 0;
    }
    return i;
}

void kvr_route_count_request(kvr_route *r, uint64_t now_ms)
{
    r->state->slot_requests[budget_slot(r->state, now_ms)]++;
}

int kvr_route_retry_allowed(kvr_route *r, double share, uint64_t now_ms)
{
    kvr_route_state *s = r->state;
    size_t cur = budget_slot(s, now_ms);
    uint64_t sec = now_ms / 1000;
    double requests = 0, retries = 0;
    for (size_t i = 0; i < BUDGET_SLOTS; i++)
        if (s->slot_sec[i] + BUDGET_SLOTS > sec) {
            requests += s->slot_requests[i];
            retries += s->slot_retries[i];
        }
    if (retries >= share * requests + BUDGET_FREE_PER_S * BUDGET_SLOTS)
        return 0;
    s->slot_retries[cur]++;
    return 1;
}

kvr_route_table *kvr_route_table_new(void)
{
    kvr_route_table *t = calloc(1, sizeof(*t));
    if (!t)
        abort();
    return t;
}

void kvr_route_table_add(kvr_route_table *t, kvr_route *r)
{
    kvr_route **a = realloc(t->routes, (t->n + 1) * sizeof(*a));
    if (!a)
        abort();
    t->routes = a;
    t->routes[t->n++] = r;
}

kvr_route *kvr_route_table_find(const kvr_route_table *t, const char *model)
{
    if (!t || !model)
        return NULL;
    for (size_t i = 0; i < t->n; i++) {
        kvr_route *r = t->routes[i];
        if (strcmp(r->name, model) == 0)
            return r;
        for (size_t a = 0; a < r->naliases; a++)
            if (strcmp(r->aliases[a], model) == 0)
                return r;
    }
    return NULL;
}

void kvr_route_table_free(kvr_route_table *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->n; i++)
        kvr_route_unref(t->routes[i]);
    free(t->routes);
    free(t);
}
