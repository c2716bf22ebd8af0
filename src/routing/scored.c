/* The embedded precise instance of pipeline and cost (see scored.h). */
#include "routing/scored.h"

#include <stdlib.h>
#include <string.h>

#include "events/kvevents.h"
#include "routing/policies.h"

/* precise rather than cache_aware: without KV events it scores exactly as cache_aware does, and
 * with them it reads the KV block index for the workers that are exact. */
static const kvr_policy_ops *const base_ops = &kvr_policy_precise;

int kvr_scored_init(kvr_scored *b, const kvr_policy_cfg *cfg, const char *model)
{
    memset(b, 0, sizeof(*b));
    if (cfg)
        b->cfg = *cfg;
    else
        kvr_policy_cfg_default(&b->cfg);
    b->ca = base_ops->create(&b->cfg, model);
    return b->ca ? 0 : -1;
}

void kvr_scored_fini(kvr_scored *b)
{
    if (b->ca)
        base_ops->destroy(b->ca);
    free(b->sc);
    b->ca = NULL;
    b->sc = NULL;
}

int kvr_scored_score(kvr_scored *b, kvr_worker *const *el, size_t n, const kvr_route_keys *k,
                     int *session_idx)
{
    if (n > b->cap) {
        kvr_cache_aware_score *p = realloc(b->sc, n * sizeof(*p));
        if (!p)
            return -1;
        b->sc = p;
        b->cap = n;
    }
    return kvr_cache_aware_scores(b->ca, el, n, k, b->sc, session_idx);
}

void kvr_scored_chose(const kvr_scored *b, kvr_worker *const *el, size_t n, size_t i,
                      const kvr_route_keys *k, kvr_pick *out)
{
    int any = k && k->text_len;
    out->match = 0;
    for (size_t j = 0; j < n; j++) {
        any |= b->sc[j].exact;
        if (b->sc[j].ratio > out->match)
            out->match = b->sc[j].ratio;
    }
    if (!any)
        out->match = -1;
    const kvr_cache_aware_score *s = &b->sc[i];
    out->worker = el[i];
    out->index = s->exact ? "exact" : "approximate";
    out->chosen_match = s->ratio;
    out->block_size = s->exact ? s->block_size : 0;
    out->predicted_tokens = s->exact ? (int64_t)(s->kv_blocks * s->block_size) : -1;
}

double kvr_scored_prompt_tokens(const kvr_route_keys *k)
{
    if (k && k->tokens && k->ntokens)
        return (double)k->ntokens;
    /* ~4 bytes per token, as the rate limiter estimates. */
    size_t bytes = k && k->text ? k->text_len : 0;
    return bytes >= 4 ? (double)((bytes + 3) / 4) : 1;
}

double kvr_scored_matched_tokens(const kvr_scored *b, size_t i, const kvr_route_keys *k)
{
    const kvr_cache_aware_score *s = &b->sc[i];
    if (s->exact)
        return (double)(s->kv_blocks * s->block_size);
    return s->ratio * kvr_scored_prompt_tokens(k);
}

void kvr_scored_row(const kvr_scored *b, kvr_worker *const *el, size_t i, int session_idx,
                    const kvr_route_keys *k, kvr_explain_row *row)
{
    const kvr_cache_aware_score *s = &b->sc[i];
    struct kvr_kv_events *kv = b->cfg.kv;
    int events = kv && kvr_kv_events_configured(kv, el[i]->id);
    *row = (kvr_explain_row){
        .worker = el[i],
        .matched_bytes = s->matched_bytes,
        .match = (k && k->text_len) || s->exact ? s->ratio : -1,
        .inflight = kvr_worker_load(el[i]),
        .session_owner = (int)i == session_idx,
        .kv_blocks = s->kv_blocks,
        .trust = events ? kvr_kv_trust_name(kvr_kv_events_trust(kv, el[i]->id)) : NULL,
        .index = s->exact ? "exact" : "approximate",
    };
}

void kvr_scored_teach(void *self, kvr_worker *w, const kvr_route_keys *k)
{
    base_ops->teach(((kvr_scored *)self)->ca, w, k);
}

void kvr_scored_learn(void *self, kvr_worker *w, const kvr_learned *l)
{
    base_ops->learn(((kvr_scored *)self)->ca, w, l);
}

void kvr_scored_forget(void *self, kvr_worker *w)
{
    base_ops->forget_worker(((kvr_scored *)self)->ca, w);
}

void kvr_scored_stats(void *self, kvr_policy_stats *out)
{
    base_ops->stats(((kvr_scored *)self)->ca, out);
}

void kvr_scored_worker_stats(void *self, size_t worker_id, kvr_policy_worker_stats *out)
{
    base_ops->worker_stats(((kvr_scored *)self)->ca, worker_id, out);
}

size_t kvr_scored_sweep(void *self, size_t max)
{
    return base_ops->sweep(((kvr_scored *)self)->ca, max);
}

void kvr_scored_sent(void *self, kvr_worker *w, const kvr_route_keys *k)
{
    base_ops->sent(((kvr_scored *)self)->ca, w, k);
}

int kvr_scored_retune(void *self, const kvr_policy_cfg *cfg)
{
    kvr_scored *b = self;
    if (base_ops->retune(b->ca, cfg) < 0)
        return -1;
    b->cfg = *cfg;
    return 0;
}
