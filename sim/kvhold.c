/* Held KV blocks awaiting a decode's fetch. */
#include "kvhold.h"

#include <stdlib.h>
#include <string.h>

struct kvr_sim_hold {
    kvr_sim_hold_entry *e; /* oldest first */
    size_t n, cap, max;
    uint64_t blocks, expired, evicted;
};

kvr_sim_hold *kvr_sim_hold_new(size_t max_entries)
{
    kvr_sim_hold *h = calloc(1, sizeof(*h));
    if (h)
        h->max = max_entries ? max_entries : 1;
    return h;
}

/* Releases entry `i` and closes the gap. */
static void drop(kvr_sim_hold *h, size_t i)
{
    kvr_sim_hold_entry *x = &h->e[i];
    kvr_sim_kv_release(x->kv, x->blocks, x->n);
    h->blocks -= x->n;
    free(x->key);
    free(x->blocks);
    free(x->tokens);
    memmove(&h->e[i], &h->e[i + 1], (h->n - i - 1) * sizeof(*h->e));
    h->n--;
}

void kvr_sim_hold_free(kvr_sim_hold *h)
{
    if (!h)
        return;
    while (h->n)
        drop(h, h->n - 1);
    free(h->e);
    free(h);
}

static long find(const kvr_sim_hold *h, const char *key)
{
    for (size_t i = 0; i < h->n; i++)
        if (strcmp(h->e[i].key, key) == 0)
            return (long)i;
    return -1;
}

int kvr_sim_hold_put(kvr_sim_hold *h, const char *key, kvr_sim_kv *kv, int rank,
                     const uint32_t *blocks, size_t n, const uint32_t *tokens,
                     uint64_t expires_ms)
{
    size_t ntok = n * kvr_sim_kv_block_size(kv);
    kvr_sim_hold_entry x = {.key = strdup(key), .kv = kv, .rank = rank, .n = n,
                            .blocks = malloc((n ? n : 1) * sizeof(uint32_t)),
                            .tokens = malloc((ntok ? ntok : 1) * sizeof(uint32_t)),
                            .expires_ms = expires_ms};
    long old = find(h, key);
    int grows = old < 0 && h->n < h->max;
    if (grows && h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 16;
        kvr_sim_hold_entry *e = realloc(h->e, cap * sizeof(*e));
        if (e) {
            h->e = e;
            h->cap = cap;
        }
    }
    if (!x.key || !x.blocks || !x.tokens || (grows && h->n == h->cap)) {
        free(x.key);
        free(x.blocks);
        free(x.tokens);
        return -1;
    }
    if (old >= 0) {
        drop(h, (size_t)old);
    } else if (h->n == h->max) {
        drop(h, 0);
        h->evicted++;
    }
    if (n) {
        memcpy(x.blocks, blocks, n * sizeof(uint32_t));
        memcpy(x.tokens, tokens, ntok * sizeof(uint32_t));
    }
    kvr_sim_kv_touch(kv, blocks, n);
    h->e[h->n++] = x;
    h->blocks += n;
    return 0;
}

const kvr_sim_hold_entry *kvr_sim_hold_get(const kvr_sim_hold *h, const char *key)
{
    long i = find(h, key);
    return i < 0 ? NULL : &h->e[i];
}

int kvr_sim_hold_release(kvr_sim_hold *h, const char *key)
{
    long i = find(h, key);
    if (i < 0)
        return -1;
    drop(h, (size_t)i);
    return 0;
}

size_t kvr_sim_hold_expire(kvr_sim_hold *h, uint64_t now_ms)
{
    size_t n = 0;
    for (size_t i = 0; i < h->n;) {
        if (h->e[i].expires_ms <= now_ms) {
            drop(h, i);
            n++;
        } else {
            i++;
        }
    }
    h->expired += n;
    return n;
}

uint64_t kvr_sim_hold_next_expiry(const kvr_sim_hold *h)
{
    uint64_t t = UINT64_MAX;
    for (size_t i = 0; i < h->n; i++)
        if (h->e[i].expires_ms < t)
            t = h->e[i].expires_ms;
    return t;
}

size_t kvr_sim_hold_count(const kvr_sim_hold *h)
{
    return h->n;
}

uint64_t kvr_sim_hold_blocks(const kvr_sim_hold *h)
{
    return h->blocks;
}

uint64_t kvr_sim_hold_expired(const kvr_sim_hold *h)
{
    return h->expired;
}

uint64_t kvr_sim_hold_evicted(const kvr_sim_hold *h)
{
    return h->evicted;
}
