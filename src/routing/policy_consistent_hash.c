/* consistent_hash policy: ring of KVR_HASHRING_VNODES points per worker keyed by its URL.
 * Workers join the ring the first time they are eligible and leave it on forget_worker; an
 * ineligible worker stays on the ring and is skipped, so its keys go to the next distinct worker
 * clockwise and come back when it returns. */
#include <stdlib.h>

#include "routing/hashring.h"
#include "routing/policies.h"
#include "util/rand.h"

typedef struct ch_state {
    kvr_hashring *ring;
    size_t block_bytes;
    const char **seen_url;     /* by worker id: the url pointer added, to skip re-adding */
    size_t nseen;
} ch_state;

static void ch_destroy(void *self)
{
    ch_state *s = self;
    if (!s)
        return;
    kvr_hashring_destroy(s->ring);
    free(s->seen_url);
    free(s);
}

static void *ch_create(const kvr_policy_cfg *cfg, const char *model)
{
    (void)model;
    ch_state *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->block_bytes = cfg && cfg->block_bytes ? cfg->block_bytes : 64;
    s->ring = kvr_hashring_create(KVR_HASHRING_VNODES);
    if (!s->ring) {
        ch_destroy(s);
        return NULL;
    }
    return s;
}

/* Puts `w` on the ring unless it is there with the same URL. */
static int ensure_member(ch_state *s, const kvr_worker *w)
{
    if (w->id < s->nseen && s->seen_url[w->id] == w->url)
        return 0;
    if (w->id >= s->nseen) {
        size_t n = s->nseen ? s->nseen : 16;
        while (n <= w->id)
            n *= 2;
        const char **p = realloc(s->seen_url, n * sizeof(*p));
        if (!p)
            return -1;
        for (size_t i = s->nseen; i < n; i++)
            p[i] = NULL;
        s->seen_url = p;
        s->nseen = n;
    }
    if (kvr_hashring_add(s->ring, w->id, w->url) < 0)
        return -1;
    s->seen_url[w->id] = w->url;
    return 0;
}

typedef struct el_ctx {
    kvr_worker *const *el;
    size_t n;
    kvr_worker *found;
} el_ctx;

static int is_eligible(void *ctx, size_t id)
{
    el_ctx *c = ctx;
    for (size_t i = 0; i < c->n; i++)
        if (c->el[i]->id == id) {
            c->found = c->el[i];
            return 1;
        }
    return 0;
}

static int ch_pick(void *self, kvr_worker *const *el, size_t n, const kvr_route_keys *k,
                   kvr_pick *out)
{
    ch_state *s = self;
    if (!n)
        return -1;
    out->decision = "consistent_hash";
    out->match = -1;
    uint64_t h;
    if (!kvr_hash_route_key(k ? k->session : NULL, k ? k->session_len : 0, k ? k->text : NULL,
                            k ? k->text_len : 0, s->block_bytes, &h)) {
        out->worker = el[kvr_rand_below(n)];
        return 0;
    }
    for (size_t i = 0; i < n; i++)
        if (ensure_member(s, el[i]) < 0) {
            /* Out of memory: still answer, from the workers we know. */
            break;
        }
    el_ctx c = {el, n, NULL};
    size_t id;
    if (kvr_hashring_lookup(s->ring, h, is_eligible, &c, &id) < 0 || !c.found)
        out->worker = el[kvr_rand_below(n)];
    else
        out->worker = c.found;
    return 0;
}

static void ch_forget(void *self, kvr_worker *w)
{
    ch_state *s = self;
    kvr_hashring_remove(s->ring, w->id);
    if (w->id < s->nseen)
        s->seen_url[w->id] = NULL;
}

const kvr_policy_ops kvr_policy_consistent_hash = {
    .name = "consistent_hash",
    .create = ch_create,
    .pick = ch_pick,
    .teach = NULL,
    .forget_worker = ch_forget,
    .destroy = ch_destroy,
    .uses_keys = 1,
};
